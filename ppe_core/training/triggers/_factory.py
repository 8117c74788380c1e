"""``get_trigger``: turns what users pass as a trigger into a :class:`Trigger`."""

from __future__ import annotations

from ppe_core.errors import TriggerTypeError
from ppe_core.training.triggers._base import Trigger, TriggerLike, _CallableTrigger
from ppe_core.training.triggers._interval import IntervalTrigger, ManualScheduleTrigger


def get_trigger(trigger: TriggerLike) -> Trigger:
    """Returns a :class:`Trigger` for anything accepted where a trigger is expected.

    Args:
        trigger: A :class:`Trigger` (returned as is); a ``(period, unit)`` tuple or list (an
            :class:`IntervalTrigger`); another callable taking the manager and returning a bool
            (wrapped; called every iteration because its schedule is unknown); or ``None`` (a
            trigger that never fires, as in PPE).

    Raises:
        TriggerTypeError: ``trigger`` is none of these, or the pair is not ``(period, unit)``.
    """
    if isinstance(trigger, Trigger):
        return trigger
    if trigger is None:
        return ManualScheduleTrigger([], "iteration")  # no point: never fires nor is called
    if callable(trigger):
        return _CallableTrigger(trigger)
    if isinstance(trigger, (tuple, list)) and len(trigger) == 2:
        period, unit = trigger
        return IntervalTrigger(period, unit)
    raise not_a_trigger_error(trigger)


def not_a_trigger_error(trigger: object) -> TriggerTypeError:
    """The error for what ``get_trigger`` cannot make a trigger from, with what it accepts."""
    return TriggerTypeError(
        f"cannot make a trigger from {type(trigger).__name__} {trigger!r}; pass a (period, unit) "
        "pair such as (1, 'epoch') or (100, 'iteration'), a Trigger instance, a callable "
        "taking the manager and returning a bool, or None for a trigger that never fires"
    )
