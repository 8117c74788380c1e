"""PPE's module path for :class:`OnceTrigger`."""

from __future__ import annotations

from ppe_core.training.triggers._once import OnceTrigger

__all__ = ["OnceTrigger"]
