"""ppe-core: a slim, device-agnostic training framework for PyTorch, extended by plugins.

``import ppe_core as ppe`` is cheap: submodules load on first attribute access and plugins are
discovered the first time a registry is used (``ppe.to``, ``create_trainer``,
``ppe.training.extensions.<Name>``, ``ppe.runtime.runtime_registry``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ppe_core import _not_provided
from ppe_core._version import __version__
from ppe_core.hookspecs import hookimpl, hookspec
from ppe_core.runtime import _registry as _runtime_registry
from ppe_core.runtime import to

if TYPE_CHECKING:
    from ppe_core import (
        config,
        dataloaders,
        distributed,
        engine,
        errors,
        handler,
        hookspecs,
        logging,
        nn,
        plugins,
        profiler,
        reporting,
        runtime,
        testing,
        training,
        writing,
    )
    from ppe_core._compile import compile
    from ppe_core._map import map
    from ppe_core._requires import requires
    from ppe_core.runtime import RuntimeRegistry

_SUBMODULES = frozenset(
    {
        "config",
        "dataloaders",
        "distributed",
        "engine",
        "errors",
        "handler",
        "hookspecs",
        "logging",
        "nn",
        "plugins",
        "profiler",
        "reporting",
        "runtime",
        "testing",
        "training",
        "writing",
    }
)

# Public function -> defining module, imported on first access. ``map`` and ``compile`` keep
# PPE's top-level names (they shadow the builtins only as ``ppe.map``/``ppe.compile``).
_FUNCTIONS: dict[str, str] = {
    "compile": "ppe_core._compile",
    "map": "ppe_core._map",
    "requires": "ppe_core._requires",
}

__all__ = [
    "__version__",
    "compile",
    "config",
    "dataloaders",
    "distributed",
    "engine",
    "errors",
    "handler",
    "hookimpl",
    "hookspec",
    "hookspecs",
    "logging",
    "map",
    "nn",
    "plugins",
    "profiler",
    "reporting",
    "requires",
    "runtime",
    "testing",
    "to",
    "training",
    "writing",
]

# ``import ppe_core.cuda`` and other PPE modules ppe-core leaves out raise a clear error.
_not_provided.install_finder()


def _active_runtimes() -> RuntimeRegistry:
    # The face composes the layers: the runtime contract sits below the plugin host (which
    # holds a RuntimeRegistry), so it reaches the host's registry through this slot; the host
    # loads on first use.
    from ppe_core._plugins import get_plugin_host

    return get_plugin_host().runtimes


_runtime_registry.set_registry_source(_active_runtimes)
del _active_runtimes, _runtime_registry  # not names of the package


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module_name = _FUNCTIONS.get(name)
    if module_name is None:
        raise _not_provided.not_provided_error(__name__, name)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise AttributeError(
            f"ppe_core.{name} is not available in this ppe-core installation "
            f"({module_name} is missing); see docs/migration.md"
        ) from None
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
