"""PPE's path ``training.extensions.lr_scheduler``: the LRScheduler extension."""

from __future__ import annotations

from ppe_core.training.extensions._lr_scheduler import LRScheduler

__all__ = ["LRScheduler"]
