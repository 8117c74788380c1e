"""PPE's path ``training.extensions.progress_bar_notebook``.

``ProgressBarNotebook`` is :class:`ProgressBar`, which shows tqdm's notebook widget
in Jupyter (PPE's class needs IPython and ipywidgets; ours needs neither).
"""

from __future__ import annotations

from ppe_core.training.extensions._progress_bar import ProgressBar
from ppe_core.training.extensions._progress_bar import ProgressBar as ProgressBarNotebook

__all__ = ["ProgressBar", "ProgressBarNotebook"]
