"""PPE's module path for :class:`ManualScheduleTrigger`."""

from __future__ import annotations

from ppe_core.training.triggers._interval import ManualScheduleTrigger

__all__ = ["ManualScheduleTrigger"]
