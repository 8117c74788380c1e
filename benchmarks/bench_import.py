"""Import cost of ppe_core plus plugin discovery, over ``import torch``, in fresh interpreters."""

from __future__ import annotations

import statistics
import subprocess
import sys

CODE = """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import ppe_core as ppe
ppe.runtime.runtime_registry.names()  # forces entry-point discovery and plugin loading
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def main(repeats: int = 7) -> None:
    torch_s, ppe_s = [], []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", CODE], capture_output=True, text=True, check=True
        )
        a, b = map(float, out.stdout.split())
        torch_s.append(a)
        ppe_s.append(b)
    print(f"import torch:                 median {statistics.median(torch_s) * 1e3:7.1f} ms")
    print(
        f"import ppe_core + discovery:  median {statistics.median(ppe_s) * 1e3:7.1f} ms "
        f"(min {min(ppe_s) * 1e3:.1f} ms) over torch"
    )


if __name__ == "__main__":
    main()
