"""Runtimes: how a device executes models. Device code lives only in runtimes.

This package is the runtime contract and depends on nothing above it. ``to`` and
``runtime_registry`` need the plugin host; they are re-exported here at PPE's paths from the
plugin layer (``ppe_core._resolve``, ``ppe_core._plugins``) on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core.errors import RuntimeOptionError, RuntimeReplacedWarning
from ppe_core.runtime._options import (
    DeviceRuntime,
    OptionSpec,
    RuntimeOptions,
    RuntimeOptionTypeError,
    positive_int,
)
from ppe_core.runtime._registry import (
    RuntimeRegistry,
    _RuntimeRegistry,  # noqa: F401  (PPE's name, reachable as ppe.runtime._RuntimeRegistry)
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

if TYPE_CHECKING:
    from ppe_core._resolve import to

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
    if name == "to":
        from ppe_core._resolve import to

        globals()["to"] = to  # a plain attribute from now on
        return to
    if name == "runtime_registry":
        # Resolved on every access so tests that swap the plugin host see its registry.
        from ppe_core._plugins import get_plugin_host

        return get_plugin_host().runtimes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
