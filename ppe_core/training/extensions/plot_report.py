"""PPE's path ``training.extensions.plot_report``: the PlotReport extension."""

from __future__ import annotations

from ppe_core.training.extensions._plot_report import PlotReport

__all__ = ["PlotReport"]
