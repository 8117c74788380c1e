"""PPE's path ``training.extensions.progress_bar``: the ProgressBar extension."""

from __future__ import annotations

from ppe_core.training.extensions._progress_bar import ProgressBar

__all__ = ["ProgressBar"]
