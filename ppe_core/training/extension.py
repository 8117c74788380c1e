"""Public extension API at PPE's path ``ppe.training.extension``."""

from __future__ import annotations

from ppe_core.errors import DuplicateExtensionError, ExtensionNameError
from ppe_core.training._extension import (
    PRIORITY_EDITOR,
    PRIORITY_READER,
    PRIORITY_SNAPSHOT,
    PRIORITY_WRITER,
    Extension,
    ExtensionEntry,
    ExtensionLike,
    ExtensionsManagerProtocol,
    make_extension,
)

__all__ = [
    "PRIORITY_EDITOR",
    "PRIORITY_READER",
    "PRIORITY_SNAPSHOT",
    "PRIORITY_WRITER",
    "DuplicateExtensionError",
    "Extension",
    "ExtensionEntry",
    "ExtensionLike",
    "ExtensionNameError",
    "ExtensionsManagerProtocol",
    "make_extension",
]
