"""PPE's path ``training.extensions.accumulate.average_accumulate``."""

from __future__ import annotations

from ppe_core.training.extensions._accumulate import AverageAccumulate

__all__ = ["AverageAccumulate"]
