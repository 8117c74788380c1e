"""Writers with one long-lived consumer (thread or process) fed through a queue."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

import torch

from ppe_core.errors import WriterError, WriterFinalizedError
from ppe_core.writing import FileSystem, SaveFun, SimpleWriter, Target, Writer, run_job
from ppe_extensions._background import register_for_exit, run_in_worker, start_job
from ppe_extensions._parallel_writer import _resolve_context, _Worker

__all__ = ["ProcessQueueWriter", "QueueWriter", "ThreadQueueWriter"]

#: What the consumer receives: ``(task, filename, out_dir, target, savefun, append)`` (PPE's
#: layout; ``task`` performs the save), or ``None`` to stop.
QueueItem: TypeAlias = tuple[Any, str, str, Target, SaveFun | None, bool] | None

_W = TypeVar("_W", bound=_Worker)
_T = TypeVar("_T")


class _Queue(Protocol):
    """The part of ``queue.Queue`` / ``multiprocessing`` queues the writers use."""

    def put(self, item: Any) -> None: ...

    def get(self) -> Any: ...

    def empty(self) -> bool: ...


def _consume(tasks: _Queue, errors: _Queue, default_task: Any = None) -> None:
    """Runs queued saves until ``None`` arrives; failures are reported through ``errors``.

    A module-level function (not a method) so the consumer holds no reference to the writer,
    which can then be garbage-collected, and so process consumers need not pickle it. Each
    item is acknowledged with ``task_done()`` when the queue has it (``queue.Queue``,
    ``JoinableQueue``), so ``tasks.join()`` works as in PPE. Items whose task is None use
    ``default_task`` (process consumers receive it once instead of pickling it per item).
    """
    task_done = getattr(tasks, "task_done", None)
    # The writers that performed saves: their appends are synced before the consumer stops.
    writers: dict[int, Writer] = {}
    while True:
        item = tasks.get()
        if item is None:
            for writer in writers.values():
                try:
                    writer.sync_appends()
                except Exception as exc:
                    errors.put(("<sync>", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            if task_done is not None:
                task_done()
            return
        # Indexed, not unpacked: PPE's layout, and subclasses may queue other sequences.
        filename = item[1]
        try:
            task = default_task if item[0] is None else item[0]
            if isinstance(task, Writer):
                writers.setdefault(id(task), task)
            task(item[1], item[2], item[3], savefun=item[4], append=item[5])
        except Exception as exc:
            errors.put((filename, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        finally:
            if task_done is not None:
                task_done()
        # Drop references before blocking again so saved tensors can be freed.
        del item


class _Job:
    """A queue item's task that runs a submitted job (the save's arguments are unused)."""

    def __init__(self, job: Callable[[], Any], future: Future[Any]) -> None:
        self.job = job
        self.future = future

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        run_job(self.job, self.future)


def _is_alive(worker: Any) -> bool:
    return bool(worker.is_alive())


class QueueWriter(Writer, Generic[_W]):
    """Base class of writers whose single consumer saves queued files in order.

    A call only enqueues the save and returns. Failures are reported as :class:`WriterError`
    by the next call or by :meth:`finalize`, which waits for the queue to drain. Jobs given to
    :meth:`~Writer.submit` are queued like saves.

    Args:
        savefun: Passed to :meth:`create_task` when ``task`` is None; ``torch.save`` by default.
        fs: File system to write through; the local one by default.
        out_dir: Directory to write into; when empty, the ``out_dir`` of each call is used.
        task: Callable with :meth:`Writer.__call__`'s interface that performs each save; a
            :class:`SimpleWriter` by default.
    """

    in_background = True

    def __init__(
        self,
        savefun: SaveFun = torch.save,
        fs: FileSystem | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        task: Any | None = None,
    ) -> None:
        super().__init__(fs=fs, out_dir=out_dir)
        self._finalized = False
        self._task = self.create_task(savefun) if task is None else task
        self._queue: _Queue = self.create_queue()
        self._errors: _Queue = self._create_error_queue()
        self._failures: list[tuple[str, str, str]] = []
        self._consumer: _W = self.create_consumer(self._queue)
        self._consumer.start()
        self._started = True
        register_for_exit(self)

    def __call__(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
    ) -> None:
        """Enqueues the save of ``target``; see :meth:`Writer.__call__`.

        ``target`` is read by the consumer later: do not modify it afterwards.

        Raises:
            WriterError: An earlier queued save failed.
            WriterFinalizedError: The writer was finalized.
        """
        self._check_open(repr(filename))
        self._queue.put((self._queued_task(), filename, out_dir, target, savefun, append))

    def submit(self, job: Callable[[], _T]) -> Future[_T]:
        """Queues ``job`` behind the saves before it; see :meth:`Writer.submit`."""
        self._check_open("a job")
        future: Future[_T] = Future()
        self._queue.put((_Job(job, future), "<job>", "", None, None, False))
        return future

    def _check_open(self, what: str) -> None:
        """Raises if the writer was finalized or an earlier save failed."""
        if self._finalized:
            raise WriterFinalizedError(
                f"{type(self).__name__} was finalized; create a new writer to save {what}"
            )
        self._raise_errors()

    def _queued_task(self) -> Any:
        """The task placed in each queue item (PPE's layout: the first element)."""
        return self._task

    def create_task(self, savefun: SaveFun) -> Any:
        """Returns the callable that performs each save: a :class:`SimpleWriter`."""
        return SimpleWriter(savefun=savefun, fs=self.fs, out_dir=self.out_dir or "")

    def create_queue(self) -> _Queue:
        """Returns the queue that carries saves to the consumer."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_queue")

    def _create_error_queue(self) -> _Queue:
        # Where consumers report failures; a thread-safe queue suits in-process consumers.
        return queue.Queue()

    def create_consumer(self, q: _Queue) -> _W:
        """Returns the unstarted consumer of ``q``."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_consumer")

    def consume(self, q: _Queue) -> None:
        """Performs the saves queued in ``q`` until ``None`` arrives (the consumer's loop).

        Subclasses whose :meth:`create_consumer` runs ``self.consume`` get failure reporting
        and ``task_done()`` acknowledgements like the built-in consumers.
        """
        _consume(q, self._errors, self._task)

    def _drain_errors(self) -> None:
        while not self._errors.empty():
            self._failures.append(self._errors.get())

    def _raise_errors(self) -> None:
        self._drain_errors()
        failures, self._failures = self._failures, []
        if not failures:
            return
        filename, message, details = failures[0]
        more = f" (and {len(failures) - 1} more failed saves)" if len(failures) > 1 else ""
        raise WriterError(
            f"{type(self).__name__} failed to save {filename!r}: {message}{more}\n{details}"
        )

    def finalize(self) -> None:
        """Waits until every queued save is done and stops the consumer; idempotent.

        Raises:
            WriterError: A queued save failed.
        """
        if self._finalized:
            return
        self._finalized = True
        self._queue.put(None)
        self._join_consumer()
        self._started = False
        self._raise_errors()

    def _join_consumer(self) -> None:
        """Waits for the queue to be done (``join``, as in PPE), then for the consumer to stop.

        The consumer acknowledges each item with ``task_done()``; a queue without ``join``
        is waited for through the consumer alone.
        """
        join = getattr(self._queue, "join", None)
        if join is not None:
            join()
        self._consumer.join()

    def __del__(self) -> None:
        # Unfinalized and unreachable: let the consumer finish the queue and exit.
        if getattr(self, "_started", False) and not getattr(self, "_finalized", True):
            with contextlib.suppress(Exception):  # the interpreter may be shutting down
                self._queue.put(None)


