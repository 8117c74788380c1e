"""Plugin discovery, the plugin host and its registries (public facade)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core._plugins import (
    BUILTIN_PLUGINS,
    DEVICE_ENTRY_POINT_GROUP,
    ENTRY_POINT_GROUP,
    ENV_ALLOW_OVERRIDE,
    ENV_DISABLE_PLUGIN_AUTOLOAD,
    ENV_DISABLED_PLUGINS,
    ENV_PLUGINS,
    ENV_STRICT_PLUGINS,
    ENV_TRACE_PLUGINS,
    PluginHost,
    PluginRecord,
    PluginSettings,
    first_party_distributions,
    get_plugin_host,
    set_plugin_host,
)
from ppe_core._registry import Registrant, Registry, RegistryEntry
from ppe_core._resolve import resolve_device, resolve_runtime, resolve_runtime_class

if TYPE_CHECKING:
    #: The first-party distributions, read from installed metadata on each access
    #: (:func:`first_party_distributions`).
    FIRST_PARTY_DISTRIBUTIONS: frozenset[str]

__all__ = [
    "BUILTIN_PLUGINS",
    "DEVICE_ENTRY_POINT_GROUP",
    "ENTRY_POINT_GROUP",
    "ENV_ALLOW_OVERRIDE",
    "ENV_DISABLED_PLUGINS",
    "ENV_DISABLE_PLUGIN_AUTOLOAD",
    "ENV_PLUGINS",
    "ENV_STRICT_PLUGINS",
    "ENV_TRACE_PLUGINS",
    "FIRST_PARTY_DISTRIBUTIONS",
    "PluginHost",
    "PluginRecord",
    "PluginSettings",
    "Registrant",
    "Registry",
    "RegistryEntry",
    "first_party_distributions",
    "get_plugin_host",
    "resolve_device",
    "resolve_runtime",
    "resolve_runtime_class",
    "set_plugin_host",
]


def __getattr__(name: str) -> Any:
    if name == "FIRST_PARTY_DISTRIBUTIONS":  # read from installed metadata on each access
        return first_party_distributions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
