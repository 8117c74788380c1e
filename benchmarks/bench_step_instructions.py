"""Per-step overhead counted in CPU instructions (valgrind/callgrind): noise-free ratios.

Wall-clock timings on a shared 2-core VM swing by +-15 us per step; instruction counts do not.
Each variant (raw loop, Trainer, Trainer with LogReport+PrintReport+ProgressBar) runs once for
1 and once for 3 epochs of 200 steps with instrumentation switched on only around the run; the
per-step count is the difference divided by the 400 extra steps. Needs ``valgrind``.

    .venv/bin/python benchmarks/bench_step_instructions.py
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
import bench_step as b, torch
torch.set_num_threads(1)
b.BATCHES = 200
data = b.batches()[:200]
variant, epochs = sys.argv[1], int(sys.argv[2])
runs = {{"raw": lambda: b.raw(data, epochs), "trainer": lambda: b.trainer(data, epochs, False),
        "trainer+ext": lambda: b.trainer(data, epochs, True)}}
runs.update({{name: (lambda f: lambda: f(epochs))(f) for name, f in b.peers(data).items()}})
run = runs[variant]
run()  # warm-up: imports and lazy initialisation stay out of the count
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
run()
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


def main() -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD.format(here=HERE))
    sys.path.insert(0, HERE)
    import bench_step

    variants = ["raw", "trainer", "trainer+ext", *bench_step.peers([])]
    jobs = [(v, e) for v in variants for e in (1, 3)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: count(f.name, *j), jobs), strict=True))
    os.unlink(f.name)
    per_step = {v: (counts[(v, 3)] - counts[(v, 1)]) / 400 for v in variants}
    base = per_step["raw"]
    for variant, instructions in per_step.items():
        print(
            f"{variant:12s} {instructions / 1e3:8.1f} k instructions/step  "
            f"ratio {instructions / base:5.3f}  (+{(instructions - base) / 1e3:.1f} k)"
        )


if __name__ == "__main__":
    main()
