"""PPE's path ``training.extensions.timeline_trace``: the TimelineTrace extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["TimelineTrace"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._timeline_trace import TimelineTrace
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
