"""ppe-extensions: the standard extensions of ppe-core, its background writers and the
experiment-tracker base (``ppe_extensions.tracking``).

Scripts reach the extensions as ``ppe.training.extensions.<Name>`` (the names this package
registers through the ``ppe_core`` entry point) or at PPE's module paths, which ppe-core keeps
as faces that forward here. Importing this package imports no extension: each name loads on
first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from ppe_extensions.plugin import EXTENSIONS

#: Functions of the snapshot family, beside the extensions: load or verify a snapshot file
#: outside a trainer (``trainer.load_state_dict(load_snapshot(path))``), export its model.
FUNCTIONS: dict[str, str] = {
    "load_snapshot": "ppe_extensions._snapshot_manifest:load_snapshot",
    "verify_snapshot": "ppe_extensions._snapshot_manifest:verify_snapshot",
    "export_snapshot": "ppe_extensions._snapshot_export:export_snapshot",
}

__all__ = sorted({*EXTENSIONS, *FUNCTIONS})


def __getattr__(name: str) -> Any:
    target = EXTENSIONS.get(name) or FUNCTIONS.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
