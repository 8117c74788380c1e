"""PPE's module path for the best/max/min value triggers."""

from __future__ import annotations

from ppe_core.training.triggers._value import (
    BestValueTrigger,
    MaxValueTrigger,
    MinValueTrigger,
)

__all__ = ["BestValueTrigger", "MaxValueTrigger", "MinValueTrigger"]
