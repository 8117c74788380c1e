"""Runtimes: how a device executes models. Device code lives only in runtimes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core.runtime._registry import (
    RuntimeRegistry,
    RuntimeReplacedWarning,
    _RuntimeRegistry,  # noqa: F401  (PPE's name, reachable as ppe.runtime._RuntimeRegistry)
    device_type_of,
)
from ppe_core.runtime._runtime import (
    BaseRuntime,
    DeviceLike,
    PyTorchRuntime,
    RuntimeOptionError,
    get_runtime,
    iter_runtime_modules,
    named_runtime_modules,
)
from ppe_core.runtime._to import to

__all__ = [
    "BaseRuntime",
    "DeviceLike",
    "PyTorchRuntime",
    "RuntimeOptionError",
    "RuntimeRegistry",
    "RuntimeReplacedWarning",
    "device_type_of",
    "get_runtime",
    "iter_runtime_modules",
    "named_runtime_modules",
    "runtime_registry",
    "to",
]

if TYPE_CHECKING:
    #: The active plugin host's runtime registry (plugins load on first use).
    runtime_registry: RuntimeRegistry


def __getattr__(name: str) -> Any:
    # Resolved on every access so tests that swap the plugin host see its registry.
    if name == "runtime_registry":
        from ppe_core._plugins import get_plugin_host

        return get_plugin_host().runtimes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
