"""The suite's ``dcp`` section: how long a snapshot of a ~150 MB per-rank state blocks the
training thread, and how much host memory the save takes, for ppe-core's DCP snapshot beside
its default snapshot with a background writer, a plain ``torch.save`` and raw DCP.

    .venv/bin/python -m benchmarks --only dcp          # 3 processes per variant
    .venv/bin/python -m benchmarks --only dcp --quick  # 1 process per variant

The state: ``Sequential`` of 3 ``Linear(2048, 2048)`` and AdamW with its state initialised
(weights, ``exp_avg``, ``exp_avg_sq``: 151 MB of float32). Each measurement runs in a fresh
process (so the first snapshot's host buffers are really allocated, not reused from an earlier
variant's freed memory) that joins a world of one gloo process (``init_process_group`` with a
``file://`` store in a temporary directory), trains batches of ``BATCH`` on one torch thread
and takes ``SNAPSHOTS`` snapshots, one every ``GAP`` iterations; before each snapshot it waits
until the previous one is written (outside the timed windows), so every snapshot is measured
alone, without back-pressure from the one before. The processes run interleaved (one of each
variant, then again), and the table gives median [min, max] over the snapshots after each
process's first; the first ("cold": buffers allocated, DCP's stager and group created) is
reported apart. DCP's modules are imported before training in every variant (ppe-core would
import them at its first DCP snapshot), and that import's time is shown on its own.

Blocked time, per snapshot: the time the training thread cannot change the parameters because
of the snapshot. It is the part on the snapshot's own iteration (from the end of that
iteration's optimizer step until the training thread may go on) plus any wait the next
optimizer step pays before it may change the parameters (DCP's background staging copy must
be done). Per variant:

- ``ppe-core DCP``: ``snapshot(snapshot_mode=SnapshotMode.DCP, saver_rank=0)`` under an
  ``ExtensionsManager``: the manager's end of iteration (its dispatch of the extension, the
  state taken, ``async_save``), timed around it, plus the next step's wait for staging in
  ppe-core's optimizer pre-hook (the growth of the extension's own ``blocked_times`` entry
  during that step). The extension's own ``blocked_time`` is shown beside it.
- ``ppe-core DEFAULT + ThreadWriter``: ``snapshot(writer=ThreadWriter())`` (the default mode;
  the manager's default writer is synchronous): the end of iteration, which copies the state to
  host buffers and hands them to the writer's thread; the next step waits for nothing.
- ``torch.save``: ``torch.save({"model": ..., "optimizer": ...})`` of the two state dicts on
  the training thread, to a local file (no ``fsync``).
- ``raw DCP``: ``async_save(state, async_stager=DefaultStager(StagingOptions(False, False,
  True, False)))`` on the default group, ``state`` from ``get_model_state_dict`` /
  ``get_optimizer_state_dict`` (as ppe-core takes it): the time until ``async_save`` returns,
  plus the time the next step waits on ``staging_completion`` before ``optimizer.step()``.

Host memory: the peak RSS from the snapshot's start until its files are written (the next
``GAP`` steps included) minus the RSS just before it. The kernel keeps the peak: it is reset
before each snapshot (``5`` to ``/proc/self/clear_refs``) and read afterwards (``VmHWM``);
where that reset is not allowed, a thread samples ``/proc/self/statm`` every 1 ms instead. The
first snapshot's peak includes the buffers the variant keeps for later snapshots; "held" is the
RSS after the last snapshot is written minus the RSS before the first. The no-snapshot row is
the same window without a save: its peak is what training alone adds (AdamW's temporaries).
The workers run with ``MALLOC_MMAP_THRESHOLD_`` fixed at glibc's default, so that every freed
large buffer goes back to the OS and RSS follows the live tensors (with the threshold glibc
raises as buffers are freed, freed memory was reused unseen and training alone moved the peak
by 0-85 MB between windows).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

#: Variant key -> the table's name for it (in the table's order).
VARIANTS = {
    "none": "no snapshot",
    "ppe-dcp": "ppe-core DCP (SnapshotMode.DCP)",
    "ppe-thread": "ppe-core DEFAULT + ThreadWriter",
    "torch-save": "torch.save, training thread",
    "raw-dcp": "raw DCP async_save + DefaultStager",
}

#: The model: ``LAYERS`` x ``Linear(WIDTH, WIDTH)``, trained on batches of ``BATCH`` rows.
WIDTH = 2048
LAYERS = 3
BATCH = 32

#: Iterations between snapshots (the first at iteration GAP; the steps before it warm up).
GAP = 3

#: Snapshots per process, the first of them cold.
SNAPSHOTS = 5

#: Worker processes per variant (``--quick``: 1).
PROCESSES = 3

#: A worker process's time limit, seconds.
WORKER_TIMEOUT = 300


@dataclass
class Snap:
    """One snapshot's measurements (seconds, bytes)."""

    blocked: float = 0.0
    waited: float = 0.0  # the part of ``blocked`` that the next optimizer step waited
    own_blocked: float | None = None  # ppe-core DCP's own blocked_times entry
    staged: float | None = None  # raw DCP: from the save's start until staging was done
    peak: int = 0
    step: float = 0.0  # mean training step (without the blocked time) while it was written


