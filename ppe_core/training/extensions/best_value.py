"""PPE's path ``training.extensions.best_value``: the best-value extensions."""

from __future__ import annotations

from ppe_core.training.extensions._best_value import (
    BestValue,
    MaxValue,
    MinValue,
)

__all__ = ["BestValue", "MaxValue", "MinValue"]
