"""``python -m benchmarks``: run the benchmark suite (see ``benchmarks/suite.py``)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import suite

suite.main()