@dataclass
class Session:
    """What one worker process measured."""

    variant: str
    state_bytes: int
    rss_method: str
    snaps: list[Snap] = field(default_factory=list)
    held: int = 0
    dcp_import: float = 0.0  # importing DCP's modules, done before training in every variant


# --- host memory ------------------------------------------------------------------------------


def _rss() -> int:
    """The current RSS in bytes (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """The kernel's peak RSS (``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _reset_hwm() -> bool:
    """Resets the kernel's peak RSS to the current RSS; False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class PeakRss:
    """The peak RSS over a window: the kernel's ``VmHWM`` after a reset, else sampled by a
    thread every ``interval`` seconds (a 1 ms sampler can miss a shorter peak)."""

    def __init__(self, interval: float = 0.001) -> None:
        self.kernel = _reset_hwm()
        self.method = (
            "VmHWM reset by /proc/self/clear_refs"
            if self.kernel
            else f"/proc/self/statm sampled every {interval * 1e3:g} ms"
        )
        self._interval = interval
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Starts a window; returns the RSS at its start."""
        before = _rss()
        if self.kernel:
            _reset_hwm()
            return before
        self._peak = before
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return before

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss())
            time.sleep(self._interval)

    def stop(self) -> int:
        """Ends the window; returns its peak RSS."""
        if self.kernel:
            return max(_hwm(), _rss())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return max(self._peak, _rss())


# --- one worker process -----------------------------------------------------------------------


