"""PPE's path ``training.extensions.accumulate.min_accumulate``."""

from __future__ import annotations

from ppe_core.training.extensions._accumulate import MinAccumulate

__all__ = ["MinAccumulate"]
