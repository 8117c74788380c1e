"""PPE's path ``training.extensions.parameter_statistics``: the ParameterStatistics extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["ParameterStatistics"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._parameter_statistics import ParameterStatistics
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
