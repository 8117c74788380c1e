"""``ppe.to``: move a module or tensor through its device's runtime and tag it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, overload

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError
from ppe_core.runtime._runtime import BaseRuntime, DeviceLike, _tag

__all__ = ["to"]

_M = TypeVar("_M", bound=torch.nn.Module)


@overload
def to(
    module_or_tensor: _M,
    device: DeviceLike,
    *,
    options: Mapping[str, Any] | None = None,
    runtime_class: type[BaseRuntime] | None = None,
    config: Mapping[str, Any] | None = None,
) -> _M: ...


@overload
def to(
    module_or_tensor: torch.Tensor,
    device: DeviceLike,
    *,
    options: Mapping[str, Any] | None = None,
    runtime_class: type[BaseRuntime] | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor: ...


def to(
    module_or_tensor: torch.nn.Module | torch.Tensor,
    device: DeviceLike,
    *,
    options: Mapping[str, Any] | None = None,
    runtime_class: type[BaseRuntime] | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.nn.Module | torch.Tensor:
    """Move a module or tensor to ``device`` with the runtime registered for it.

    A module, and each of its submodules, is tagged with the runtime so the Handler can drive
    the device callbacks later; a later ``ppe.to`` on a submodule re-tags that branch.

    Args:
        module_or_tensor: What to move.
        device: ``"cpu"``, ``"cuda:1"``, ``torch.device(...)``, any registered device type, or
            ``"auto"`` (the ``ppe_default_device`` hook's answer, as in ``create_trainer``).
        options: Runtime options, passed to the runtime's constructor.
        runtime_class: Use this runtime instead of looking the device type up.
        config: PPE's older name for ``options`` (deprecated there); give one of the two.

    Returns:
        The moved module (the object ``move_module`` returned) or tensor.

    Raises:
        RuntimeNotFoundError: no runtime is available for the device type.
        ArgumentTypeError: ``module_or_tensor`` is neither a module nor a tensor, or
            ``runtime_class`` is not a runtime class (also a ``TypeError``).
        ConfigurationError: both ``options`` and ``config`` were given (a ``ValueError``).
    """
    if config is not None:
        if options is not None:
            raise ConfigurationError(
                "ppe.to got both options= and config=; config is the older name of options, "
                "pass only options=..."
            )
        options = config
    if not isinstance(module_or_tensor, (torch.nn.Module, torch.Tensor)):
        raise ArgumentTypeError(
            "ppe.to expects a torch.nn.Module or torch.Tensor, got "
            f"{type(module_or_tensor).__name__}; pass the model (ppe.to(model, 'cpu')). Batches "
            "need no ppe.to: the trainer moves them with the runtime's convert_batch"
        )
    if runtime_class is not None and not (
        isinstance(runtime_class, type) and issubclass(runtime_class, BaseRuntime)
    ):
        raise ArgumentTypeError(
            f"ppe.to runtime_class must be a subclass of ppe_core.runtime.BaseRuntime, got "
            f"{runtime_class!r}; pass the class (not an instance), or omit it to use the runtime "
            "registered for the device"
        )
    if device == "auto":
        from ppe_core._plugins import get_plugin_host

        device = get_plugin_host().default_device()
    if runtime_class is None:
        from ppe_core.runtime import runtime_registry

        runtime_class = runtime_registry.get_runtime_class_for_device_spec(device)
    runtime = runtime_class(device, options)
    if isinstance(module_or_tensor, torch.Tensor):
        return runtime.move_tensor(module_or_tensor)
    moved = runtime.move_module(module_or_tensor)
    _tag(moved, runtime)
    return moved
