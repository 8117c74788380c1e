"""Where background writers run their work: job threads, worker processes tied to the
trainer's life, and the writers finalized at interpreter exit."""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # its exit handler must be registered before ours
import os
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ppe_core.writing import Writer, run_job

__all__ = ["register_for_exit", "run_in_worker", "start_job"]

_T = TypeVar("_T")


def _exit_with_parent() -> None:
    """In a writer's worker process: exit as soon as the process that started it dies.

    A worker of a SIGKILLed trainer would otherwise live on (holding its memory) until its
    queue is closed, which never happens. A daemon thread waits on multiprocessing's
    parent sentinel, which becomes ready when the parent exits, however it ends.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)  # nothing left to report to; a save in progress leaves its temp file

    threading.Thread(target=watch, name="ppe_core writer parent watch", daemon=True).start()


def start_job(job: Callable[[], _T], name: str) -> tuple[threading.Thread, Future[_T]]:
    """A started (non-daemon) thread running ``job``, and the future of its outcome."""
    future: Future[_T] = Future()
    thread = threading.Thread(target=run_job, args=(job, future), name=name)
    thread.start()
    return thread, future


def run_in_worker(target: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    """The entry point of writer worker processes: ``target(*args, **kwargs)``, tied to the
    life of the parent (see :func:`_exit_with_parent`)."""
    _exit_with_parent()
    target(*args, **kwargs)


# Background writers finalized at interpreter exit, so pending saves complete even when the
# user never called finalize(). atexit runs before multiprocessing reaps its children.
_LIVE_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def register_for_exit(writer: Writer) -> None:
    with _LIVE_LOCK:
        _LIVE_WRITERS.add(writer)


def _finalize_live_writers() -> None:
    with _LIVE_LOCK:
        writers = list(_LIVE_WRITERS)
    for writer in writers:
        try:
            writer.finalize()
        except Exception as exc:  # at exit there is nobody left to raise to
            print(f"ppe_core: {type(writer).__name__} failed at exit: {exc}", file=sys.stderr)


# Registered after multiprocessing's own handler, so (handlers run last-in first-out) queue
# consumers are told to stop before multiprocessing joins its child processes.
atexit.register(_finalize_live_writers)
