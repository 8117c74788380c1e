"""PPE's path ``training.extensions.print_report``: the PrintReport extension."""

from __future__ import annotations

from ppe_core.training.extensions._print_report import PrintReport

__all__ = ["PrintReport"]
