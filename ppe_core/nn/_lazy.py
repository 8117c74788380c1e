"""PPE's lazy layers: ``LazyLinear``, ``LazyConv1d/2d/3d``, ``LazyBatchNorm1d/2d/3d``.

They take PPE's signatures (the input size first, ``None`` or a number) and PPE's state-dict
layout: an input-size-dependent parameter is created at the first forward, and until then it
is left out of ``state_dict()``, so a state saved before the first forward loads back into an
unused module and a trained state materializes one. The placeholder is PyTorch's own
``UninitializedParameter``: materializing it keeps the same parameter object, so an optimizer
built before the first forward still trains it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn.parameter import UninitializedParameter

from ppe_core.errors import ConfigurationError, LazyStateError

__all__ = [
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyLinear",
]


def _pending(module: torch.nn.Module, name: str) -> UninitializedParameter | None:
    """``module.<name>`` if it is still an unmaterialized placeholder, else ``None``."""
    value = getattr(module, name)
    return value if isinstance(value, UninitializedParameter) else None


class _LazyMixin(torch.nn.Module):
    """Registers the lazy parameters after the wrapped layer's constructor, keeps them out of
    the state dict while they are unmaterialized, and defers ``reset_parameters`` until every
    one of them has a shape (PyTorch's constructors call it before the input size is known).
    """

    _lazy_parameters: tuple[str, ...] = ()

    def __init__(self, size: int | None, *args: Any, **kwargs: Any) -> None:
        # As in PPE the layer is always built lazily: a given size is a placeholder that the
        # first input's size replaces.
        super().__init__(size or 0, *args, **kwargs)
        # Buffers sized by the input, left empty until the first forward (batch norm's
        # running statistics when the size is not given).
        self._lazy_buffers: tuple[str, ...] = ()
        placeholder: Any = UninitializedParameter  # typed without its factory keywords
        for name in self._lazy_parameters:
            self.register_parameter(
                name, placeholder(device=kwargs.get("device"), dtype=kwargs.get("dtype"))
            )
        self._lazy_ready = True

    def _materialized(self) -> bool:
        if not getattr(self, "_lazy_ready", False):
            return False
        return all(_pending(self, name) is None for name in self._lazy_parameters)

    def reset_parameters(self) -> None:
        """Initialize the parameters once their shapes are known; a no-op before that."""
        if self._materialized():
            super().reset_parameters()  # type: ignore[misc]

    def _save_to_state_dict(
        self, destination: dict[str, Any], prefix: str, keep_vars: bool
    ) -> None:
        # An unmaterialized parameter has no value to save (PyTorch refuses to detach it);
        # hidden for the call, it is skipped like a ``None`` parameter, PPE's layout.
        hidden = {
            name: self._parameters[name]
            for name in self._lazy_parameters
            if _pending(self, name) is not None
        }
        self._parameters.update(dict.fromkeys(hidden))
        try:
            super()._save_to_state_dict(destination, prefix, keep_vars)
        finally:
            self._parameters.update(hidden)

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        for name in self._lazy_buffers:
            key = prefix + name
            if key not in state_dict:
                continue
            current, incoming = getattr(self, name), state_dict[key]
            if current.shape != (0,) and incoming.shape == (0,):
                raise LazyStateError(
                    f"{key!r} in the state is empty (saved before the first forward) but this "
                    f"{type(self).__name__} has already run; load it into a new module instead"
                )
            if current.shape == (0,) and incoming.shape != (0,):
                current.resize_(incoming.shape)  # the copy below fills it
        still_lazy = []
        for name in self._lazy_parameters:
            key = prefix + name
            parameter = _pending(self, name)
            if key in state_dict:
                if parameter is not None:
                    parameter.materialize(state_dict[key].shape)
            elif parameter is not None:
                still_lazy.append(key)  # saved unused, loaded unused: nothing is missing
            else:
                raise LazyStateError(
                    f"the state has no {key!r} (it was saved before the first forward) but "
                    f"this {type(self).__name__} has already run; load it into a new module "
                    "instead"
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        for key in still_lazy:
            if key in missing_keys:
                missing_keys.remove(key)


class LazyLinear(_LazyMixin, torch.nn.Linear):
    """``torch.nn.Linear(in_features, out_features, ...)`` whose ``weight`` is shaped by the
    first input (``in_features`` becomes the input's last dimension)."""

    _lazy_parameters = ("weight",)

    def __init__(self, in_features: int | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(in_features, *args, **kwargs)
        if in_features is None:
            self.in_features = None  # type: ignore[assignment]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = _pending(self, "weight")
        if weight is not None:
            self.in_features = input.shape[-1]
            weight.materialize((self.out_features, self.in_features))
            self.reset_parameters()
        return super().forward(input)


class _LazyConvNd(_LazyMixin):
    """The first input's channel dimension (``input.shape[1]``) shapes the weight."""

    _lazy_parameters = ("weight",)

    def __init__(self, in_channels: int | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(in_channels, *args, **kwargs)
        if in_channels is None:
            self.in_channels: int | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = _pending(self, "weight")
        if weight is not None:
            layer: Any = self
            self.in_channels = input.shape[1]
            if layer.transposed:
                leading = (input.shape[1], layer.out_channels // layer.groups)
            else:
                leading = (layer.out_channels, input.shape[1] // layer.groups)
            weight.materialize((*leading, *layer.kernel_size))
            self.reset_parameters()
        return super().forward(input)  # type: ignore[no-any-return]


class LazyConv1d(_LazyConvNd, torch.nn.Conv1d):  # type: ignore[misc]
    """``torch.nn.Conv1d`` whose ``in_channels`` may be ``None`` (taken from the first input)."""


class LazyConv2d(_LazyConvNd, torch.nn.Conv2d):  # type: ignore[misc]
    """``torch.nn.Conv2d`` whose ``in_channels`` may be ``None`` (taken from the first input)."""


class LazyConv3d(_LazyConvNd, torch.nn.Conv3d):  # type: ignore[misc]
    """``torch.nn.Conv3d`` whose ``in_channels`` may be ``None`` (taken from the first input)."""


class _LazyBatchNorm(_LazyMixin):
    """Batch norm whose ``num_features`` is the first input's channel dimension.

    PPE reads ``input.shape[-1]``, which is the channel dimension only for 2-D input; ppe-core
    reads ``input.shape[1]``, the same number wherever PPE's layer runs.
    """

    _lazy_parameters = ("weight", "bias")

    def __init__(self, num_features: int | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(num_features, *args, **kwargs)
        layer: Any = self
        if not layer.affine:
            raise ConfigurationError(
                f"{type(self).__name__} needs affine=True (its lazy parameters are the affine "
                f"weight and bias); use torch.nn.{type(self).__name__[4:]} for affine=False"
            )
        if num_features is None:
            self.num_features: int | None = None
            if layer.track_running_stats:
                self._lazy_buffers = ("running_mean", "running_var")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = _pending(self, "weight"), _pending(self, "bias")
        if weight is not None and bias is not None:
            size = input.shape[1]
            self.num_features = size
            weight.materialize((size,))
            bias.materialize((size,))
            for name, fill in (("running_mean", 0.0), ("running_var", 1.0)):
                if name in self._lazy_buffers:
                    current = getattr(self, name)
                    setattr(
                        self,
                        name,
                        torch.full((size,), fill, dtype=current.dtype, device=current.device),
                    )
            self.reset_parameters()
        return super().forward(input)  # type: ignore[no-any-return]


class LazyBatchNorm1d(_LazyBatchNorm, torch.nn.BatchNorm1d):  # type: ignore[misc]
    """``torch.nn.BatchNorm1d`` whose ``num_features`` may be ``None``."""


class LazyBatchNorm2d(_LazyBatchNorm, torch.nn.BatchNorm2d):  # type: ignore[misc]
    """``torch.nn.BatchNorm2d`` whose ``num_features`` may be ``None``."""


class LazyBatchNorm3d(_LazyBatchNorm, torch.nn.BatchNorm3d):  # type: ignore[misc]
    """``torch.nn.BatchNorm3d`` whose ``num_features`` may be ``None``."""