class ThreadQueueWriter(QueueWriter[threading.Thread]):
    """Saves queued files one after another in a background thread.

    Args:
        savefun: ``savefun(target, file_object)``; ``torch.save`` by default.
        fs: File system to write through; the local one by default.
        out_dir: Directory to write into; when empty, the ``out_dir`` of each call is used.
        task: Callable performing each save; a :class:`SimpleWriter` by default.
    """

    def create_queue(self) -> _Queue:
        """Returns a ``queue.Queue``."""
        return queue.Queue()

    def create_consumer(self, q: _Queue) -> threading.Thread:
        """Returns a daemon thread running the consumer loop.

        Daemon, so a writer that is never finalized cannot block interpreter exit; live
        writers are finalized at exit, which completes their pending saves.
        """
        return threading.Thread(
            target=_consume,
            args=(q, self._errors),
            name=f"ppe_core.{type(self).__name__}",
            daemon=True,
        )


class ProcessQueueWriter(QueueWriter[BaseProcess]):
    """Saves queued files one after another in a background process.

    Queued targets are pickled into the process, so tensors must not be modified after the
    call (multiprocessing shares tensor storage instead of copying it). Forking a process
    that uses MPI or CUDA may be unsafe; prefer :class:`ThreadQueueWriter` there.

    Args:
        savefun: ``savefun(target, file_object)``; ``torch.save`` by default.
        fs: File system to write through; the local one by default.
        out_dir: Directory to write into; when empty, the ``out_dir`` of each call is used.
        task: Callable performing each save (it must pickle); a :class:`SimpleWriter` by
            default.
        mp_context: ``multiprocessing`` start method name or context; the default when None.
    """

    def __init__(
        self,
        savefun: SaveFun = torch.save,
        fs: FileSystem | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        task: Any | None = None,
        *,
        mp_context: str | BaseContext | None = None,
    ) -> None:
        self._context = _resolve_context(mp_context)
        self._job: threading.Thread | None = None
        super().__init__(savefun=savefun, fs=fs, out_dir=out_dir, task=task)

    def submit(self, job: Callable[[], _T]) -> Future[_T]:
        """Runs ``job`` in a thread of this process once the previous job is done.

        The consumer process cannot receive a job (a closure over this process's state); see
        :meth:`Writer.submit`.
        """
        self._check_open("a job")
        if self._job is not None:
            self._job.join()
        self._job, future = start_job(job, f"ppe_core.{type(self).__name__}")
        return future

    def create_queue(self) -> _Queue:
        """Returns a ``multiprocessing.JoinableQueue`` (of the writer's context, if given)."""
        tasks: _Queue = self._mp().JoinableQueue()
        return tasks

    def _create_error_queue(self) -> _Queue:
        errors: _Queue = self._mp().SimpleQueue()
        return errors

    def _queued_task(self) -> Any:
        # The consumer process got the task once, at its start; not pickling it into every
        # item keeps tasks whose savefun does not pickle (lambdas, with fork) working.
        return None

    def _mp(self) -> Any:
        """The ``multiprocessing`` module itself, or the context given as ``mp_context``."""
        return multiprocessing if self._context is None else self._context

    def _join_consumer(self) -> None:
        if self._job is not None:
            self._job.join()
        # Drain failures while waiting: a process consumer blocks once the error pipe is full.
        while True:
            self._consumer.join(timeout=0.05)
            if not _is_alive(self._consumer):
                return
            self._drain_errors()

    def create_consumer(self, q: _Queue) -> BaseProcess:
        """Returns a daemon process running the consumer loop.

        Daemon processes are stopped at a normal exit of this process; the consumer also
        exits when this process is killed (SIGKILL, OOM), instead of waiting forever for its
        queue.
        """
        process: BaseProcess = self._mp().Process(
            target=run_in_worker,
            args=(_consume, q, self._errors, self._task),
            name=f"ppe_core.{type(self).__name__}",
            daemon=True,
        )
        return process
