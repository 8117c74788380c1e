"""PPE's path ``training.extensions.accumulate.average_accumulate``."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["AverageAccumulate"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._accumulate import AverageAccumulate
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
