"""PPE's private path ``training._trigger_util``, kept for the type aliases scripts import from it.

PPE scripts annotate with ``from pytorch_pfn_extras.training._trigger_util import TriggerLike``;
the same import works here. The names are those of :mod:`ppe_core.training.triggers`.
"""

from __future__ import annotations

from typing import TypeAlias

from ppe_core.training import ExtensionsManagerProtocol
from ppe_core.training.triggers import Trigger, TriggerFunc, TriggerLike, get_trigger

#: A trigger unit: ``"epoch"`` or ``"iteration"`` (a plain ``str``, as in PPE).
UnitLiteral: TypeAlias = str

__all__ = [
    "ExtensionsManagerProtocol",
    "Trigger",
    "TriggerFunc",
    "TriggerLike",
    "UnitLiteral",
    "get_trigger",
]
