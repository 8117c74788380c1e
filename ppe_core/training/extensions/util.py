"""PPE's path ``training.extensions.util``: the text progress-bar base class.

``ProgressBar`` here is the base for custom text bars (implement ``get_lines()``), as in PPE;
the training progress extension is ``ppe.training.extensions.ProgressBar``.
"""

from __future__ import annotations

from ppe_core.training.extensions._evaluator import TextProgressBar as ProgressBar

__all__ = ["ProgressBar"]
