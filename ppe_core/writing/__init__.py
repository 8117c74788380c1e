"""Writers: how extensions save files (crash-safely, synchronously or in the background).

The core defines the :class:`Writer` contract and :class:`SimpleWriter`, which saves in the
calling thread (the manager's default), plus what extensions use to write their files. The
background writers (``ThreadWriter``, ``ProcessQueueWriter``, ...) and ``TensorBoardWriter``
ship in ppe-extensions; this module's names for them forward there (``ppe_core._faces``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core.errors import DiskFullError, WriterError, WriterFinalizedError
from ppe_core.writing._extension_files import (
    OutputSample,
    WriterLike,
    log_output_files,
    write_file,
    writes_files_in_out,
)
from ppe_core.writing._simple_writer import SimpleWriter
from ppe_core.writing._writer_base import (
    HOST_TAG,
    Appender,
    FileSystem,
    SaveFun,
    Target,
    Writer,
    disk_full_error,
    process_is_dead,
    run_job,
)

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._parallel_writer import ProcessWriter, StandardWriter, ThreadWriter
    from ppe_extensions._queue_writer import ProcessQueueWriter, QueueWriter, ThreadQueueWriter
    from ppe_extensions._tensorboard_writer import TensorBoardWriter

#: The names ppe-extensions provides here.
_PROVIDED = (
    "ProcessQueueWriter",
    "ProcessWriter",
    "QueueWriter",
    "StandardWriter",
    "TensorBoardWriter",
    "ThreadQueueWriter",
    "ThreadWriter",
)

__all__ = [
    "HOST_TAG",
    "Appender",
    "DiskFullError",
    "FileSystem",
    "OutputSample",
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
    "WriterLike",
    "disk_full_error",
    "log_output_files",
    "process_is_dead",
    "run_job",
    "write_file",
    "writes_files_in_out",
]

if not TYPE_CHECKING:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, _PROVIDED)
