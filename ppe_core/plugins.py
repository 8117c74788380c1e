"""Plugin discovery, the plugin host and its registries (public facade)."""

from __future__ import annotations

from ppe_core._plugins import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    ENV_ALLOW_OVERRIDE,
    ENV_DISABLE_PLUGIN_AUTOLOAD,
    ENV_DISABLED_PLUGINS,
    ENV_PLUGINS,
    ENV_STRICT_PLUGINS,
    ENV_TRACE_PLUGINS,
    FIRST_PARTY_DISTRIBUTIONS,
    PluginHost,
    PluginRecord,
    PluginSettings,
    get_plugin_host,
    set_plugin_host,
)
from ppe_core._registry import Registrant, Registry, RegistryEntry
from ppe_core._resolve import resolve_device, resolve_runtime, resolve_runtime_class

__all__ = [
    "BUILTIN_PLUGINS",
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
    "get_plugin_host",
    "resolve_device",
    "resolve_runtime",
    "resolve_runtime_class",
    "set_plugin_host",
]
