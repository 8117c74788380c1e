"""The active plugin host, as the layers below the host reach it.

The plugin host (``ppe_core._plugins``) loads the built-in plugins, which name the handler's
logics and the training extensions; so the Trainer, the Evaluator, the extension namespace and
the profiler cannot import the host without an import circle. They call :func:`active_host`
instead, and ``ppe_core``'s ``__init__`` (the composition root, which loads nothing at import)
binds it to :func:`ppe_core._plugins.get_plugin_host` with :func:`set_host_source`. Each call
asks the source again, so tests that swap the host (``ppe_core.testing``) are seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ppe_core.errors import ConfigurationError

if TYPE_CHECKING:  # only a type: importing the host here is the circle this module avoids
    from ppe_core._plugins import PluginHost

__all__ = ["active_host", "set_host_source"]

_source: Callable[[], PluginHost] | None = None


def set_host_source(source: Callable[[], PluginHost]) -> None:
    """Make ``source()`` what :func:`active_host` returns (set once, by ``ppe_core``)."""
    global _source
    _source = source


def active_host() -> PluginHost:
    """The active plugin host (created, and its plugins loaded, on first use)."""
    if _source is None:  # pragma: no cover - ppe_core's __init__ always sets it
        raise ConfigurationError("no plugin host is active; import ppe_core first")
    return _source()
