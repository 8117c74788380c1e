"""PPE's path ``training.extensions.print_report``: the PrintReport extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.training.extensions._print_report import PrintReport

__all__ = ["PrintReport"]


if not TYPE_CHECKING:  # PPE's names left out here say what to use (docs/migration.md)
    __getattr__ = module_getattr(__name__)
