"""PPE's module path for :class:`EarlyStoppingTrigger`."""

from __future__ import annotations

from ppe_core.training.triggers._value import EarlyStoppingTrigger

__all__ = ["EarlyStoppingTrigger"]
