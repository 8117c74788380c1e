"""PPE's path ``training.extensions.variable_statistics_plot``: VariableStatisticsPlot."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["Reservoir", "Statistician", "VariableStatisticsPlot"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._variable_statistics_plot import (
        Reservoir,
        Statistician,
        VariableStatisticsPlot,
    )
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__, not_provided=True)
