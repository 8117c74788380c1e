"""Extensions: every extension a plugin registered, reachable as ``extensions.<Name>``.

The standard extensions are registered by ppe-core's built-in plugin through the same
``ppe_register_extensions`` hook third-party packages use.
"""

from __future__ import annotations

from typing import Any

from ppe_core.errors import RegistryLookupError


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from ppe_core._plugins import get_plugin_host

    try:
        return get_plugin_host().extensions.get(name)
    except RegistryLookupError as exc:
        raise AttributeError(str(exc)) from None


def __dir__() -> list[str]:
    from ppe_core._plugins import get_plugin_host

    return sorted(set(globals()) | set(get_plugin_host().extensions.names()))
