"""PPE's path ``training.extensions.variable_statistics_plot``: VariableStatisticsPlot."""

from __future__ import annotations

from ppe_core.training.extensions._variable_statistics_plot import (
    Reservoir,
    Statistician,
    VariableStatisticsPlot,
)

__all__ = ["Reservoir", "Statistician", "VariableStatisticsPlot"]
