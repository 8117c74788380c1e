"""Built-in plugin registering the core's training logics by name."""

from __future__ import annotations

from typing import Any

from ppe_core.hookspecs import hookimpl

#: Logic name -> "module:attribute"; imported at first lookup.
BUILTIN_LOGICS: dict[str, str] = {
    "default": "ppe_core.handler:Logic",
    "codeblock": "ppe_core.handler:CodeBlockLogic",
}


@hookimpl
def ppe_register_logics(registry: Any) -> None:
    """Register every built-in logic under its public name."""
    for name, target in BUILTIN_LOGICS.items():
        registry.register_lazy(name, target)
