"""Public extension API at PPE's path ``ppe.training.extension``.

Besides PPE's names, the manager as extensions see it (:class:`ManagerView`), for type hints.
Light to import (an extension package's plugin module may import it at discovery): what
extensions need of the engine itself (``named_models``, ``record_ranks``,
``PPE_CORE_STATE_KEY``) is in ``ppe_core.training``, loaded on first access.
"""

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
from ppe_core.training._protocols import ManagerView

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
    "ManagerView",
    "make_extension",
]
