"""Per-step overhead over a raw loop: the suite's ``step`` section on its own.

.venv/bin/python benchmarks/bench_step.py   # same as: python -m benchmarks --only step
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import suite

if __name__ == "__main__":
    suite.main(["--only", "step", *sys.argv[1:]])
