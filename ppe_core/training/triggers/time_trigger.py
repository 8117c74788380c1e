"""PPE's module path for :class:`TimeTrigger`."""

from __future__ import annotations

from ppe_core.training.triggers._time import TimeTrigger

__all__ = ["TimeTrigger"]
