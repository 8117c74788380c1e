"""PPE's path ``training.extensions.snapshot_writers``: the writers of ``ppe.writing``.

Kept for code written against PPE's old path; new code imports them from ``ppe.writing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core.writing import SimpleWriter, Writer

if TYPE_CHECKING:  # for type checkers only: ppe_core.writing forwards these to ppe-extensions
    from ppe_core.writing import (
        ProcessQueueWriter,
        ProcessWriter,
        QueueWriter,
        StandardWriter,
        TensorBoardWriter,
        ThreadQueueWriter,
        ThreadWriter,
    )

__all__ = [
    "ProcessQueueWriter",
    "ProcessWriter",
    "QueueWriter",
    "SimpleWriter",
    "StandardWriter",
    "TensorBoardWriter",
    "ThreadQueueWriter",
    "ThreadWriter",
    "Writer",
]


def __getattr__(name: str) -> Any:
    # The background writers are ppe_core.writing's names, which ppe-extensions provides.
    if name in __all__:
        import ppe_core.writing

        return getattr(ppe_core.writing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
