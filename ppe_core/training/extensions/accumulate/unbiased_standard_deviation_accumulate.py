"""PPE's path ``training.extensions.accumulate.unbiased_standard_deviation_accumulate``."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["UnbiasedStandardDeviationAccumulate"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._accumulate import UnbiasedStandardDeviationAccumulate
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
