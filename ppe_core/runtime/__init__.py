"""Runtimes: how a device executes models. Device code lives only in runtimes.

This package is the runtime contract and imports nothing above it. ``to`` resolves with the
active registry (``runtime_registry``), which the plugin host provides through
:func:`~ppe_core.runtime._registry.set_registry_source` (set by ``ppe_core``'s ``__init__``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core.errors import RuntimeOptionError, RuntimeOptionTypeError, RuntimeReplacedWarning
from ppe_core.runtime._device import DeviceRuntime
from ppe_core.runtime._device_types import autocast_available, autocast_device_type_of
from ppe_core.runtime._option_specs import OptionSpec, RuntimeOptions, positive_int
from ppe_core.runtime._registry import (
    RuntimeRegistry,
    _RuntimeRegistry,  # noqa: F401  (PPE's name, reachable as ppe.runtime._RuntimeRegistry)
    active_registry,
    device_type_of,
)
from ppe_core.runtime._runtime import (
    BaseRuntime,
    DeviceLike,
    PyTorchRuntime,
    get_runtime,
    iter_runtime_modules,
    map_tensors,
    named_runtime_modules,
    tag_module,
)
from ppe_core.runtime._to import to

if TYPE_CHECKING:
    #: The active plugin host's runtime registry (plugins load on first use).
    runtime_registry: RuntimeRegistry

__all__ = [
    "BaseRuntime",
    "DeviceLike",
    "DeviceRuntime",
    "OptionSpec",
    "PyTorchRuntime",
    "RuntimeOptionError",
    "RuntimeOptionTypeError",
    "RuntimeOptions",
    "RuntimeRegistry",
    "RuntimeReplacedWarning",
    "autocast_available",
    "autocast_device_type_of",
    "device_type_of",
    "get_runtime",
    "iter_runtime_modules",
    "map_tensors",
    "named_runtime_modules",
    "positive_int",
    "runtime_registry",
    "tag_module",
    "to",
]


def __getattr__(name: str) -> Any:
    if name == "runtime_registry":
        # Resolved on every access so tests that swap the plugin host see its registry.
        return active_registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
