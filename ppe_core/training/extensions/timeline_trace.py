"""PPE's path ``training.extensions.timeline_trace``: the TimelineTrace extension."""

from __future__ import annotations

from ppe_core.training.extensions._timeline_trace import TimelineTrace

__all__ = ["TimelineTrace"]
