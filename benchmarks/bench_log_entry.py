"""What one per-iteration LogReport entry costs the training thread, measured apart.

    .venv/bin/python benchmarks/bench_log_entry.py                  # CPU time per entry
    .venv/bin/python benchmarks/bench_log_entry.py --instructions   # + callgrind counts

The suite's ``log`` section gives the per-step difference of a whole trainer with and without
LogReport, which moves by about 10 us between runs on a shared VM. Here two
``ExtensionsManager`` runs over a ``Linear(4, 1)`` with SGD live in one process: one with
``LogReport(trigger=(1, "iteration"))``, one with the same LogReport whose ``_emit`` (the
entry: means, the write) does nothing, so both accumulate the per-step observation. They run
in alternating blocks of 100 steps; each block pair's difference of training-thread CPU time
(``time.thread_time``) over 100 is one sample of the per-entry cost, reported as median
[min, max]. ``--instructions`` also counts user-space instructions per entry under valgrind's
callgrind (instrumentation switched on around 500 steps of each run, in two processes; the
difference over 500): exact, but blind to system-call time in the kernel.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

#: Format -> the LogReport filename that selects it.
FORMATS = {"json": "log", "json-lines": "log.jsonl", "csv": "log.csv", "yaml": "log.yaml"}

#: Steps per block, and steps run before measuring (the first entry rewrites the file whole).
BLOCK = 100
WARMUP = 50

#: Steps counted under callgrind.
COUNTED = 500


def make_run(fmt: str, bare: bool) -> Callable[[], None]:
    """One training step of a fresh manager with a per-iteration LogReport in ``fmt``
    (``_emit`` a no-op when ``bare``), already warmed up."""
    import torch
    import torch.nn.functional as F

    from ppe_core.reporting import report
    from ppe_core.training import ExtensionsManager
    from ppe_core.training.extensions import LogReport

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    log_report = LogReport(trigger=(1, "iteration"), filename=FORMATS[fmt])
    if bare:
        log_report._emit = lambda manager: None  # type: ignore[method-assign]
    manager = ExtensionsManager(
        model,
        optimizer,
        10**9,
        iters_per_epoch=1000,
        out_dir=tempfile.mkdtemp(),
        extensions=[log_report],
    )
    x, t = torch.randn(8, 4), torch.randn(8, 1)

    def step() -> None:
        with manager.run_iteration(step_optimizers=["main"]):
            loss = F.mse_loss(model(x), t)
            loss.backward()  # type: ignore[no-untyped-call]
            report({"train/loss": loss})

    for _ in range(WARMUP):
        step()
    return step


def cpu_per_entry(fmt: str, blocks: int) -> list[float]:
    """Per-entry training-thread CPU seconds, one sample per block pair."""
    logged, bare = make_run(fmt, False), make_run(fmt, True)
    samples = []
    for _ in range(blocks):
        start = time.thread_time()
        for _ in range(BLOCK):
            logged()
        middle = time.thread_time()
        for _ in range(BLOCK):
            bare()
        end = time.thread_time()
        samples.append(((middle - start) - (end - middle)) / BLOCK)
    return samples


def _counted_child(fmt: str, bare: bool) -> None:
    """Under callgrind: instrumentation on around ``COUNTED`` steps only."""
    import torch

    torch.set_num_threads(1)
    step = make_run(fmt, bare)
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], capture_output=True, check=False)
    for _ in range(COUNTED):
        step()
    subprocess.run(["callgrind_control", "-i", "off", pid], capture_output=True, check=False)


def instructions_per_entry(fmt: str) -> float:
    """User-space instructions per entry: (logged run - bare run) / ``COUNTED``."""
    counts = []
    for bare in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            command = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
            command += [f"--callgrind-out-file={tmp}/cg.out", sys.executable, __file__]
            command += ["--child", fmt] + (["--bare"] if bare else [])
            err = subprocess.run(command, capture_output=True, text=True, check=True).stderr
        match = re.search(r"Collected : (\d+)", err)
        assert match, err
        counts.append(int(match.group(1)))
    return (counts[0] - counts[1]) / COUNTED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["json", "json-lines", "csv", "yaml"])
    parser.add_argument("--blocks", type=int, default=30, help="block pairs per format")
    parser.add_argument("--instructions", action="store_true", help="also count (valgrind)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _counted_child(args.child, args.bare)
        return
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    for fmt in args.formats:
        if fmt == "yaml":
            import importlib.util

            if importlib.util.find_spec("yaml") is None:
                print("yaml: PyYAML not installed (not measured)")
                continue
        samples = cpu_per_entry(fmt, args.blocks)
        line = (
            f"{fmt:10s} {statistics.median(samples) * 1e6:6.1f} "
            f"[{min(samples) * 1e6:.1f}, {max(samples) * 1e6:.1f}] us/entry thread CPU"
        )
        if args.instructions:
            line += f", {instructions_per_entry(fmt) / 1e3:.1f} k instructions/entry"
        print(line, flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
