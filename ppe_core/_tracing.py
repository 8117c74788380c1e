"""Timeline tracers (PPE's ``ppe.profiler.Tracer`` family): named spans written as Chrome traces."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import IO, Any, cast

import torch

__all__ = [
    "ChromeTracer",
    "TraceableDataset",
    "Tracer",
    "clear_tracer",
    "enable_global_trace",
    "enable_thread_trace",
    "get_tracer",
    "load_chrome_trace_as_json",
]


class Tracer:
    """Interface of tracers: collect timed events and flush them through a writer."""

    def initialize_writer(self, filename: str, writer: Any) -> None:
        """Prepares ``filename`` (e.g. writes a file header) before the first flush."""
        raise NotImplementedError(f"{type(self).__name__} must implement initialize_writer")

    def add_event(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Returns a context manager that records the ``with`` block as event ``name``."""
        raise NotImplementedError(f"{type(self).__name__} must implement add_event")

    def add_remote_event(self, name: str, value: Any) -> None:
        """Adds an event measured elsewhere (another thread or process)."""
        raise NotImplementedError(f"{type(self).__name__} must implement add_remote_event")

    def clear(self) -> None:
        """Drops the collected events."""
        raise NotImplementedError(f"{type(self).__name__} must implement clear")

    def flush(self, filename: str, writer: Any) -> None:
        """Writes the collected events to ``filename`` through ``writer``."""
        raise NotImplementedError(f"{type(self).__name__} must implement flush")

    def enable(self, enable_flag: bool) -> None:
        """Turns event collection on or off."""
        raise NotImplementedError(f"{type(self).__name__} must implement enable")

    def finalize(self) -> None:
        """Releases resources at the end of training."""
        raise NotImplementedError(f"{type(self).__name__} must implement finalize")

    def state_dict(self) -> dict[str, Any]:
        """Returns the tracer's state for snapshots."""
        raise NotImplementedError(f"{type(self).__name__} must implement state_dict")

    def load_state_dict(self, to_load: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_state_dict")


class DummyTracer(Tracer):
    """A tracer that records nothing (what ``trace=False`` uses)."""

    def initialize_writer(self, filename: str, writer: Any) -> None:
        """Does nothing."""

    def add_event(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Returns a no-op context manager."""
        return contextlib.nullcontext()

    def add_remote_event(self, name: str, value: Any) -> None:
        """Does nothing."""

    def clear(self) -> None:
        """Does nothing."""

    def flush(self, filename: str, writer: Any) -> None:
        """Does nothing."""

    def enable(self, enable_flag: bool) -> None:
        """Does nothing."""

    def finalize(self) -> None:
        """Does nothing."""

    def state_dict(self) -> dict[str, Any]:
        """Returns an empty state."""
        return {}

    def load_state_dict(self, to_load: dict[str, Any]) -> None:
        """Does nothing."""


class _ChromeSaveFun:
    """Serializes events as a Chrome trace: a JSON array, or array items when appending."""

    def __call__(self, target: list[dict[str, Any]], file_o: IO[bytes], append_mode: bool) -> None:
        if append_mode:
            text = "".join(f"\n{json.dumps(event, indent=4)}," for event in target)
        else:
            text = json.dumps(target, indent=4)
        file_o.write(text.encode("ascii"))

    def init(self, target: object, file_o: IO[bytes]) -> None:
        file_o.write(b"[")


def load_chrome_trace_as_json(filename: str) -> list[dict[str, Any]]:
    """Reads a trace written by :class:`ChromeTracer`, also an unterminated (appended) one.

    Args:
        filename: Path of the trace file.

    Returns:
        The list of events.
    """
    with open(filename) as f:
        text = f.read().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return cast(list[dict[str, Any]], json.loads(text))


_main_pid = os.getpid()
_enabled = True
_thread_local = threading.local()


class ChromeTracer(Tracer):
    """Collects complete (``"ph": "X"``) events for ``chrome://tracing`` / Perfetto.

    Events carry host wall-clock times; asynchronous device work shows up where it was issued.

    Args:
        max_event_count: Stop collecting after this many events; unlimited when None.
        enable: Collect events from the start.
        append: Write each flush as new array items of one file (started by
            :meth:`initialize_writer`) instead of rewriting the whole array.
    """

    def __init__(
        self, max_event_count: int | None = None, enable: bool = True, append: bool = True
    ) -> None:
        self._enable = enable
        self._event_list: list[dict[str, Any]] = []
        self._max_event_count: float = float("inf") if max_event_count is None else max_event_count
        self._event_count = 0
        self._append = append
        self._savefun = _ChromeSaveFun()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _event(self, name: str) -> Iterator[None]:
        begin_ns = time.perf_counter_ns()
        try:
            yield
        finally:
            duration_ns = time.perf_counter_ns() - begin_ns
            event = {
                "name": name,
                "cat": "",
                "ph": "X",
                "ts": begin_ns / 1000,
                "dur": duration_ns / 1000,
                "pid": os.getpid(),
                "tid": threading.get_native_id(),
            }
            self.add_remote_event(name, event)

    def add_event(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Records the ``with`` block as event ``name`` (a no-op while tracing is disabled)."""
        if not (self._enable and _enabled and getattr(_thread_local, "enable", True)):
            return contextlib.nullcontext()
        return self._event(name)

    def add_remote_event(self, name: str, event: dict[str, Any]) -> None:
        """Adds an event dictionary, counting it against ``max_event_count``."""
        with self._lock:
            if self._enable and self._event_count < self._max_event_count:
                self._event_count += 1
                self._event_list.append(event)

    def initialize_writer(self, filename: str, writer: Any) -> None:
        """Starts the trace file (an opening bracket) when appending."""
        if self._enable and self._append:
            writer(filename, "", {}, savefun=self._savefun.init, append=False)

    def flush(self, filename: str, writer: Any) -> None:
        """Writes the collected events; in append mode they are then dropped from memory."""
        if not self._enable:
            return
        with self._lock:
            events = list(self._event_list)
            if self._append:
                self._event_list.clear()
        writer.save(filename, "", events, self._savefun, self._append, append_mode=self._append)

    def enable(self, enable_flag: bool) -> None:
        """Turns collection on or off."""
        self._enable = enable_flag

    def state_dict(self) -> dict[str, Any]:
        """Returns PPE's keys: ``_enable``, ``_event_list`` (JSON), ``_max_event_count``,
        ``_event_count``."""
        with self._lock:
            return {
                "_enable": self._enable,
                "_event_list": json.dumps(self._event_list),
                "_max_event_count": self._max_event_count,
                "_event_count": self._event_count,
            }

    def load_state_dict(self, to_load: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`."""
        with self._lock:
            self._enable = to_load["_enable"]
            self._event_list = json.loads(to_load["_event_list"])
            self._max_event_count = to_load["_max_event_count"]
            self._event_count = to_load["_event_count"]

    def clear(self) -> None:
        """Drops the collected events and resets the count."""
        with self._lock:
            self._event_list = []
            self._event_count = 0

    def finalize(self) -> None:
        """Nothing to release: events live in this process."""


_tracer: Tracer | None = None
_tracer_lock = threading.Lock()


def get_tracer(tracer_cls: type[Tracer] = ChromeTracer, *params: Any) -> Tracer:
    """Returns the global tracer, creating it as ``tracer_cls(*params)`` on first use.

    Raises:
        TypeError: The global tracer exists and is not a ``tracer_cls``.
    """
    global _tracer
    with _tracer_lock:
        if _tracer is None:
            _tracer = tracer_cls(*params)
        tracer = _tracer
    if type(tracer) is not tracer_cls:
        raise TypeError(
            f"get_tracer({tracer_cls.__name__}) called, but the global tracer is a "
            f"{type(tracer).__name__}"
        )
    return tracer


def clear_tracer() -> None:
    """Drops the events of the global tracer."""
    get_tracer().clear()


def enable_global_trace(enable: bool) -> None:
    """Enables or disables :class:`ChromeTracer` events in every thread."""
    global _enabled
    _enabled = enable


def enable_thread_trace(enable: bool) -> None:
    """Enables or disables :class:`ChromeTracer` events in the calling thread only."""
    _thread_local.enable = enable


class TraceableDataset(torch.utils.data.Dataset[Any]):
    """Wraps a dataset so each ``__getitem__`` is traced as event ``tag``.

    Args:
        dataset: The dataset to wrap.
        tag: Event name.
        tracer: Tracer to record into; the global one by default.
    """

    def __init__(self, dataset: Any, tag: str, tracer: Tracer | None = None) -> None:
        super().__init__()
        self._dataset = dataset
        self._tag = tag
        self._tracer = get_tracer() if tracer is None else tracer

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, idx: Any) -> Any:
        with self._tracer.add_event(self._tag):
            return self._dataset[idx]
