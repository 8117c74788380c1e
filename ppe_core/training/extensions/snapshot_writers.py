"""PPE's path ``training.extensions.snapshot_writers``: the writers of ``ppe.writing``.

Kept for code written against PPE's old path; new code imports them from ``ppe.writing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core.writing import (
    ProcessQueueWriter,
    ProcessWriter,
    QueueWriter,
    SimpleWriter,
    StandardWriter,
    ThreadQueueWriter,
    ThreadWriter,
    Writer,
)

if TYPE_CHECKING:
    from ppe_core.writing import TensorBoardWriter

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
    # TensorBoardWriter loads its optional dependency's module on first access, as in writing.
    if name == "TensorBoardWriter":
        import ppe_core.writing

        return ppe_core.writing.TensorBoardWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