class _Saver:
    """One variant's way to snapshot (this base class: none). ``around()`` is the context of
    every iteration; ``save`` runs right after the snapshot iteration's optimizer step and
    ``after_save`` after that iteration's block; ``before_step`` runs just before each later
    optimizer step and ``after_step`` just after it (each returns the seconds the snapshot made
    that step wait); ``written`` waits until the snapshot's files are complete."""

    def around(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def save(self, iteration: int) -> None:
        pass

    def after_save(self) -> None:
        pass

    def before_step(self) -> float:
        return 0.0

    def after_step(self) -> float:
        return 0.0

    def written(self, iteration: int) -> None:
        pass

    def own_blocked(self) -> float | None:
        return None

    def staged(self) -> float | None:
        return None

    def close(self) -> None:
        pass


class _PpeSaver(_Saver):
    """ppe-core's snapshot extension under an ExtensionsManager; it runs when the manager's
    iteration ends (timed from the end of ``around()``'s block to its exit)."""

    def __init__(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        out: str,
        total: int,
        at: Sequence[int],
        dcp: bool,
    ) -> None:
        import ppe_core as ppe

        E = ppe.training.extensions
        self.out = out
        self.dcp = dcp
        self.manager = ppe.training.ExtensionsManager(
            model, opt, 1, iters_per_epoch=total, out_dir=out
        )
        # Any: ``blocked_times`` is the DCP snapshot's (snapshot() is typed as the base class).
        self.ext: Any
        if dcp:
            self.writer = None
            self.ext = E.snapshot(snapshot_mode=E.SnapshotMode.DCP, saver_rank=0)
        else:
            self.writer = ppe.writing.ThreadWriter()
            self.ext = E.snapshot(writer=self.writer)
        trigger = ppe.training.triggers.ManualScheduleTrigger(list(at), "iteration")
        self.manager.extend(self.ext, trigger=trigger)
        self._taken = 0.0  # the extension's blocked time as its save returned

    def around(self) -> AbstractContextManager[Any]:
        context: AbstractContextManager[Any] = self.manager.run_iteration()
        return context

    def after_save(self) -> None:
        # The manager ran the extension as the iteration's block exited.
        if self.dcp:
            self._taken = self.ext.blocked_times[-1][1]

    def after_step(self) -> float:
        """The wait ppe-core's optimizer pre-hook added to the step just taken (DCP's
        staging): the growth of the extension's own blocked time."""
        if not self.dcp or not self.ext.blocked_times:
            return 0.0
        now: float = self.ext.blocked_times[-1][1]
        waited, self._taken = now - self._taken, now
        return waited

    def written(self, iteration: int) -> None:
        if self.writer is not None:
            # ThreadWriter runs one job at a time: this one runs once the snapshot's is done.
            self.writer.submit(lambda: None).result()
            return
        path = os.path.join(self.out, f"snapshot_iter_{iteration}")
        _wait_for(lambda: os.path.isdir(path), f"DCP snapshot {path}")

    def own_blocked(self) -> float | None:
        if not self.dcp:
            return None
        blocked: float = self.ext.blocked_times[-1][1]
        return blocked


class _TorchSave(_Saver):
    """``torch.save`` of the model's and the optimizer's state dicts on the training thread:
    the synchronous reference."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, out: str) -> None:
        self.model, self.opt, self.out = model, opt, out

    def save(self, iteration: int) -> None:
        state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}
        torch.save(state, os.path.join(self.out, f"state_{iteration}.pt"))


class _RawDcp(_Saver):
    """DCP used directly: ``async_save`` with an unpinned, asynchronous ``DefaultStager`` (the
    staging ppe-core uses on a CPU-only machine); the training thread waits on
    ``staging_completion`` before the next optimizer step."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, out: str) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.model, self.opt, self.out = model, opt, out
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=False,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=False,
            )
        )
        self.response: Any = None
        self.staging: Any = None
        self._staged: list[float] = []

    def save(self, iteration: int) -> None:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )
        from torch.distributed.checkpoint.state_dict_saver import async_save

        state = {
            "model": get_model_state_dict(self.model),
            "optimizer": get_optimizer_state_dict(self.model, self.opt),
        }
        started = time.perf_counter()
        self.response = async_save(
            state,
            checkpoint_id=os.path.join(self.out, f"dcp_{iteration}"),
            async_stager=self.stager,
        )
        self.staging = self.response.staging_completion
        self.staging.add_done_callback(  # in the staging thread, or here if already done
            lambda _: self._staged.append(time.perf_counter() - started)
        )

    def before_step(self) -> float:
        if self.staging is None:
            return 0.0
        started = time.perf_counter()
        self.staging.result()
        self.staging = None
        return time.perf_counter() - started

    def written(self, iteration: int) -> None:
        self.response.upload_completion.result()

    def staged(self) -> float | None:
        return self._staged[-1]

    def close(self) -> None:
        self.stager.close()


