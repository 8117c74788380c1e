"""PPE's path ``training.extensions.parameter_statistics``: the ParameterStatistics extension."""

from __future__ import annotations

from ppe_core.training.extensions._parameter_statistics import ParameterStatistics

__all__ = ["ParameterStatistics"]
