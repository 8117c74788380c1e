"""PPE's path ``training.extensions.log_report``: the LogReport extension."""

from __future__ import annotations

from ppe_core.training.extensions._log_report import LogReport

__all__ = ["LogReport"]
