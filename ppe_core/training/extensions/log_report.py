"""PPE's path ``training.extensions.log_report``: the LogReport extension (and PPE's
``_LogBuffer`` / ``_LogLooker``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.training.extensions._log_buffer import _LogBuffer, _LogLooker
from ppe_core.training.extensions._log_report import LogReport

__all__ = ["LogReport", "_LogBuffer", "_LogLooker"]


if not TYPE_CHECKING:  # PPE's names left out here say what to use (docs/migration.md)
    __getattr__ = module_getattr(__name__)
