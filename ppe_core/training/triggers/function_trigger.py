"""PPE's module path for :class:`FunctionTrigger`."""

from __future__ import annotations

from ppe_core.training.triggers._function import FunctionTrigger

__all__ = ["FunctionTrigger"]
