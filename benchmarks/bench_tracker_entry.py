"""What one LogReport entry costs the training thread in a tracker's hand-over, timed per call.

    .venv/bin/python benchmarks/bench_tracker_entry.py              # both senders
    .venv/bin/python benchmarks/bench_tracker_entry.py --sender process

The suite's ``tracking`` section gives the per-step difference of a whole trainer with and
without a tracker, which moves by several us between runs on a shared VM; its callgrind rows
count instructions, which a cold cache turns into time at different rates. Here one trainer
runs ``LogReport(trigger=(1, "iteration"))`` and a no-op ``BaseTracker`` (a real sender
process or worker thread, a backend that accepts every batch), and the tracker's entry
listener (what LogReport calls per entry: the whole of the tracker's work on the training
thread: since 2026-12-06, the queue's own ``append``) is wrapped so that each call is timed
with ``time.perf_counter_ns``. Reported: the median and 90th percentile per call, each less
an empty pair of clock reads, and the same wrapper around a function that does nothing (the
floor of any Python listener; the entry is then queued outside the timed part). The window
starts after the tracker is sending (``LOG_SKIP`` steps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_log
import suite

import ppe_core as ppe
from ppe_core.training.extensions import LogReport

#: Steps timed after the window opens (one entry each).
STEPS = 2_000


def _nothing(entry: Any) -> None:
    return None


def time_listener(sender: str, *, floor: bool = False) -> list[int]:
    """Nanoseconds of each call of the tracker's entry listener minus its clock pair, one per
    entry of a ``STEPS``-step run with a no-op tracker on ``sender``; with ``floor``, of a
    function that does nothing in its place (the listener is then called untimed)."""
    samples: list[int] = []
    clock = time.perf_counter_ns
    original_add = LogReport.add_entry_listener

    def add(log: LogReport, listener: Callable[[Any], object]) -> None:
        timed_one = _nothing if floor else listener

        def timed(entry: Any) -> None:
            start = clock()
            timed_one(entry)
            end = clock()
            empty = clock()
            samples.append((end - start) - (clock() - empty))
            if floor:
                listener(entry)

        original_add(log, timed)

    LogReport.add_entry_listener = add  # type: ignore[method-assign]
    try:

        def extensions() -> list[Any]:
            log = ppe.training.extensions.LogReport(trigger=(1, "iteration"))
            tracker = bench_log.NoopTracker(sender=sender)
            return [log, tracker, bench_log._until_sending(tracker, bench_log.LOG_SKIP - 1)]

        with tempfile.TemporaryDirectory() as out:
            bench_log.timed_run(
                suite.batches(500, seed=4), STEPS, bench_log.LOG_SKIP, extensions, out
            )
    finally:
        LogReport.add_entry_listener = original_add  # type: ignore[method-assign]
    return samples[bench_log.LOG_SKIP :]


def _describe(samples: list[int]) -> str:
    ordered = sorted(samples)
    p90 = ordered[len(ordered) * 9 // 10]
    return f"median {statistics.median(ordered) / 1e3:.2f} us, p90 {p90 / 1e3:.2f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sender", choices=["process", "thread"], nargs="+")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    for sender in args.sender or ["process", "thread"]:
        took = time_listener(sender)
        floor = time_listener(sender, floor=True)
        print(f"{sender:8} listener {_describe(took)}; empty listener {_describe(floor)}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
