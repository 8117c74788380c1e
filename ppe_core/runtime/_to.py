"""``ppe.to`` and runtime resolution: the one place a device becomes a runtime instance.

:func:`runtime_for` takes the registry as an argument, so resolution depends on no global
and this package needs nothing above it: ``ppe.to`` passes the active registry
(``ppe.runtime.runtime_registry``), and the engine's factories the same one (through
``ppe_core.plugins.resolve_runtime``). A
module keeps the runtime it was moved with: asking again for its device without other options
returns that instance, so ``ppe.to`` then ``create_trainer`` make one runtime per model and
device, and options are given once. A ``runtime_class`` that is not a runtime class is
refused with the fix (PPE calls it and leaves the failure to Python).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError
from ppe_core.runtime._option_specs import RuntimeOptions
from ppe_core.runtime._registry import RuntimeRegistry, active_registry
from ppe_core.runtime._runtime import BaseRuntime, DeviceLike, iter_runtime_modules, tag_module

__all__ = ["runtime_for", "to"]

#: A module (of any subclass) or a tensor: ``to`` returns the type it was given.
_MT = TypeVar("_MT", bound=torch.nn.Module | torch.Tensor)


def runtime_for(
    registry: RuntimeRegistry,
    device: DeviceLike,
    options: Mapping[str, Any] | None = None,
    runtime_class: type[BaseRuntime] | None = None,
    modules: Iterable[torch.nn.Module] = (),
) -> BaseRuntime:
    """The runtime for ``device``: one that ``modules`` are tagged with, else a new one.

    A tagged runtime is reused when it serves the same device (as written), is of
    ``runtime_class`` (when given) and ``options`` are empty or equal to its own; otherwise a
    new instance of ``runtime_class`` (else the class ``registry`` has for the device) is
    constructed with ``options``.

    Args:
        registry: Where device types are looked up; it also answers ``"auto"``.
        device: ``"cpu"``, ``"cuda:1"``, ``torch.device(...)``, any registered device type, or
            ``"auto"``.
        options: Runtime options, validated by the runtime's constructor.
        runtime_class: Use this class instead of looking the device type up.
        modules: Modules whose runtime may serve (the models being moved or trained).

    Raises:
        ArgumentTypeError: ``runtime_class`` is not a runtime class (also a ``TypeError``).
        RuntimeNotFoundError: no runtime is available for the device type.
        ConfigurationError: ``"auto"`` without a default device, or options the runtime
            rejects.
    """
    check_runtime_class(runtime_class, BaseRuntime)
    device = registry.resolve_device(device)
    runtime = _tagged_runtime(device, options, runtime_class, modules)
    if runtime is not None:
        return runtime
    if runtime_class is None:
        runtime_class = registry.get_runtime_class_for_device_spec(device)
    return runtime_class(device, options)


def _tagged_runtime(
    device: DeviceLike,
    options: Mapping[str, Any] | None,
    runtime_class: type[BaseRuntime] | None,
    modules: Iterable[torch.nn.Module],
) -> BaseRuntime | None:
    """The runtime one of ``modules`` is tagged with that serves ``device`` (as written), is
    of ``runtime_class`` (when given) and has ``options`` (when given), else ``None``."""
    for module in modules:
        for _, _, runtime in iter_runtime_modules(module):
            if (
                str(runtime.device_spec) == str(device)
                and (runtime_class is None or type(runtime) is runtime_class)
                and (not options or _has_options(runtime, options))
            ):
                return runtime
    return None


def _has_options(runtime: BaseRuntime, options: Mapping[str, Any]) -> bool:
    """Whether ``runtime`` was made with ``options``: for a runtime that declares its options
    (``option_spec``), whether they validate to its resolved values, so ``{"autocast": True}``
    matches the runtime it made (which keeps the normalised form); else the dicts are equal."""
    spec = getattr(type(runtime), "option_spec", None)
    resolved = getattr(runtime, "resolved_options", None)
    if isinstance(spec, RuntimeOptions) and isinstance(resolved, dict):
        try:
            return spec.validate(options) == resolved
        except ConfigurationError:
            return False  # the runtime made for them raises, with the explanation
    return dict(options) == getattr(runtime, "options", None)


def to(
    module_or_tensor: _MT,
    device: DeviceLike,
    *,
    options: Mapping[str, Any] | None = None,
    runtime_class: type[BaseRuntime] | None = None,
    config: Mapping[str, Any] | None = None,
) -> _MT:
    """Move a module or tensor to ``device`` with the runtime registered for it.

    A module, and each of its submodules, is tagged with the runtime so the Handler can drive
    the device callbacks later; a later ``ppe.to`` on a submodule re-tags that branch. A
    module already tagged for ``device`` keeps its runtime unless other options are given.

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
    if isinstance(module_or_tensor, torch.Tensor):
        runtime = runtime_for(active_registry(), device, options, runtime_class)
        return cast(_MT, runtime.move_tensor(module_or_tensor))
    runtime = runtime_for(active_registry(), device, options, runtime_class, [module_or_tensor])
    moved = runtime.move_module(module_or_tensor)
    tag_module(moved, runtime)
    return cast(_MT, moved)


def check_runtime_class(runtime_class: object, base: type) -> None:
    """``runtime_class`` (of ``ppe.to`` / ``runtime_for``) must be ``None`` or a subclass of
    ``base``."""
    if runtime_class is not None and not (
        isinstance(runtime_class, type) and issubclass(runtime_class, base)
    ):
        raise ArgumentTypeError(
            f"runtime_class must be a subclass of ppe_core.runtime.BaseRuntime, got "
            f"{runtime_class!r}; pass the class (not an instance), or omit it to use the runtime "
            "registered for the device"
        )
