"""The suite's ``log`` and ``tracking`` sections: per-iteration logging by log length, and a
tracker's per-step cost beside LogReport alone.

    .venv/bin/python -m benchmarks --only log
    .venv/bin/python -m benchmarks --only tracking      # needs mlflow (plugins/ppe_mlflow)

``log``: per-step cost of ``LogReport(trigger=(1, "iteration"))`` in each format once its log
already holds 1k, 10k and 100k entries. The log is pre-filled the way a resumed run gets it:
LogReport's state (``load_state_dict``) holds N entries shaped like the run's own, so the
run's first entry rewrites the file whole (N + 1 entries, as after a resume) and every later
entry is added to that file. The timed window starts after that first write (at iteration
``LOG_SKIP``) and lasts ``LOG_WINDOW`` steps. Each run is paired with the same trainer
without LogReport (the per-step ``report`` in ``forward`` stays) by :func:`paired_run`: the
two train in two threads on one CPU and take turns every ``PAIR_BLOCK`` steps, so each block
of one is compared with the other's block of the same few milliseconds; the mean of a run's
block differences is what the log costs per step in that run, and the row gives the mean of
the runs' costs with its 95 % interval over runs (an A/A row, the same trainer on both sides,
shows what two identical trainers differ by). (Runs one after the other, as this section timed
before, compared minutes that this VM made faster or slower by tens of microseconds per
step.) The file is read back at the end to check it holds N + steps entries.

``tracking``: per-step time of LogReport alone and of LogReport + ``MLflowLogger`` against a
local ``mlflow server`` (SQLite store, a free port) that the section starts and stops, and of
LogReport + ``WandbLogger`` offline (when wandb is installed), each with its client on a thread
and in a sender process, in two settings: an entry every iteration (the worst case) and every
100 iterations (a realistic trigger), and in layouts of the CPUs: ``shared CPUs`` (training,
the tracker's threads, its sender process and the server on every CPU) and ``own core`` (the
training thread alone on the first CPU, everything else on the others, as on a machine with
cores to spare; only with two CPUs or more), and, for MLflow, a third: ``server paused`` (the
server's processes stopped with SIGSTOP during the timed window and resumed after it: the
server spends no CPU beside training and the tracker's client waits on its open request, so
what remains beside LogReport alone is the tracker's own work in the training process; the
queue holds the window's entries and they are sent after it). The timed window starts after the
first entry, once the tracker's run is open and its backlog sent (a sender process takes
seconds to start). Three clocks: the training thread's CPU time (``time.thread_time``: what the
step path pays), the process's CPU time (a worker thread's client included; a sender process's
not) and wall time. The tracker's cost is given per step and per entry. Then each tracker
is timed ``paired`` (:func:`paired_run`) with LogReport alone, the two trainers taking turns on
one CPU, in three layouts (the tracker's threads, sender process and the server on every CPU,
on the other CPUs, or the server paused), with an A/A row (LogReport alone on both sides): the
server's load falls on both trainers' blocks alike, so the paired difference is what the
tracker itself costs the training thread (the sequential layouts above show what a server on
the same two CPUs costs besides). ``--paired-steps`` sets the paired runs' length. Then, unless
``--quick`` or without valgrind, callgrind counts the instructions per step of the training
thread and of the process's other threads (``--separate-threads``) over 300 steps with an entry
each, for a no-op backend, W&B and MLflow on each sender. Skipped, saying so, when mlflow is
not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import torch
from ppe_extensions.tracking import BaseTracker

import ppe_core as ppe

#: Log lengths (entries already in the log) at which per-step cost is measured.
LOG_SIZES = (1_000, 10_000, 100_000)

#: The timed window: from iteration LOG_SKIP (after the first entry's whole rewrite) on.
LOG_SKIP = 50
LOG_WINDOW = 1_000

#: LogReport's entry interval (iterations) in the ``tracking`` section's two settings.
TRACKING_INTERVALS = (1, 100)

#: Format -> the LogReport filename that selects it.
LOG_FORMATS = {
    "json": "log",
    "json-lines": "log.jsonl",
    "csv": "log.csv",
    "yaml": "log.yaml",
}

#: (thread CPU, process CPU, wall) seconds at a point of a run.
Clocks = tuple[float, float, float]


def _clocks() -> Clocks:
    return time.thread_time(), time.process_time(), time.perf_counter()


def _per_step(start: Clocks, end: Clocks, steps: int) -> Clocks:
    return (
        (end[0] - start[0]) / steps,
        (end[1] - start[1]) / steps,
        (end[2] - start[2]) / steps,
    )


def prefilled_log(entries: int) -> list[dict[str, Any]]:
    """``entries`` entries shaped like the run's (``train/loss``, epoch, iteration, time)."""
    return [
        {
            "train/loss": 1.0 / (i + 1),
            "epoch": i // 500,
            "iteration": i + 1,
            "elapsed_time": 0.0003 * (i + 1),
        }
        for i in range(entries)
    ]