def _wait_for(done: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Polls ``done`` every millisecond until it holds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not written after {timeout:.0f} s")
        time.sleep(0.001)


def run_worker(variant: str, snapshots: int, gap: int, tmp: str) -> Session:
    """Trains ``gap * (snapshots + 1)`` iterations in a world of one gloo process with a
    snapshot every ``gap`` iterations, measuring each (see the module's docstring)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", world_size=1, rank=0
    )
    try:
        # Imported before training in every variant, so that no first snapshot times it
        # (ppe-core imports DCP at its first DCP snapshot; a raw DCP script at its top). DCP
        # needs DTensor, which ppe-core imports as training starts: not part of the time.
        importlib.import_module("torch.distributed.tensor")
        started = time.perf_counter()
        for module in ("staging", "state_dict", "state_dict_saver"):
            importlib.import_module(f"torch.distributed.checkpoint.{module}")
        imported = time.perf_counter() - started
        session = _measure(variant, snapshots, gap, tmp)
        session.dcp_import = imported
        return session
    finally:
        dist.destroy_process_group()


def _measure(variant: str, snapshots: int, gap: int, tmp: str) -> Session:
    """The training loop of :func:`run_worker`: each snapshot's blocked time (its iteration's
    part, timed around the save, plus the next step's wait), peak RSS and the steps after it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(BATCH, WIDTH, generator=g) for _ in range(4)]
    at = [gap * (k + 1) for k in range(snapshots)]
    total = gap * (snapshots + 1)
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    saver: _Saver
    if variant in ("ppe-dcp", "ppe-thread"):
        saver = _PpeSaver(model, opt, out, total, at, dcp=variant == "ppe-dcp")
    elif variant == "torch-save":
        saver = _TorchSave(model, opt, out)
    elif variant == "raw-dcp":
        saver = _RawDcp(model, opt, out)
    else:
        saver = _Saver()
    peak = PeakRss()
    session = Session(variant, 0, peak.method)
    first_rss = before = 0
    current: Snap | None = None  # the snapshot being written
    started = 0.0
    steps: list[float] = []  # each step's time without what the snapshot made it wait
    for it in range(1, total + 1):
        with saver.around():
            step_started = time.perf_counter()
            opt.zero_grad()
            model(data[it % len(data)]).square().mean().backward()
            waited = saver.before_step()
            opt.step()
            waited += saver.after_step()
            steps.append(time.perf_counter() - step_started - waited)
            if current is not None:
                current.blocked += waited
                current.waited += waited
                if it - gap in at:  # its window ends once its files are written
                    saver.written(it - gap)
                    current.peak = peak.stop() - before
                    current.step = statistics.mean(steps[-gap:])
                    current.own_blocked = saver.own_blocked()
                    current.staged = saver.staged()
                    session.snaps.append(current)
                    session.held = _rss() - first_rss  # the buffers kept for the next one
                    current = None
            if it in at:
                if it == at[0]:
                    first_rss = _rss()
                    session.state_bytes = _state_bytes(model, opt)  # AdamW's state is set
                before = peak.start()
                current = Snap()
                started = time.perf_counter()
                saver.save(it)
        if current is not None and it in at:
            # The block's exit is done: for ppe-core, the manager's end of the iteration,
            # which ran the snapshot extension.
            current.blocked += time.perf_counter() - started
            saver.after_save()
    saver.close()
    return session


def _state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of the weights and the optimizer's tensors (what every variant saves)."""
    tensors = [*model.state_dict().values()]
    tensors += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


# --- the section ------------------------------------------------------------------------------


def _spawn(variant: str, snapshots: int, env: dict[str, str]) -> Session:
    """Runs one worker process; its last line of output is its :class:`Session` as JSON."""
    with tempfile.TemporaryDirectory(prefix="ppe-bench-dcp-") as tmp:
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            variant,
            "--snapshots",
            str(snapshots),
            "--tmp",
            tmp,
        ]
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT
        )
    if result.returncode != 0:
        raise RuntimeError(f"the {variant} worker failed:\n{result.stderr[-3000:]}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    snaps = [Snap(**s) for s in data.pop("snaps")]
    return Session(**data, snaps=snaps)


def _ms(values: Sequence[float]) -> str:
    import suite

    return suite.med_range(values, 1e3) + " ms"


def _mb(values: Sequence[float]) -> str:
    return f"{statistics.median(values) / 1e6:+.1f} MB"


def section_dcp(report: Any, args: argparse.Namespace) -> None:
    """Blocked time and peak host memory per snapshot of a 151 MB per-rank state, for
    ppe-core's DCP and default snapshots, ``torch.save`` and raw DCP (see the docstring)."""
    import suite

    if not sys.platform.startswith("linux"):
        report.add("dcp", "all", "n/a", "needs Linux (/proc/self for the RSS)")
        return
    env = suite._import_env()  # bytecode cached: each worker starts in ~2 s, not ~5 s
    env["OMP_NUM_THREADS"] = "1"
    # A fixed mmap threshold: glibc then returns each freed large buffer to the OS, so RSS
    # follows the live tensors. With its default (a threshold that rises as buffers are freed)
    # freed memory is reused unseen, and training alone moved the peak by 0-85 MB.
    env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    processes = 1 if args.quick else PROCESSES
    sessions: dict[str, list[Session]] = {v: [] for v in VARIANTS}
    for _ in range(processes):
        for variant in VARIANTS:  # interleaved: the host's load drifts alike for each
            sessions[variant].append(_spawn(variant, SNAPSHOTS, env))
    first = sessions["none"][0]
    report.add(
        "dcp",
        "state per rank",
        f"{first.state_bytes / 1e6:.1f} MB",
        f"{LAYERS} x Linear({WIDTH}, {WIDTH}) + AdamW state; world of 1 gloo process "
        f"(file:// store), 1 torch thread, batch {BATCH}; {processes} fresh process(es) per "
        f"variant, interleaved, {SNAPSHOTS} snapshots each, one every {GAP} it, each once the "
        f"previous one is written; peak RSS: {first.rss_method}",
    )
    warm: dict[str, list[float]] = {}
    for variant, name in VARIANTS.items():
        later = [s for session in sessions[variant] for s in session.snaps[1:]]
        cold = [session.snaps[0] for session in sessions[variant]]
        steps = [s.step for session in sessions[variant] for s in session.snaps]
        warm[variant] = [s.blocked for s in later]
        if variant == "none":
            report.add(
                "dcp",
                name,
                f"step {_ms(steps)}",
                f"training alone: peak RSS {_mb([s.peak for s in cold + later])} over the "
                f"same windows (AdamW's temporaries)",
            )
            continue
        detail = (
            f"blocked per snapshot after the first (next step's wait "
            f"{_ms([s.waited for s in later])}); first snapshot {_ms([s.blocked for s in cold])}"
            f"; peak RSS first {_mb([s.peak for s in cold])}, later "
            f"{_mb([s.peak for s in later])}, held {_mb([x.held for x in sessions[variant]])}; "
            f"the {GAP} steps after it {_ms(steps)}"
        )
        own = [s.own_blocked for s in later if s.own_blocked is not None]
        if own:
            detail += f"; its own blocked_time {_ms(own)}"
        staged = [s.staged for s in later if s.staged is not None]
        if staged:
            detail += f"; staging done {_ms(staged)} after the save began"
        report.add("dcp", name, _ms(warm[variant]), detail)
    ratio = statistics.median(warm["ppe-dcp"]) / statistics.median(warm["raw-dcp"])
    extra = statistics.median(warm["ppe-dcp"]) - statistics.median(warm["raw-dcp"])
    firsts = {v: statistics.median(s.snaps[0].blocked for s in sessions[v]) for v in VARIANTS}
    first_ratio = firsts["ppe-dcp"] / firsts["raw-dcp"]
    imports = [s.dcp_import for v in VARIANTS for s in sessions[v]]
    report.add(
        "dcp",
        "ppe-core DCP / raw DCP",
        f"{ratio:.2f}x",
        "median blocked time after the first snapshot; goal <= 2x: "
        + ("met" if ratio <= 2 else "NOT met")
        + f" ({extra * 1e3:+.1f} ms); first snapshots {first_ratio:.2f}x; importing "
        f"DCP's modules (before training, in no row; ppe-core does it at its first DCP "
        f"snapshot) {_ms(imports)}",
    )


def _main() -> None:
    p = argparse.ArgumentParser(description="one worker process of the dcp section")
    p.add_argument("--worker", choices=sorted(VARIANTS), required=True)
    p.add_argument("--snapshots", type=int, default=SNAPSHOTS)
    p.add_argument("--gap", type=int, default=GAP)
    p.add_argument("--tmp", required=True)
    args = p.parse_args()
    session = run_worker(args.worker, args.snapshots, args.gap, args.tmp)
    print(json.dumps(asdict(session)), flush=True)


if __name__ == "__main__":
    _main()
