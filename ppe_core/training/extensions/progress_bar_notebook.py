"""PPE's path ``training.extensions.progress_bar_notebook``.

``ProgressBarNotebook`` is :class:`ProgressBar`, which shows tqdm's notebook widget
in Jupyter (PPE's class needs IPython and ipywidgets; ours needs neither).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["ProgressBar", "ProgressBarNotebook"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._progress_bar import ProgressBar
    from ppe_extensions._progress_bar import ProgressBar as ProgressBarNotebook
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(
        __name__, __all__, aliases={"ProgressBarNotebook": "ProgressBar"}
    )
