"""PPE's path ``training.extensions.micro_average``: the MicroAverage extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["MicroAverage"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._micro_average import MicroAverage
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
