"""Import + plugin discovery over ``import torch``: the suite's ``import`` section on its own.

.venv/bin/python benchmarks/bench_import.py   # same as: python -m benchmarks --only import
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import suite

if __name__ == "__main__":
    suite.main(["--only", "import", *sys.argv[1:]])
