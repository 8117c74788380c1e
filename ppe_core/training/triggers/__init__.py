"""Triggers: when extensions run and when training stops (PPE-compatible, plus ``next_check``).

Every trigger answers ``trigger(manager) -> bool``. Ours also implement
``next_check(iteration, iters_per_epoch)``, so the extensions manager calls a trigger only at
the iterations where it can fire: an ``int`` is the next such iteration (:data:`NEVER` for
none), ``None`` asks to be called every iteration (the value triggers, which average what
was reported over each interval, as PPE's do).
"""

from __future__ import annotations

from ppe_core.errors import MissingObservationWarning, TriggerTypeError

# PPE's module paths (``triggers.interval_trigger.IntervalTrigger``, ...), importable as such.
from ppe_core.training.triggers import (
    early_stopping_trigger,
    function_trigger,
    interval_trigger,
    manual_schedule_trigger,
    minmax_value_trigger,
    once_trigger,
    time_trigger,
)
from ppe_core.training.triggers._base import NEVER, Trigger, TriggerFunc, TriggerLike, next_due
from ppe_core.training.triggers._due import DueCheck, EveryIteration
from ppe_core.training.triggers._factory import get_trigger
from ppe_core.training.triggers._function import FunctionTrigger
from ppe_core.training.triggers._interval import IntervalTrigger, ManualScheduleTrigger
from ppe_core.training.triggers._once import OnceTrigger
from ppe_core.training.triggers._time import TimeTrigger
from ppe_core.training.triggers._value import (
    BestValueTrigger,
    EarlyStoppingTrigger,
    MaxValueTrigger,
    MinValueTrigger,
)

__all__ = [
    "NEVER",
    "BestValueTrigger",
    "DueCheck",
    "EarlyStoppingTrigger",
    "EveryIteration",
    "FunctionTrigger",
    "IntervalTrigger",
    "ManualScheduleTrigger",
    "MaxValueTrigger",
    "MinValueTrigger",
    "MissingObservationWarning",
    "OnceTrigger",
    "TimeTrigger",
    "Trigger",
    "TriggerFunc",
    "TriggerLike",
    "TriggerTypeError",
    "early_stopping_trigger",
    "function_trigger",
    "get_trigger",
    "interval_trigger",
    "manual_schedule_trigger",
    "minmax_value_trigger",
    "next_due",
    "once_trigger",
    "time_trigger",
]
