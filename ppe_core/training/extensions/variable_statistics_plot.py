"""PPE's path ``training.extensions.variable_statistics_plot``: VariableStatisticsPlot."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.training.extensions._variable_statistics_plot import (
    Reservoir,
    Statistician,
    VariableStatisticsPlot,
)

__all__ = ["Reservoir", "Statistician", "VariableStatisticsPlot"]


if not TYPE_CHECKING:  # PPE's names left out here say what to use (docs/migration.md)
    __getattr__ = module_getattr(__name__)
