"""Writers that save each file in a new thread (``ThreadWriter``) or process (``ProcessWriter``)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Generic, Protocol, TypeVar, cast

import torch

from ppe_core.errors import WriterError, WriterFinalizedError
from ppe_core.writing import FileSystem, SaveFun, Target, Writer
from ppe_extensions._background import register_for_exit, run_in_worker, start_job

__all__ = ["ProcessWriter", "StandardWriter", "ThreadWriter"]


class _Worker(Protocol):
    """What :meth:`StandardWriter.create_worker` returns: a thread or a process."""

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


_W = TypeVar("_W", bound=_Worker)
_T = TypeVar("_T")


def _resolve_context(mp_context: str | BaseContext | None) -> BaseContext | None:
    """None keeps ``multiprocessing``'s own default (``multiprocessing.Process`` workers)."""
    if isinstance(mp_context, str):
        return multiprocessing.get_context(mp_context)
    return mp_context


class StandardWriter(Writer, Generic[_W]):
    """Base class of writers that start one worker (thread or process) per save.

    A call returns as soon as the worker started. The next call, and :meth:`finalize`, first
    wait for the previous worker, so at most one save is in flight and a failed save is
    reported (as :class:`WriterError`) at the next call at the latest. A job given to
    :meth:`~Writer.submit` takes the worker's place like a save (in a thread, for both).

    Args:
        savefun: ``savefun(target, file_object, **kwds)``; ``torch.save`` by default.
        fs: File system to write through; the local one by default.
        out_dir: Directory to write into; when empty, the ``out_dir`` of each call is used.
        **kwds: Keyword arguments passed to every ``savefun`` call.
    """

    in_background = True

    def __init__(
        self,
        savefun: SaveFun = torch.save,
        fs: FileSystem | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        **kwds: Any,
    ) -> None:
        super().__init__(fs=fs, out_dir=out_dir)
        self._savefun = savefun
        self._kwds = kwds
        self._worker: _W | None = None
        self._errors: list[tuple[BaseException, str]] = []
        self._finalized = False
        register_for_exit(self)

    def __getstate__(self) -> dict[str, Any]:
        # A process worker receives the writer itself (spawn/forkserver pickle it); the
        # running worker and the error list belong to the parent only.
        state = self.__dict__.copy()
        state["_worker"] = None
        state["_errors"] = []
        return state

    def __call__(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
    ) -> None:
        """Waits for the previous save, then starts a worker saving ``target``.

        See :meth:`Writer.__call__` for the arguments. ``target`` is read by the worker after
        this returns: do not modify it afterwards.

        Raises:
            WriterError: The previous save failed.
            WriterFinalizedError: The writer was finalized.
        """
        self._check_open(repr(filename))
        self._wait()
        worker = self.create_worker(
            filename,
            out_dir,
            target,
            savefun=self._savefun if savefun is None else savefun,
            append=append,
            **self._kwds,
        )
        self._worker = worker
        worker.start()

    def submit(self, job: Callable[[], _T]) -> Future[_T]:
        """Waits for the save or job in flight, then runs ``job`` in a worker thread.

        See :meth:`Writer.submit`.
        """
        self._check_open("a job")
        self._wait()
        thread, future = start_job(job, f"ppe_core.{type(self).__name__}")
        self._worker = cast(_W, thread)
        return future

    def _check_open(self, what: str) -> None:
        if self._finalized:
            raise WriterFinalizedError(
                f"{type(self).__name__} was finalized; create a new writer to save {what}"
            )

    def create_worker(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
        **savefun_kwargs: Any,
    ) -> _W:
        """Returns an unstarted worker that calls :meth:`Writer.save` with these arguments."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_worker")

    def _wait(self) -> None:
        worker = self._worker
        if worker is None:
            return
        self._worker = None
        worker.join()
        errors, self._errors = self._errors, []
        if errors:
            error, details = errors[0]
            raise WriterError(
                f"{type(self).__name__} failed to save in the background: "
                f"{type(error).__name__}: {error}\n{details}"
            ) from error
        exitcode = getattr(worker, "exitcode", 0)
        if exitcode:
            raise WriterError(
                f"{type(self).__name__}'s save process exited with code {exitcode} (its "
                "traceback, if any, was printed to stderr)"
            )

    def finalize(self) -> None:
        """Waits for the save in flight; later calls do nothing.

        Raises:
            WriterError: The last save failed.
        """
        if self._finalized:
            return
        self._finalized = True
        self._wait()
        self.sync_appends()  # a thread worker's appends (a process worker syncs its own)


class ThreadWriter(StandardWriter[threading.Thread]):
    """Saves each file in a new thread, so training continues during the save.

    Args:
        savefun: ``savefun(target, file_object, **kwds)``; ``torch.save`` by default.
        fs: File system to write through; the local one by default.
        out_dir: Directory to write into; when empty, the ``out_dir`` of each call is used.
        **kwds: Keyword arguments passed to every ``savefun`` call.
    """

    def _save_recording_errors(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        savefun: SaveFun,
        append: bool,
        **savefun_kwargs: Any,
    ) -> None:
        try:
            self.save(filename, out_dir, target, savefun, append, **savefun_kwargs)
        except BaseException as exc:  # reported by the next call or finalize()
            self._errors.append((exc, traceback.format_exc()))

    def create_worker(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
        **savefun_kwargs: Any,
    ) -> threading.Thread:
        """Returns a thread that saves ``target``."""
        return threading.Thread(
            target=self._save_recording_errors,
            args=(filename, out_dir, target, savefun or self._savefun, append),
            kwargs=savefun_kwargs,
            name=f"ppe_core.{type(self).__name__}",
        )


class ProcessWriter(StandardWriter[BaseProcess]):
    """Saves each file in a new process, so serialization does not hold the GIL.

    With the ``spawn`` or ``forkserver`` start methods, the writer, ``savefun`` and ``target``
    are pickled into the process. Forking a process that uses MPI or CUDA may be unsafe;
    prefer :class:`ThreadWriter` there.

    Args:
        savefun: ``savefun(target, file_object, **kwds)``; ``torch.save`` by default.
        fs: File system to write through; the local one by default.
        out_dir: Directory to write into; when empty, the ``out_dir`` of each call is used.
        mp_context: ``multiprocessing`` start method name or context; when None, workers are
            plain ``multiprocessing.Process`` objects (the platform's default start method).
        **kwds: Keyword arguments passed to every ``savefun`` call.
    """

    def __init__(
        self,
        savefun: SaveFun = torch.save,
        fs: FileSystem | None = None,
        out_dir: str | os.PathLike[str] = "",
        *,
        mp_context: str | BaseContext | None = None,
        **kwds: Any,
    ) -> None:
        super().__init__(savefun=savefun, fs=fs, out_dir=out_dir, **kwds)
        self._context = _resolve_context(mp_context)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_context"] = None  # contexts do not pickle; the child never starts processes
        return state

    def create_worker(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
        **savefun_kwargs: Any,
    ) -> BaseProcess:
        """Returns a process that saves ``target``; it exits when this process dies."""
        context: Any = multiprocessing if self._context is None else self._context
        process: BaseProcess = context.Process(
            # Tied to this process: a SIGKILLed trainer's save process exits too.
            target=run_in_worker,
            args=(self.save, filename, out_dir, target, savefun or self._savefun, append),
            kwargs=savefun_kwargs,
            name=f"ppe_core.{type(self).__name__}",
        )
        return process
