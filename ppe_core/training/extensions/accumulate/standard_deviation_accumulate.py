"""PPE's path ``training.extensions.accumulate.standard_deviation_accumulate``."""

from __future__ import annotations

from ppe_core.training.extensions._accumulate import StandardDeviationAccumulate

__all__ = ["StandardDeviationAccumulate"]
