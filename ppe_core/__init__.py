"""ppe-core: a slim, device-agnostic training framework for PyTorch, extended by plugins.

``import ppe_core as ppe`` is cheap: submodules load on first attribute access and plugins are
discovered the first time a registry is used (``ppe.to``, ``create_trainer``,
``ppe.training.extensions.<Name>``, ``ppe.runtime.runtime_registry``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ppe_core._version import __version__
from ppe_core.hookspecs import hookimpl, hookspec
from ppe_core.runtime import to

if TYPE_CHECKING:
    from ppe_core import (
        engine,
        errors,
        handler,
        hookspecs,
        plugins,
        profiler,
        reporting,
        runtime,
        testing,
        training,
        writing,
    )

__all__ = [
    "__version__",
    "engine",
    "errors",
    "handler",
    "hookimpl",
    "hookspec",
    "hookspecs",
    "plugins",
    "profiler",
    "reporting",
    "runtime",
    "testing",
    "to",
    "training",
    "writing",
]

_SUBMODULES = frozenset(
    {
        "engine",
        "errors",
        "handler",
        "hookspecs",
        "plugins",
        "profiler",
        "reporting",
        "runtime",
        "testing",
        "training",
        "writing",
    }
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
