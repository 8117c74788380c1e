"""PPE's path ``training.extensions.print_report``: the PrintReport extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["PrintReport"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._print_report import PrintReport
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__, not_provided=True)
