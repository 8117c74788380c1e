"""``SimpleWriter``: saves in the calling thread."""

from __future__ import annotations

import os
from typing import Any

import torch

from ppe_core.writing._writer_base import Appender, FileSystem, SaveFun, Target, Writer

__all__ = ["SimpleWriter"]


class SimpleWriter(Writer):
    """Saves synchronously, in the thread that calls it; the manager's default writer.

    Args:
        savefun: ``savefun(target, file_object, **kwds)``; ``torch.save`` by default.
        fs: File system to write through; the local one by default.
        out_dir: Directory to write into; when empty, the ``out_dir`` of each call is used.
        **kwds: Keyword arguments passed to every ``savefun`` call.

    Example::

        writer = SimpleWriter(out_dir="result")
        writer("snapshot_iter_100", "result", manager.state_dict())
    """

    def __init__(
        self,
        savefun: SaveFun = torch.save,
        fs: FileSystem | None = None,
        out_dir: str | os.PathLike[str] = "",
        **kwds: Any,
    ) -> None:
        super().__init__(fs=fs, out_dir=out_dir)
        self._savefun = savefun
        self._kwds = kwds

    def __call__(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
    ) -> None:
        """Saves ``target`` now; see :meth:`Writer.__call__`.

        Raises:
            Exception: Whatever ``savefun`` or the file system raised; the destination file is
                left as it was.
        """
        if savefun is None:
            savefun = self._savefun
        if self._kwds:
            self.save(filename, out_dir, target, savefun, append, **self._kwds)
        else:  # a log's per-entry append: no keyword dictionary to build and unpack
            self.save(filename, out_dir, target, savefun, append)

    def appender(self, filename: str, out_dir: str, savefun: SaveFun) -> Appender:
        """An :class:`~ppe_core.writing.Appender` that writes an append itself
        (one system call) while the file's kept handle is open and not due for its ``fsync``.

        Unless a subclass saves its own way (its own ``__call__`` or ``save``, which every
        append must then go through) or the writer passes keyword arguments to every savefun:
        then the appender calls the writer each time, as :meth:`Writer.appender`'s does.
        """
        direct = (
            type(self).__call__ is SimpleWriter.__call__
            and type(self).save is Writer.save
            and not self._kwds
        )
        return Appender(self, filename, out_dir, savefun, direct=direct)
