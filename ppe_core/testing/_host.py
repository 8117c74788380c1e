"""``plugin_host``: an isolated plugin host for tests of code that uses ppe-core or plugins."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ppe_core._plugins import PluginHost, PluginSettings, set_plugin_host

__all__ = ["plugin_host"]


@contextmanager
def plugin_host(
    *plugins: object,
    builtins: bool = True,
    standard: bool = True,
    settings: PluginSettings | None = None,
) -> Iterator[PluginHost]:
    """Activate a fresh, isolated plugin host for the duration of the block.

    Entry points are not scanned unless ``settings`` asks for it, so nothing needs installing:
    pass plugin objects (modules, instances) to register them. With ``standard`` (the
    default) the standard extensions are there too when ppe-extensions is installed (the
    entry points of ppe-core's ``standard`` extra), so a test can use ``LogReport``. The
    previous host is restored on exit.

    Example::

        with ppe_core.testing.plugin_host(my_plugin_module) as host:
            assert "mydev" in host.runtimes
    """
    host = PluginHost(
        settings or PluginSettings(autoload=False), builtins=builtins, standard=standard
    )
    for plugin in plugins:
        host.register(plugin)
    previous = set_plugin_host(host)
    try:
        yield host
    finally:
        set_plugin_host(previous)
