"""The console the progress bars and ``PrintReport`` write to: a terminal, or a notebook."""

from __future__ import annotations

import sys
from typing import IO, Any

__all__ = ["in_notebook", "is_terminal"]


def is_terminal(out: IO[Any]) -> bool:
    """Whether ``out`` is an interactive terminal (so cursor control is allowed)."""
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):  # no isatty (a bare writer), or a closed stream
        return False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where tqdm's notebook widget works).

    Only looks at already imported modules, so it never imports IPython itself.
    """
    return "ipykernel.zmqshell" in sys.modules
