"""Writers: how extensions save files (crash-safely, synchronously or in the background)."""

from __future__ import annotations

from ppe_core.errors import DiskFullError, WriterError, WriterFinalizedError
from ppe_core.writing._parallel_writer import ProcessWriter, StandardWriter, ThreadWriter
from ppe_core.writing._queue_writer import ProcessQueueWriter, QueueWriter, ThreadQueueWriter
from ppe_core.writing._simple_writer import SimpleWriter
from ppe_core.writing._writer_base import Appender, FileSystem, SaveFun, Target, Writer

__all__ = [
    "Appender",
    "DiskFullError",
    "FileSystem",
    "ProcessQueueWriter",
    "ProcessWriter",
    "QueueWriter",
    "SaveFun",
    "SimpleWriter",
    "StandardWriter",
    "Target",
    "TensorBoardWriter",
    "ThreadQueueWriter",
    "ThreadWriter",
    "Writer",
    "WriterError",
    "WriterFinalizedError",
]


def __getattr__(name: str) -> object:
    # TensorBoardWriter needs the optional tensorboard package only when it is created; its
    # module is imported on first access so ``import ppe_core.writing`` stays light.
    if name == "TensorBoardWriter":
        from ppe_core.writing._tensorboard_writer import TensorBoardWriter

        return TensorBoardWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
