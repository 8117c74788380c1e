"""Built-in plugin registering the standard extensions (LogReport, ProgressBar, ...)."""

from __future__ import annotations

from typing import Any

from ppe_core.hookspecs import hookimpl

#: Extension name -> "module:attribute"; imported when the registry is first filled.
BUILTIN_EXTENSIONS: dict[str, str] = {}


@hookimpl
def ppe_register_extensions(registry: Any) -> None:
    """Register every built-in extension under its public name."""
    from ppe_core._builtin import _resolve

    for name, target in BUILTIN_EXTENSIONS.items():
        registry.register(name, _resolve(target))
