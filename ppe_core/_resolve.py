"""Which runtime serves a device: one resolution shared by ``ppe.to`` and the factories.

The runtime package defines what a runtime is; choosing one for a device needs the plugin
host (its registry and the ``ppe_default_device`` hook), so it lives here, in the plugin layer,
and ``ppe_core.runtime`` depends on nothing above it. ``ppe_core.runtime.to`` and
``ppe_core.to`` re-export :func:`to` at PPE's paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError
from ppe_core.runtime._runtime import BaseRuntime, DeviceLike, tag_module

if TYPE_CHECKING:
    from ppe_core._plugins import PluginHost

__all__ = ["resolve_device", "resolve_runtime", "resolve_runtime_class", "to"]

_M = TypeVar("_M", bound=torch.nn.Module)


def _host() -> PluginHost:
    # Imported on first use: ``import ppe_core`` re-exports ``to`` and must not load pluggy's
    # manager, entry-point metadata and the registries until something is resolved.
    from ppe_core._plugins import get_plugin_host

    return get_plugin_host()


def resolve_device(device: DeviceLike) -> DeviceLike:
    """``device`` itself, or for ``"auto"`` the ``ppe_default_device`` hook's answer.

    Raises:
        ConfigurationError: ``"auto"`` and no plugin names a default device.
    """
    if isinstance(device, str) and device == "auto":
        return _host().default_device()
    return device


def resolve_runtime_class(device: DeviceLike) -> type[BaseRuntime]:
    """The runtime class the active plugin host's registry has for ``device`` (or ``"auto"``).

    Raises:
        RuntimeNotFoundError: no runtime can serve the device type; the message lists what is
            registered, what failed to load and what to install.
    """
    return _host().runtimes.get_runtime_class_for_device_spec(resolve_device(device))


def resolve_runtime(
    device: DeviceLike,
    options: Mapping[str, Any] | None = None,
    runtime_class: type[BaseRuntime] | None = None,
) -> BaseRuntime:
    """A runtime instance for ``device``: ``runtime_class``, else the registered one.

    Args:
        device: ``"cpu"``, ``"cuda:1"``, ``torch.device(...)``, any registered device type, or
            ``"auto"`` (the ``ppe_default_device`` hook's answer).
        options: Runtime options, passed to the runtime's constructor (which validates them).
        runtime_class: Use this class instead of looking the device type up.

    Raises:
        ArgumentTypeError: ``runtime_class`` is not a runtime class (also a ``TypeError``).
        RuntimeNotFoundError: no runtime is available for the device type.
        ConfigurationError: ``"auto"`` without a default device, or options the runtime
            rejects.
    """
    if runtime_class is not None and not (
        isinstance(runtime_class, type) and issubclass(runtime_class, BaseRuntime)
    ):
        raise ArgumentTypeError(
            f"runtime_class must be a subclass of ppe_core.runtime.BaseRuntime, got "
            f"{runtime_class!r}; pass the class (not an instance), or omit it to use the runtime "
            "registered for the device"
        )
    device = resolve_device(device)
    if runtime_class is None:
        runtime_class = resolve_runtime_class(device)
    return runtime_class(device, options)


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
    runtime = resolve_runtime(device, options, runtime_class)
    if isinstance(module_or_tensor, torch.Tensor):
        return runtime.move_tensor(module_or_tensor)
    moved = runtime.move_module(module_or_tensor)
    tag_module(moved, runtime)
    return moved
