"""PPE's module path for :class:`IntervalTrigger`."""

from __future__ import annotations

from ppe_core.training.triggers._interval import IntervalTrigger

__all__ = ["IntervalTrigger"]
