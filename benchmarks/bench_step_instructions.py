"""Per-step overhead counted in CPU instructions (valgrind/callgrind): noise-free ratios.

Wall-clock timings on a shared 2-core VM swing by +-15 us per step; instruction counts do not.
Each variant (the suite's workloads: raw loop, Trainer bare, Trainer with LogReport +
PrintReport + ProgressBar with and without a per-step ``report`` in ``forward``, peers, and
the Evaluator against a raw ``no_grad`` loop) runs
once for 1 and once for 3 epochs of 200 steps with instrumentation switched on only around the
run; the per-step count is the difference divided by the 400 extra steps. Needs ``valgrind``.

    .venv/bin/python benchmarks/bench_step_instructions.py
    .venv/bin/python -m benchmarks --only instructions   # the same, in the suite's table
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = """
import os, subprocess, sys
sys.path.insert(0, {here!r})
import suite, torch
torch.set_num_threads(1)
data = suite.batches(200)
variant, epochs = sys.argv[1], int(sys.argv[2])
fn = suite.instruction_variants()[variant]
fn(data, epochs)  # warm-up: imports and lazy initialisation stay out of the count
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
fn(data, epochs)
subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True)
"""


def count(script: str, variant: str, epochs: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                script,
                variant,
                str(epochs),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    match = re.search(r"Collected : (\d+)", out)
    assert match, out
    return int(match.group(1))


def measure() -> list[tuple[str, float, float]]:
    """``(variant, instructions per step, raw loop's instructions per step)`` for each variant."""
    sys.path.insert(0, HERE)
    import suite

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD.format(here=HERE))
    try:
        variants = list(suite.instruction_variants())
        jobs = [(v, e) for v in variants for e in (1, 3)]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            counts = dict(zip(jobs, pool.map(lambda j: count(f.name, *j), jobs), strict=True))
    finally:
        os.unlink(f.name)
    per_step = {v: (counts[(v, 3)] - counts[(v, 1)]) / 400 for v in variants}
    # Training rows compare with the raw training loop, "eval: ..." rows with the raw
    # no_grad loop (per batch).
    base, eval_base = per_step["raw loop"], per_step.get("eval: raw no_grad loop", 0.0)
    return [(v, n, eval_base if v.startswith("eval:") else base) for v, n in per_step.items()]


def main() -> None:
    for variant, instructions, base in measure():
        print(
            f"{variant:24s} {instructions / 1e3:8.1f} k instructions/step  "
            f"ratio {instructions / base:5.3f}  (+{(instructions - base) / 1e3:.1f} k)"
        )


if __name__ == "__main__":
    main()
