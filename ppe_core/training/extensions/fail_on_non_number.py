"""PPE's path ``training.extensions.fail_on_non_number``: the non-finite parameter check."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["FailOnNonNumber"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._fail_on_non_number import FailOnNonNumber
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
