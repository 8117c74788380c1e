"""PPE's path ``training.extensions.accumulate.unbiased_standard_deviation_accumulate``."""

from __future__ import annotations

from ppe_core.training.extensions._accumulate import UnbiasedStandardDeviationAccumulate

__all__ = ["UnbiasedStandardDeviationAccumulate"]
