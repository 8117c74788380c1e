"""PPE's path of the accumulate extensions' base class (``AccumulateBase``)."""

from __future__ import annotations

from ppe_core.training.extensions._accumulate import AccumulateBase

__all__ = ["AccumulateBase"]
