"""PPE's path ``training.extensions.accumulate.max_accumulate``."""

from __future__ import annotations

from ppe_core.training.extensions._accumulate import MaxAccumulate

__all__ = ["MaxAccumulate"]
