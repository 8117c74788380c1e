"""Profiling helpers (PPE's ``ppe.profiler``): timed sections, the time summary, tracers."""

from __future__ import annotations

from ppe_core._record import record, record_function, record_iterable
from ppe_core._time_summary import TimeSummary, get_time_summary
from ppe_core._tracing import (
    ChromeTracer,
    TraceableDataset,
    Tracer,
    clear_tracer,
    enable_global_trace,
    enable_thread_trace,
    get_tracer,
    load_chrome_trace_as_json,
)

__all__ = [
    "ChromeTracer",
    "TimeSummary",
    "TraceableDataset",
    "Tracer",
    "clear_tracer",
    "enable_global_trace",
    "enable_thread_trace",
    "get_time_summary",
    "get_tracer",
    "load_chrome_trace_as_json",
    "record",
    "record_function",
    "record_iterable",
]
