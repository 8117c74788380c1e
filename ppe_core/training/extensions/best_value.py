"""PPE's path ``training.extensions.best_value``: the best-value extensions."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["BestValue", "MaxValue", "MinValue"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._best_value import BestValue, MaxValue, MinValue
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
