"""PPE's path ``training.extensions.log_report``: the LogReport extension (and PPE's
``_LogBuffer`` / ``_LogLooker``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["LogReport", "_LogBuffer", "_LogLooker"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._log_buffer import _LogBuffer, _LogLooker
    from ppe_extensions._log_report import LogReport
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__, not_provided=True)