def timed_run(
    data: list[Any],
    steps: int,
    skip: int,
    extensions: Callable[[], list[Any]],
    out: str,
) -> tuple[Clocks, torch.nn.Module]:
    """Trains ``skip + steps`` steps of the suite's Tiny model with a per-step report and
    ``extensions()``; per-step clocks over the steps after ``skip``, and the model."""
    import suite

    torch.manual_seed(0)
    model = ppe.to(suite.Tiny(ppe.reporting.report), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    marks: list[Clocks] = []

    @ppe.training.make_extension(
        trigger=ppe.training.triggers.ManualScheduleTrigger([skip, skip + steps], "iteration"),
        priority=-1000,  # after every other extension of the step
    )
    def mark(manager: Any) -> None:
        marks.append(_clocks())

    epochs = -(-(skip + steps) // len(data))
    t = ppe.engine.create_trainer(
        model,
        opt,
        epochs,
        extensions=[mark, *extensions()],
        out_dir=out,
        stop_trigger=(skip + steps, "iteration"),
    )
    t.run(data)
    return _per_step(marks[0], marks[1], steps), model


#: Iterations each trainer of a paired run trains before the other takes its turn.
PAIR_BLOCK = 10


class _Turns:
    """Two trainers in two threads take turns: one trains while the other waits, so both are
    timed over the same seconds and a slow minute of the host slows both alike."""

    def __init__(self, first: int) -> None:
        self._cond = threading.Condition()
        self._turn = first
        self._done = [False, False]

    def wait(self, me: int) -> None:
        """Waits until it is trainer ``me``'s turn (or the other trainer has finished)."""
        with self._cond:
            while self._turn != me and not self._done[1 - me]:
                self._cond.wait()

    def hand_over(self, me: int, *, finished: bool = False) -> None:
        """Gives the turn to the other trainer."""
        with self._cond:
            self._turn = 1 - me
            self._done[me] = self._done[me] or finished
            self._cond.notify_all()


@dataclasses.dataclass
class PairedResult:
    """Per-step thread CPU and wall time of two trainers' blocks of :data:`PAIR_BLOCK` steps,
    block by block (``a[k]`` and ``b[k]`` ran one right after the other, in the order the run
    chose), and the models."""

    a: list[float]
    b: list[float]
    a_wall: list[float]
    b_wall: list[float]
    models: tuple[torch.nn.Module, torch.nn.Module]

    def differences(self, wall: bool = False) -> list[float]:
        """``b[k] - a[k]`` for every pair of blocks (seconds per step), of thread CPU or wall
        time (a block's wall time: only its trainer ran; the other waited)."""
        a, b = (self.a_wall, self.b_wall) if wall else (self.a, self.b)
        return [y - x for x, y in zip(a, b, strict=True)]

    def mean(self, wall: bool = False) -> float:
        """The run's per-step cost: the mean of :meth:`differences`."""
        return statistics.fmean(self.differences(wall))


def paired_run(
    data: list[Any],
    steps: int,
    skip: int,
    extensions: tuple[Callable[[], list[Any]], Callable[[], list[Any]]],
    outs: tuple[str, str],
    cpu: int | None = None,
    threads: set[int] | None = None,
    first: int = 0,
) -> PairedResult:
    """Trains two copies of the suite's Tiny model (a per-step report, the same seed and
    data), with ``extensions[0]()`` and ``extensions[1]()``, in two threads that take turns
    every :data:`PAIR_BLOCK` steps; per-step thread CPU of each block after ``skip``.

    Sequential runs compare minutes that the host may have made faster or slower by tens of
    microseconds per step; taking turns every few milliseconds pairs each block with one of
    the other trainer's that saw the same host, so the paired differences measure what the
    second set of extensions costs the training thread in this run (two identical trainers
    still differ by a few us for a whole run: compare runs, see :func:`paired_cell`).
    Both threads run on the same CPU (``cpu``, by default the first this process may use):
    on two CPUs of different speed, or one busier with interrupts, each thread would keep to
    its own and the difference would be the CPUs'. ``threads``, when given, receives the two
    threads' native ids (so that an extension can pin the process's other threads elsewhere).
    ``first`` (0 or 1) is the trainer that trains each pair's first block: the second one
    gains a little from following the first (an A/A run measured -2.4 us/step for the same
    trainer second), so callers alternate it between runs and the means over runs cancel it.
    """
    if cpu is None and hasattr(os, "sched_getaffinity"):
        cpu = min(os.sched_getaffinity(0))
    import suite

    if skip % PAIR_BLOCK or steps % PAIR_BLOCK:
        raise ValueError(f"skip and steps must be multiples of {PAIR_BLOCK}")
    turns = _Turns(first)
    last = skip + steps
    blocks: tuple[list[float], list[float]] = ([], [])
    walls: tuple[list[float], list[float]] = ([], [])
    models: list[Any] = [None, None]
    errors: list[BaseException] = []

    def train(me: int) -> None:
        if threads is not None:
            threads.add(threading.get_native_id())
        if cpu is not None:  # both on one CPU: neither gets the quieter of two
            os.sched_setaffinity(0, {cpu})
        turns.wait(me)
        started = [time.thread_time(), time.perf_counter()]
        try:

            @ppe.training.make_extension(trigger=(PAIR_BLOCK, "iteration"), priority=-2000)
            def take_turns(manager: Any) -> None:
                now = time.thread_time(), time.perf_counter()
                if manager.iteration > skip:
                    blocks[me].append((now[0] - started[0]) / PAIR_BLOCK)
                    walls[me].append((now[1] - started[1]) / PAIR_BLOCK)
                turns.hand_over(me)
                if manager.iteration < last:
                    turns.wait(me)
                    started[:] = time.thread_time(), time.perf_counter()

            torch.manual_seed(0)
            model = ppe.to(suite.Tiny(ppe.reporting.report), "cpu")
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            trainer = ppe.engine.create_trainer(
                model,
                opt,
                -(-last // len(data)),
                extensions=[take_turns, *extensions[me]()],
                out_dir=outs[me],
                stop_trigger=(last, "iteration"),
            )
            trainer.run(data)
            models[me] = model
        except BaseException as exc:  # reported by the caller's thread
            errors.append(exc)
        finally:
            turns.hand_over(me, finished=True)

    workers = [threading.Thread(target=train, args=(me,)) for me in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return PairedResult(*blocks, *walls, (models[0], models[1]))


#: Two-sided 95 % Student t quantiles by degrees of freedom (runs - 1), for intervals over
#: a handful of runs.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def runs_interval(means: list[float]) -> float:
    """Half-width of the 95 % interval of the mean of ``means`` (one value per run), or NaN
    for one run."""
    if len(means) < 2:
        return float("nan")
    t = _T95.get(len(means) - 1, 1.96)
    return t * statistics.stdev(means) / len(means) ** 0.5


def paired_cell(results: list[PairedResult], every: int = 1) -> tuple[str, str]:
    """A report row's value and detail for paired runs: the mean of the runs' mean
    differences with its 95 % interval *over runs*, then each run's mean, the block pairs'
    median and interval (taken as independent), wall time, the cost per entry and the step without.

    The run is the unit: two identical trainers paired in one run differ by a few us that
    stay for the run (the suite's A/A row measures it: memory layout, which CPU caches what),
    so the blocks of one run are not independent samples of the cost; the spread of the runs'
    means is the uncertainty."""
    means = [r.mean() for r in results]
    mean = statistics.fmean(means)
    wall = statistics.fmean(r.mean(wall=True) for r in results)
    diffs = [d for r in results for d in r.differences()]
    without = statistics.fmean(x for r in results for x in r.a)
    half = runs_interval(means)
    value = f"{mean * 1e6:+.1f} us/step thread CPU"
    if len(results) > 1:
        value = f"{mean * 1e6:+.1f} +/- {half * 1e6:.1f} us/step thread CPU"
    runs = ", ".join(f"{m * 1e6:+.1f}" for m in means)
    # Over every block pair as if independent: narrower than the runs say (see above).
    pairs = statistics.stdev(diffs) * 1.96 / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
    return (
        value,
        f"paired blocks: mean of {len(results)} run(s) (each run's mean: {runs}) +/- 95% "
        f"interval over runs; {len(diffs)} pairs of {PAIR_BLOCK}-step blocks, median "
        f"{statistics.median(diffs) * 1e6:+.1f}, +/- {pairs * 1e6:.1f} over the pairs; wall "
        f"{wall * 1e6:+.1f}; per entry {mean * every * 1e6:+.1f} us; without: "
        f"{without * 1e6:.1f} us/step (the difference is {mean / without * 100:+.1f}% of it)",
    )


def _count_entries(path: str, fmt: str) -> int:
    from ppe_core.training.extensions import LogReport

    if fmt == "yaml":  # reading 100k entries back through PyYAML takes minutes
        with open(path, encoding="utf-8") as file_obj:
            return sum(1 for line in file_obj if line.startswith("- "))
    return len(LogReport.read(path))


def section_log(report: Any, args: argparse.Namespace) -> None:
    """Per-step cost of per-iteration LogReport in each format at 1k, 10k and 100k entries."""
    import suite

    formats = dict(LOG_FORMATS)
    if importlib.util.find_spec("yaml") is None:
        del formats["yaml"]
        report.add("log", "yaml", "n/a", "PyYAML not installed (not measured)")
    window = LOG_WINDOW // 2 if args.quick else LOG_WINDOW
    repeats = 1 if args.quick else args.repeats
    data = suite.batches(500, seed=3)
    timed_run(data, 50, 10, list, tempfile.mkdtemp())  # warm-up: imports, lazy set-up
    results: dict[tuple[str, int], list[PairedResult]] = {}
    identical = True
    checked: dict[tuple[str, int], bool] = {}
    same: list[PairedResult] = []
    for run in range(repeats):
        first = run % 2  # which trainer goes first in each pair, alternated between runs
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            same.append(paired_run(data, window, LOG_SKIP, (list, list), (a, b), first=first))
        for fmt, filename in formats.items():
            for size in LOG_SIZES:
                prefill = prefilled_log(size)

                def with_log(filename: str = filename, prefill: list[Any] = prefill) -> list[Any]:
                    log = ppe.training.extensions.LogReport(
                        trigger=(1, "iteration"), filename=filename
                    )
                    log.load_state_dict({"_log": prefill})
                    return [log]

                outs = (tempfile.mkdtemp(), tempfile.mkdtemp())
                try:
                    result = paired_run(data, window, LOG_SKIP, (list, with_log), outs, first=first)
                    total = _count_entries(os.path.join(outs[1], filename), fmt)
                finally:
                    for out in outs:
                        shutil.rmtree(out, ignore_errors=True)
                checked[fmt, size] = checked.get((fmt, size), True) and (
                    total == size + LOG_SKIP + window
                )
                identical &= suite.same_weights(*result.models)
                results.setdefault((fmt, size), []).append(result)
    bare = [statistics.median(r.a) for rs in results.values() for r in rs]
    report.add(
        "log",
        "trainer, no LogReport",
        f"{suite.med_range(bare, 1e6)} us/step thread CPU",
        f"steps {LOG_SKIP + 1}-{LOG_SKIP + window} of each run, taking turns every "
        f"{PAIR_BLOCK} steps with the same trainer with LogReport (paired_run), {repeats} "
        "run(s) per cell; LogReport changes no weight: "
        + ("bit-identical" if identical else "DIFFER"),
    )
    value, detail = paired_cell(same)
    report.add(
        "log",
        "the same trainer on both sides (A/A)",
        value,
        detail + "; what two identical trainers differ by: the method's noise",
    )
    for fmt in formats:
        means = []
        for size in LOG_SIZES:
            runs = results[fmt, size]
            value, detail = paired_cell(runs)
            means.append(statistics.fmean(r.mean() for r in runs))
            report.add(
                "log",
                f"LogReport {fmt}, {size // 1000}k entries",
                value,
                detail
                + "; file holds "
                + (
                    f"{size:,} + {LOG_SKIP + window:,} entries"
                    if checked[fmt, size]
                    else "A DIFFERENT NUMBER of entries"
                ),
            )
        report.add(
            "log",
            f"LogReport {fmt}, 100k / 1k",
            f"{means[-1] / means[0]:.2f}x",
            "ratio of the mean per-step costs (1.00 = flat); goal: flat and under 50 us/step",
        )


# --- tracking -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    """``mlflow server`` over SQLite in ``root`` on a free port, in its own process group."""

    def __init__(self, root: str) -> None:
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        log_path = os.path.join(root, "server.log")
        command = [sys.executable, "-m", "mlflow", "server"]
        command += ["--backend-store-uri", f"sqlite:///{os.path.join(root, 'db')}"]
        command += ["--artifacts-destination", os.path.join(root, "artifacts")]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                with open(log_path, encoding="utf-8", errors="replace") as file_obj:
                    raise RuntimeError(f"mlflow server exited:\n{file_obj.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise RuntimeError("mlflow server did not start in 120 s")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server's processes have used so far: every live
        process of its process group, read from ``/proc`` (0.0 where there is none)."""
        total = 0
        for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8") as file_obj:
                    fields = file_obj.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.process.pid:  # its process group
                total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
        return total / os.sysconf("SC_CLK_TCK") if total else 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def _tracker_variants(uri: str, root: str) -> dict[str, Callable[[], Any] | None]:
    """Row name -> a new tracker (None: LogReport alone): MLflowLogger against the local
    server and, when wandb is installed, WandbLogger offline, each on a thread and in a
    sender process."""
    from ppe_mlflow import MLflowLogger

    variants: dict[str, Callable[[], Any] | None] = {"LogReport alone": None}
    for sender in ("thread", "process"):

        def mlflow(sender: str = sender) -> Any:
            return MLflowLogger(uri, experiment_name="bench", sender=sender)

        variants[f"MLflowLogger, {sender}"] = mlflow
    if importlib.util.find_spec("wandb") is not None:
        from ppe_wandb import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        for sender in ("thread", "process"):

            def wandb(sender: str = sender) -> Any:
                return WandbLogger(project="bench", dir=root, mode="offline", sender=sender)

            variants[f"WandbLogger offline, {sender}"] = wandb
    return variants


def _tracking_skip(every: int) -> int:
    """Steps before the timed window of the ``tracking`` section: past the first entry (the
    run opens, a sender process starts, at the first entry), then LOG_SKIP more."""
    return LOG_SKIP if every == 1 else every + LOG_SKIP


def _until_sending(tracker: Any, iteration: int) -> Any:
    """An extension that waits, at ``iteration`` (before the timed window), until the
    tracker's run is open and what it queued is sent: the window times the steady state,
    not the sender starting (a sender process imports torch: seconds)."""

    @ppe.training.make_extension(
        trigger=ppe.training.triggers.ManualScheduleTrigger([iteration], "iteration"),
        priority=-1000,
    )
    def until_sending(manager: Any) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            counts = tracker.report
            if counts.params_sent and counts.sent + counts.failed >= counts.queued:
                return
            time.sleep(0.01)

    return until_sending


def _pin_process(pid: int, cpus: set[int]) -> None:
    """Pins every thread of process ``pid`` and of its descendants to ``cpus``."""
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            with open(f"/proc/{pid}/task/{tid}/children", encoding="utf-8") as file_obj:
                children = [int(child) for child in file_obj.read().split()]
        except OSError:
            continue
        for child in children:
            _pin_process(child, cpus)


def _own_core_layout() -> tuple[set[int], set[int]] | None:
    """(the training thread's CPU, every other CPU) for the ``own core`` layout, or None on
    a machine with one CPU (or without sched_setaffinity)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[0]}, set(cpus[1:])


def _place_tracker(tracker: Any, iteration: int, keep: set[int], cpus: set[int]) -> Any:
    """An extension that, at ``iteration`` (before the timed window, after the tracker is
    sending), moves every thread of this process but those in ``keep`` (native ids: the
    training thread or a paired run's two), and the tracker's sender process, to ``cpus``.

    Threads and processes a pinned trainer starts inherit its CPU; the layouts choose where
    the tracker's work runs instead. ``keep`` is read when the extension runs."""

    @ppe.training.make_extension(
        trigger=ppe.training.triggers.ManualScheduleTrigger([iteration], "iteration"),
        priority=-1001,  # after _until_sending
    )
    def place_tracker(manager: Any) -> None:
        for tid in os.listdir("/proc/self/task"):
            if int(tid) not in keep:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cpus)
        pid = getattr(tracker, "sender_pid", None)
        if pid is not None:
            _pin_process(pid, cpus)

    return place_tracker


def _take_own_core(tracker: Any, iteration: int, layout: tuple[set[int], set[int]]) -> Any:
    """An extension that, at ``iteration`` (before the timed window, after the tracker is
    sending), gives the training thread a CPU of its own: the process's other threads and the
    tracker's sender process (with the server, pinned by the section) run on the others, as
    on a machine with spare cores."""
    mine, others = layout
    keep: set[int] = set()
    place = _place_tracker(tracker, iteration, keep, others)

    @ppe.training.make_extension(
        trigger=ppe.training.triggers.ManualScheduleTrigger([iteration], "iteration"),
        priority=-1001,  # after _until_sending
    )
    def take_own_core(manager: Any) -> None:
        keep.add(threading.get_native_id())
        os.sched_setaffinity(0, mine)  # this (the training) thread
        place(manager)

    return take_own_core


def _pause_server(server: MlflowServer, start: int, end: int) -> Any:
    """An extension that stops the server's processes (SIGSTOP) at iteration ``start``, just
    before the timed window, and lets them go on (SIGCONT) at ``end``, once it is read: the
    ``server paused`` layout, where the server spends no CPU during the window while the
    tracker queues and its client waits on the open request."""

    @ppe.training.make_extension(
        trigger=ppe.training.triggers.ManualScheduleTrigger([start, end], "iteration"),
        priority=-999,  # before the window's mark at ``start``; the window ends at ``end``
    )
    def pause_server(manager: Any) -> None:
        paused = manager.iteration == start
        os.killpg(server.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    return pause_server


def section_tracking(report: Any, args: argparse.Namespace) -> None:
    """Per-step time of LogReport + a tracker (MLflowLogger against a local server, W&B
    offline), on a thread and in a sender process, beside LogReport alone, with an entry
    every iteration and every 100 iterations."""
    import suite

    if importlib.util.find_spec("mlflow") is None or importlib.util.find_spec("ppe_mlflow") is None:
        report.add(
            "tracking",
            "MLflowLogger",
            "skipped",
            "mlflow is not installed: pip install -e plugins/ppe_mlflow",
        )
        return

    steps = 1_000 if args.quick else 2_000
    # Paired runs resolve about 2 us with 600 block pairs: --paired-steps buys more pairs.
    paired_steps = getattr(args, "paired_steps", None) or steps
    if paired_steps % PAIR_BLOCK:
        raise SystemExit(f"--paired-steps must be a multiple of {PAIR_BLOCK}")
    repeats = 1 if args.quick else min(args.repeats, 3)
    data = suite.batches(500, seed=4)
    root = tempfile.mkdtemp()
    started = time.perf_counter()
    server = MlflowServer(root)
    startup = time.perf_counter() - started
    factories = _tracker_variants(server.uri, root)
    trackers: dict[tuple[str, int, str], list[Any]] = {}

    own_core = _own_core_layout()
    layouts = ["shared CPUs"] + (["own core"] if own_core is not None else []) + ["server paused"]
    every_cpu = set(os.sched_getaffinity(0)) if own_core is not None else set()

    def variant(layout: str, every: int, name: str) -> Callable[[], list[Any]]:
        def extensions() -> list[Any]:
            log = ppe.training.extensions.LogReport(trigger=(every, "iteration"))
            factory = factories[name]
            tracker = None if factory is None else factory()
            chosen: list[Any] = [log]
            if tracker is not None:
                trackers.setdefault((layout, every, name), []).append(tracker)
                chosen += [tracker, _until_sending(tracker, _tracking_skip(every) - 1)]
            if layout == "server paused":
                skip = _tracking_skip(every)
                chosen.append(_pause_server(server, skip, skip + steps))
            if layout == "own core":
                assert own_core is not None
                chosen.append(_take_own_core(tracker, _tracking_skip(every) - 1, own_core))
            return chosen

        return extensions

    def label(every: int) -> str:
        return "entry every iteration" if every == 1 else f"entry every {every} iterations"

    variants = {
        (layout, every, name): variant(layout, every, name)
        for layout in layouts
        for every in TRACKING_INTERVALS
        for name in factories
        # W&B runs offline: pausing the MLflow server changes nothing for it.
        if layout != "server paused" or not name.startswith("WandbLogger")
    }
    clocks: dict[tuple[str, int, str], list[Clocks]] = {key: [] for key in variants}

    trainer_threads: set[int] = set()  # the paired runs' training threads
    every_cpu_or_all = every_cpu or set(os.sched_getaffinity(0))
    paired_layouts = {"paired, shared CPUs": every_cpu_or_all}
    if own_core is not None:
        paired_layouts["paired, own core"] = own_core[1]
    paired_layouts["paired, server paused"] = every_cpu_or_all

    # The paired rows also time the tracker base alone: a no-op backend in a sender process
    # (the hand-over, the pump thread, the pipe and the child, without a client or server).
    paired_factories: dict[str, Callable[[], Any] | None] = {
        **factories,
        "no-op backend, process": lambda: NoopTracker(sender="process"),
    }

    def paired_variant(layout: str, every: int, name: str) -> Callable[[], list[Any]]:
        def extensions() -> list[Any]:
            log = ppe.training.extensions.LogReport(trigger=(every, "iteration"))
            tracker = paired_factories[name]()  # type: ignore[misc]
            trackers.setdefault((layout, every, name), []).append(tracker)
            skip = _tracking_skip(every)
            place = _place_tracker(tracker, skip - 1, trainer_threads, paired_layouts[layout])
            chosen = [log, tracker, _until_sending(tracker, skip - 1), place]
            if layout == "paired, server paused":
                chosen.append(_pause_server(server, skip, skip + paired_steps))
            return chosen

        return extensions

    # Each tracker beside LogReport alone, taking turns every few steps (paired_run): what
    # the tracker costs the training thread. Both trainers share one CPU; the tracker's
    # threads, sender process and the server run on every CPU (shared) or on the others (own
    # core), or the server is stopped for the window (server paused, MLflow only).
    alone = {
        every: variant("shared CPUs", every, "LogReport alone") for every in TRACKING_INTERVALS
    }
    paired_variants = {
        (layout, every, name): paired_variant(layout, every, name)
        for layout in paired_layouts
        for every in TRACKING_INTERVALS
        for name in paired_factories
        if name != "LogReport alone"
        and (layout != "paired, server paused" or name.startswith("MLflowLogger"))
    }
    paired: dict[tuple[str, int, str], list[PairedResult]] = {key: [] for key in paired_variants}
    same: list[PairedResult] = []  # LogReport alone on both sides (A/A): the method's noise
    # The local server's CPU time over the MLflow runs, and the entries they sent it.
    server_cpu = 0.0
    try:
        for name in factories:  # warm-up: imports, the server's first requests
            timed_run(
                data, 200, LOG_SKIP, variant("shared CPUs", 1, name), tempfile.mkdtemp(dir=root)
            )
        trackers.clear()
        for _ in range(repeats):
            for key, extensions in variants.items():  # interleaved: each set in the same minute
                if own_core is not None:  # the server shares the CPUs, or leaves training its own
                    _pin_process(
                        server.process.pid, own_core[1] if key[0] == "own core" else every_cpu
                    )
                out = tempfile.mkdtemp(dir=root)
                server_before = server.cpu_seconds()
                try:
                    per_step, _ = timed_run(data, steps, _tracking_skip(key[1]), extensions, out)
                finally:
                    if own_core is not None:
                        os.sched_setaffinity(0, every_cpu)
                clocks[key].append(per_step)
                if key[2].startswith("MLflowLogger"):
                    server_cpu += server.cpu_seconds() - server_before
        for run in range(1 if args.quick else args.repeats):
            first = run % 2  # which trainer goes first in each pair, alternated between runs
            if own_core is not None:
                _pin_process(server.process.pid, every_cpu)
            outs = (tempfile.mkdtemp(dir=root), tempfile.mkdtemp(dir=root))
            pair = (alone[1], alone[1])
            same.append(paired_run(data, paired_steps, _tracking_skip(1), pair, outs, first=first))
            for key, extensions in paired_variants.items():
                if own_core is not None:
                    _pin_process(server.process.pid, paired_layouts[key[0]])
                outs = (tempfile.mkdtemp(dir=root), tempfile.mkdtemp(dir=root))
                pair = (alone[key[1]], extensions)
                trainer_threads.clear()
                paired[key].append(
                    paired_run(
                        data,
                        paired_steps,
                        _tracking_skip(key[1]),
                        pair,
                        outs,
                        None,
                        trainer_threads,
                        first,
                    )
                )
        counted = None if args.quick or not shutil.which("valgrind") else server.uri
        instructions = tracking_instructions(counted) if counted else {}
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    for (layout, every, name), values in clocks.items():
        row = name if name == "LogReport alone" else f"LogReport + {name}"
        report.add(
            "tracking",
            f"{row}, {label(every)}, {layout}",
            f"{suite.med_range([v[0] for v in values], 1e6)} us/step thread CPU",
            f"process CPU {suite.med_range([v[1] for v in values], 1e6)}, wall "
            f"{suite.med_range([v[2] for v in values], 1e6)}; {steps} steps, "
            f"{steps // every} entries, {repeats} run(s)",
        )
    for (layout, every, name), values in clocks.items():
        if name == "LogReport alone":
            continue
        pairs = zip(values, clocks[layout, every, "LogReport alone"], strict=True)
        gap = [(t[0] - a[0], t[1] - a[1], t[2] - a[2]) for t, a in pairs]
        sent = [tracker.report for tracker in trackers.get((layout, every, name), [])]
        report.add(
            "tracking",
            f"{name} over LogReport alone, {label(every)}, {layout}",
            f"+{suite.med_range([g[0] for g in gap], 1e6)} us/step thread CPU",
            f"per entry +{suite.med_range([g[0] * every for g in gap], 1e6)} us; process CPU "
            f"+{suite.med_range([g[1] for g in gap], 1e6)} us/step (the sender process not "
            f"in it), wall +{suite.med_range([g[2] for g in gap], 1e6)}; goal: within 1 "
            "us/step of LogReport alone; entries sent "
            + ", ".join(f"{r.sent}/{r.queued}" for r in sent)
            + f"; server started in {startup:.0f} s",
        )
    if same:
        value, detail = paired_cell(same)
        report.add(
            "tracking",
            "LogReport alone on both sides (A/A), entry every iteration, paired",
            value,
            detail + "; what two identical trainers differ by, the server running: the noise",
        )
    for (layout, every, name), results in paired.items():
        value, detail = paired_cell(results, every)
        sent = [tracker.report for tracker in trackers.get((layout, every, name), [])]
        report.add(
            "tracking",
            f"{name} over LogReport alone, {label(every)}, {layout}",
            value,
            detail
            + "; goal: within 1 us/step of LogReport alone; entries sent "
            + ", ".join(f"{r.sent}/{r.queued}" for r in sent),
        )
    received = sum(
        tracker.report.sent
        for (layout, _, name), made in trackers.items()
        if name.startswith("MLflowLogger") and not layout.startswith("paired")  # sequential
        for tracker in made
    )
    if received and server_cpu:
        step = statistics.median(v[0] for v in clocks["shared CPUs", 1, "LogReport alone"])
        report.add(
            "tracking",
            "local mlflow server, CPU per entry received",
            f"{server_cpu / received * 1e6:,.0f} us",
            f"{server_cpu:.1f} s CPU for {received:,} entries over the MLflow runs (its "
            f"processes, from /proc): with an entry every iteration the server needs "
            f"{server_cpu / received / step:.1f}x a training step's thread CPU (LogReport "
            "alone) for each step's entry, on the CPUs training runs on",
        )
    alone = instructions.pop("alone", (0, 0))[0]
    for name, (main, others) in instructions.items():
        report.add(
            "tracking",
            f"{name} over LogReport alone, callgrind, entry every iteration",
            f"+{main - alone:,} instructions/step on the training thread",
            f"the process's other threads {others:,}/step (a sender process's own not "
            f"counted); {TRACKING_COUNTED_STEPS} steps counted",
        )


# --- tracking, in instructions ----------------------------------------------------------------

#: Steps counted by callgrind in the ``tracking`` section's instruction rows.
TRACKING_COUNTED_STEPS = 300

_TRACKING_INSTRUCTIONS_CHILD = """
import sys
sys.path.insert(0, {here!r})
import torch
torch.set_num_threads(1)
import bench_log
bench_log.counted_tracking_run(sys.argv[1], sys.argv[2], sys.argv[3])
"""


class NoopTracker(BaseTracker):
    """A backend that accepts every batch: what the training process pays, without a
    client (an importable class, so that it can run in a sender process)."""

    def open_run(self, run_id: str | None) -> str:
        return run_id or "noop"

    def log_metrics(self, entries: Any) -> None:
        return None


def counted_tracking_run(backend: str, sender: str, root: str) -> None:
    """Trains under callgrind with instrumentation on for ``TRACKING_COUNTED_STEPS`` steps
    (after the tracker is sending), LogReport at every iteration and a tracker on ``sender``:
    ``NoopTracker`` (``backend`` ``"noop"``), ``WandbLogger`` offline under ``root``
    (``"wandb"``) or ``MLflowLogger`` against the server at ``backend`` (a URI);
    ``"alone"``: none."""
    import suite

    def make_tracker() -> BaseTracker:
        if backend == "noop":
            return NoopTracker(sender=sender)
        if backend == "wandb":
            from ppe_wandb import WandbLogger

            return WandbLogger(project="bench", dir=root, mode="offline", sender=sender)
        from ppe_mlflow import MLflowLogger

        return MLflowLogger(backend, experiment_name="counted", sender=sender)

    def toggle(manager: Any) -> None:
        on = manager.iteration == LOG_SKIP
        subprocess.run(
            ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
            capture_output=True,
            check=False,
        )

    def extensions() -> list[Any]:
        counted = ppe.training.triggers.ManualScheduleTrigger(
            [LOG_SKIP, LOG_SKIP + TRACKING_COUNTED_STEPS], "iteration"
        )
        switch = ppe.training.make_extension(trigger=counted, priority=-1001)(toggle)
        log = ppe.training.extensions.LogReport(trigger=(1, "iteration"))
        if sender == "alone":
            return [log, switch]
        tracker = make_tracker()
        return [log, tracker, _until_sending(tracker, LOG_SKIP - 1), switch]

    data = suite.batches(500, seed=4)
    with tempfile.TemporaryDirectory() as out:
        timed_run(data, TRACKING_COUNTED_STEPS, LOG_SKIP, extensions, out)


def tracking_instructions(mlflow_uri: str | None) -> dict[str, tuple[int, int]]:
    """Variant -> (instructions of the training thread, of the process's other threads)
    per step, counted by callgrind (``--separate-threads``) over the counted steps: LogReport
    alone, then each backend (no-op, W&B offline when installed, MLflow at ``mlflow_uri``)
    on a thread and in a sender process (whose own instructions are not counted)."""
    backends = ["noop"]
    if importlib.util.find_spec("wandb") is not None:
        backends.append("wandb")
    if mlflow_uri is not None:
        backends.append(mlflow_uri)
    variants = [("alone", "alone")]
    variants += [(b, sender) for b in backends for sender in ("thread", "process")]
    here = os.path.dirname(os.path.abspath(__file__))
    counts: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w", encoding="utf-8") as file_obj:
            file_obj.write(_TRACKING_INSTRUCTIONS_CHILD.format(here=here))
        for number, (backend, sender) in enumerate(variants):
            prefix = os.path.join(tmp, f"cg-{number}.out")
            command = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
            command += ["--separate-threads=yes", f"--callgrind-out-file={prefix}"]
            subprocess.run(
                [*command, sys.executable, script, backend, sender, tmp],
                capture_output=True,
                text=True,
                check=True,
            )
            per_thread: dict[int, int] = {}
            for name in os.listdir(tmp):
                match = re.fullmatch(re.escape(f"cg-{number}.out") + r"-(\d+)", name)
                if not match:
                    continue
                with open(os.path.join(tmp, name), encoding="utf-8") as file_obj:
                    total = re.search(r"^totals: (\d+)", file_obj.read(), re.M)
                per_thread[int(match[1])] = int(total[1]) if total else 0
            main = per_thread.pop(1, 0)
            name = "mlflow" if backend == mlflow_uri else backend
            counts[name if sender == "alone" else f"{name}, {sender}"] = (
                main // TRACKING_COUNTED_STEPS,
                sum(per_thread.values()) // TRACKING_COUNTED_STEPS,
            )
    return counts
