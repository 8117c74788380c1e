"""PPE's path ``training.extensions.lr_scheduler``: the LRScheduler extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["LRScheduler"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._lr_scheduler import LRScheduler
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
