"""Gradient clipping, the Logic's ``grad_clip_norm`` / ``grad_clip_value`` options (PPE has none).

Each optimizer's gradients are clipped right before it steps: once per optimizer step (at the
end of an accumulation window, after DDP's and FSDP2's reduction), after its grad scaler has
unscaled them (``scaler.unscale_(optimizer)``, which the scaler's ``step`` then does not
repeat), over the parameters of that optimizer only. FSDP2's gradients are DTensors: the norm
is the global one, over every rank's shards. The norm before clipping is reported as a tensor
(``train/grad_norm``; nothing waits for the device). Nothing here runs without the options.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.reporting import report

__all__ = ["ClipOptions", "GradClipper", "build_clipper", "clip_norm", "pop_clip_options"]

#: ``float`` or ``{optimizer name: float}``, as the options take them.
Limit = float | dict[str, float]

_EXAMPLE = (
    "e.g. options={'grad_clip_norm': 1.0}, or per optimizer "
    "options={'grad_clip_norm': {'gen': 1.0, 'dis': 5.0}}"
)


@dataclasses.dataclass(frozen=True)
class ClipOptions:
    """The clipping options as given (``None``: not given)."""

    norm: Limit | None = None
    value: Limit | None = None
    norm_type: float | None = None  # None: 2.0


def _limit(option: str, value: Any, name: str | None = None) -> float:
    """``value`` as a limit of ``option`` (for the optimizer ``name`` when it is a dict's)."""
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        where = f"option {option!r}" + ("" if name is None else f", entry {name!r},")
        raise ConfigurationError(
            f"{where} must be a positive finite number (or a dict of them by optimizer "
            f"name), got {value!r}; {_EXAMPLE.replace('grad_clip_norm', option)}"
        )
    return float(value)


def _parse_limit(option: str, value: Any) -> Limit:
    if not isinstance(value, Mapping):
        return _limit(option, value)
    if not value or not all(isinstance(name, str) for name in value):
        raise ConfigurationError(
            f"option {option!r} as a dict maps the trainer's optimizer names (str) to limits, "
            f"got {value!r}; {_EXAMPLE.replace('grad_clip_norm', option)}"
        )
    return {name: _limit(option, v, name) for name, v in value.items()}


def pop_clip_options(options: dict[str, Any], current: ClipOptions) -> ClipOptions:
    """Pops ``grad_clip_norm``, ``grad_clip_value`` and ``grad_clip_norm_type`` (one not given
    keeps its ``current`` value), checking each.

    Raises:
        ConfigurationError: a limit that is not a positive finite number (or a dict of them by
            optimizer name), or a norm type that is not a positive number (``math.inf`` allowed).
    """
    norm, value = options.pop("grad_clip_norm", None), options.pop("grad_clip_value", None)
    norm_type = options.pop("grad_clip_norm_type", None)
    if norm_type is not None and (
        not isinstance(norm_type, (int, float))
        or isinstance(norm_type, bool)
        or math.isnan(norm_type)
        or norm_type <= 0
    ):
        raise ConfigurationError(
            f"option 'grad_clip_norm_type' must be a positive number (the p of the p-norm; "
            f"math.inf for the largest absolute value), got {norm_type!r}; e.g. "
            "options={'grad_clip_norm': 1.0, 'grad_clip_norm_type': 2.0}"
        )
    return ClipOptions(
        current.norm if norm is None else _parse_limit("grad_clip_norm", norm),
        current.value if value is None else _parse_limit("grad_clip_value", value),
        current.norm_type if norm_type is None else float(norm_type),
    )


def build_clipper(
    spec: ClipOptions, optimizer_names: Sequence[str] | None, model_name: str
) -> GradClipper | None:
    """The clipper the options ask for (``None``: no clipping), checked against the
    optimizers the Logic steps: those of its ``optimizers`` option (``optimizer_names``), else
    the one keyed ``model_name``.

    Raises:
        ConfigurationError: a dict naming an optimizer the Logic does not step, both a norm and
            a value for one optimizer, or a norm type without a norm.
    """
    if spec.norm is None and spec.value is None:
        if spec.norm_type is not None:
            raise ConfigurationError(
                "option 'grad_clip_norm_type' does nothing without 'grad_clip_norm'; add it, "
                "e.g. options={'grad_clip_norm': 1.0, 'grad_clip_norm_type': "
                f"{spec.norm_type!r}}}, or remove the norm type"
            )
        return None
    names = [model_name] if optimizer_names is None else list(optimizer_names)
    for option, limit in (("grad_clip_norm", spec.norm), ("grad_clip_value", spec.value)):
        unknown = sorted(set(limit) - set(names)) if isinstance(limit, dict) else []
        if unknown:
            how = (
                "its option 'optimizers'"
                if optimizer_names is not None
                else f"one optimizer, keyed like its model ({model_name!r}); with several, "
                "give the option 'optimizers' in the same options"
            )
            raise ConfigurationError(
                f"option {option!r} names the optimizer(s) {unknown}, but the Logic steps "
                f"{names} ({how}); key the limits by those names"
            )
    norms, values = _by_name(spec.norm, names), _by_name(spec.value, names)
    both = [name for name in names if name in norms and name in values]
    if both:
        raise ConfigurationError(
            f"options 'grad_clip_norm' and 'grad_clip_value' both clip the optimizer(s) {both}; "
            "give one per optimizer (a norm rescales all gradients together, a value clamps "
            "each element), e.g. options={'grad_clip_norm': 1.0}"
        )
    several = optimizer_names is not None and len(names) > 1
    return GradClipper(norms, values, 2.0 if spec.norm_type is None else spec.norm_type, several)


def _by_name(limit: Limit | None, names: list[str]) -> dict[str, float]:
    if limit is None:
        return {}
    return dict(limit) if isinstance(limit, dict) else dict.fromkeys(names, limit)


class GradClipper:
    """Clips an optimizer's gradients before it steps, as the options ask.

    Args:
        norms: ``clip_grad_norm_``'s ``max_norm`` by optimizer name.
        values: ``clip_grad_value_``'s ``clip_value`` by optimizer name.
        norm_type: The p of the norm.
        several: Whether the Logic steps several optimizers: the norm is then reported as
            ``train/<optimizer name>/grad_norm``, else as ``train/grad_norm``.
    """

    def __init__(
        self, norms: dict[str, float], values: dict[str, float], norm_type: float, several: bool
    ) -> None:
        self.norms, self.values, self.norm_type = norms, values, norm_type
        self.report_keys = {
            name: f"train/{name}/grad_norm" if several else "train/grad_norm" for name in norms
        }

    def clip(
        self, name: str, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None
    ) -> None:
        """Clips the gradients of ``optimizer`` (called ``name``) before it steps, unscaled
        first by ``scaler`` when there is one (once: its ``step`` then does not unscale)."""
        max_norm, clip_value = self.norms.get(name), self.values.get(name)
        if max_norm is None and clip_value is None:
            return
        if scaler is not None:
            scaler.unscale_(optimizer)
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        if max_norm is not None:
            report({self.report_keys[name]: clip_norm(parameters, max_norm, self.norm_type)})
        else:
            torch.nn.utils.clip_grad_value_(parameters, clip_value)  # type: ignore[arg-type]


_get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6


def clip_norm(parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
    """``clip_grad_norm_(parameters, max_norm, norm_type)``; returns the total norm before
    clipping as a plain tensor, the global one when the gradients are DTensors (FSDP2)."""
    if _get_total_norm is None:  # torch < 2.6: clip_grad_norm_ handles DTensors itself
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)
        return norm if type(norm) is torch.Tensor else norm.full_tensor()  # type: ignore[attr-defined]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = _get_total_norm(grads, norm_type)
    if type(norm) is not torch.Tensor:
        # A DTensor (FSDP2): as a plain tensor, the norm of the whole gradient over every
        # rank's shards (a partial one all-reduced), which each rank clips its shards with.
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm
