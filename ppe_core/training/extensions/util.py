"""PPE's path ``training.extensions.util``: the text progress-bar base class.

``ProgressBar`` here is the base for custom text bars (implement ``get_lines()``), as in PPE;
the training progress extension is ``ppe.training.extensions.ProgressBar``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["ProgressBar"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._evaluator import TextProgressBar as ProgressBar
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__, aliases={"ProgressBar": "TextProgressBar"})
