"""PPE's ``training.trigger`` module: the trigger base class, its aliases and ``get_trigger``.

Kept for code written against ``pytorch_pfn_extras.training.trigger``; new code can import the
same names from :mod:`ppe_core.training.triggers`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.training.triggers._base import Trigger, TriggerFunc, TriggerLike
from ppe_core.training.triggers._factory import get_trigger
from ppe_core.training.triggers._interval import IntervalTrigger

__all__ = ["IntervalTrigger", "Trigger", "TriggerFunc", "TriggerLike", "get_trigger"]


if not TYPE_CHECKING:  # PPE's names left out here say what to use (docs/migration.md)
    __getattr__ = module_getattr(__name__)
