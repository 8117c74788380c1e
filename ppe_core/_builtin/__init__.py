"""ppe-core's built-in plugins: hook implementations only, registered like external plugins."""

from __future__ import annotations

import importlib


def _resolve(target: str) -> object:
    """Import ``"package.module:attribute"`` and return the attribute."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
