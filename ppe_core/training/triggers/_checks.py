"""Trigger arguments checked, periods read as exact fractions, unread values explained.

PPE's interval triggers assert the unit and compare float epoch counts; ppe-core checks each
argument with a message naming the trigger and the fix, and reads a period or point as an
exact fraction (a third of an epoch fires exactly every third of an epoch, however the float
rounds). A value trigger's check that finds no mean of its key says why (PPE: ``KeyError``
from the min/max triggers, a bare warning from early stopping).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar

from ppe_core.errors import ConfigurationError, MissingObservationWarning, TriggerTypeError
from ppe_core.training.triggers._base import UNITS

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

_F = TypeVar("_F")

# Fractional periods are read as the nearest fraction with at most this denominator, so that
# 0.1 or 1/3 of an epoch mean exactly a tenth or a third despite float rounding.
_MAX_DENOMINATOR = 1_000_000


def _positive_number(value: object, wrong_type: str, not_positive: str) -> float:
    """``value`` as a float; raises ``TriggerTypeError(wrong_type)`` unless it is a real
    number, ``ConfigurationError(not_positive)`` unless it is finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TriggerTypeError(wrong_type)
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigurationError(not_positive)
    return number


def check_unit(unit: object, owner: str) -> str:
    """Refuses a unit other than 'epoch' or 'iteration', naming the owner, with a hint."""
    checked = check_unit_type(unit, owner)
    if checked not in UNITS:
        hint = unit_hint(checked, owner)
        raise ConfigurationError(f"{owner} unit must be 'epoch' or 'iteration', got {unit!r}{hint}")
    return checked


def check_unit_type(unit: object, owner: str) -> str:
    """Returns ``unit``; raises ``TriggerTypeError`` explaining the arguments unless a str."""
    if not isinstance(unit, str):
        raise TriggerTypeError(
            f"{owner} unit must be the string 'epoch' or 'iteration', got "
            f"{type(unit).__name__} {unit!r}; the arguments are (period, unit), "
            f"e.g. {owner}(1, 'epoch')"
        )
    return unit


def unit_hint(unit: str, owner: str) -> str:
    """The end of the message for an unknown ``unit``: the unit meant, or an example."""
    stem = unit.lower().rstrip("s")
    return f"; did you mean {stem!r}?" if stem in UNITS else f"; e.g. {owner}(1, 'epoch')"


def check_amount(value: object, unit: str, what: str, owner: str) -> Fraction:
    """A period or point (checked by :func:`check_positive_amount`) as an exact fraction.

    Args:
        value: The user's number.
        unit: The already validated unit; ``'iteration'`` amounts must be whole numbers.
        what: The argument's name for messages (``'period'``, ``'point'``).
        owner: The trigger class name for messages.
    """
    number = check_positive_amount(value, unit, what, owner)
    if unit == "iteration":
        return Fraction(int(number))
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    exact = Fraction(number)
    close = exact.limit_denominator(_MAX_DENOMINATOR)
    return close if close > 0 and abs(close - exact) <= exact * Fraction(1, 10**6) else exact


def check_positive_amount(value: object, unit: str, what: str, owner: str) -> float:
    """``value`` as a float; raises unless a finite number > 0, whole for ``'iteration'``."""
    number = _positive_number(
        value,
        f"{owner} {what} must be a positive int or float, got {type(value).__name__} "
        f"{value!r}; the arguments are ({what}, unit), e.g. {owner}(1, 'epoch')",
        f"{owner} {what} must be a finite number > 0, got {value!r}; use e.g. 1 or 0.5",
    )
    if unit == "iteration" and not number.is_integer():
        raise ConfigurationError(
            f"{owner} {what} in 'iteration' units must be a whole number, got {value!r}; "
            "round it, or use unit='epoch' for fractions of an epoch"
        )
    return number


def not_a_trigger_error(trigger: object) -> TriggerTypeError:
    """The error for what ``get_trigger`` cannot make a trigger from, with what it accepts."""
    return TriggerTypeError(
        f"cannot make a trigger from {type(trigger).__name__} {trigger!r}; pass a (period, unit) "
        "pair such as (1, 'epoch') or (100, 'iteration'), a Trigger instance, a callable "
        "taking the manager and returning a bool, or None for a trigger that never fires"
    )


def check_key(key: object, owner: str, what: str = "key") -> str:
    """Validates an observation key such as ``'val/loss'``."""
    if not isinstance(key, str):
        raise TriggerTypeError(
            f"{owner} {what} must be the str name of a reported value such as 'val/loss', "
            f"got {type(key).__name__} {key!r}"
        )
    return key


def check_epoch_length(iters_per_epoch: int, owner: object) -> int:
    """``iters_per_epoch`` for an epoch-unit trigger ``owner``; raises unless a positive int."""
    if (
        isinstance(iters_per_epoch, bool)
        or not isinstance(iters_per_epoch, int)
        or iters_per_epoch <= 0
    ):
        raise ConfigurationError(
            f"{owner!r} counts epochs, but iters_per_epoch is {iters_per_epoch!r}, not a "
            "positive int; give the manager a positive iters_per_epoch or use unit='iteration'"
        )
    return iters_per_epoch


def check_seconds(period: object) -> float:
    """``TimeTrigger``'s ``period`` as a float; raises unless a finite number of seconds > 0."""
    return _positive_number(
        period,
        f"TimeTrigger period must be a number of seconds, got {type(period).__name__} "
        f"{period!r}; e.g. TimeTrigger(600) for every 10 minutes",
        f"TimeTrigger period must be a finite number of seconds > 0, got {period!r}",
    )


def check_callable(function: _F, must: str, example: str = "") -> _F:
    """A function argument (a value trigger's ``compare``, ``FunctionTrigger``'s ``fn``);
    raises ``TriggerTypeError`` saying what it ``must`` be unless it is callable."""
    if not callable(function):
        raise TriggerTypeError(f"{must}, got {type(function).__name__} {function!r}{example}")
    return function


def check_compare(compare: _F, owner: str) -> _F:
    """A value trigger's ``compare``; raises unless it is callable."""
    must = f"{owner} compare must be a callable compare(best, new) -> bool"
    return check_callable(compare, must, "; e.g. lambda best, new: new < best")


def check_period(period: object, unit: object) -> tuple[str, Fraction]:
    """``IntervalTrigger``'s arguments: the unit, and the period as an exact fraction."""
    checked = check_unit(unit, "IntervalTrigger")
    return checked, check_amount(period, checked, "period", "IntervalTrigger")


def check_points(points: object, unit: object) -> tuple[str, list[Any], list[Fraction]]:
    """``ManualScheduleTrigger``'s arguments: the unit, the points as a list (one number, or
    an iterable of them) and each point as an exact fraction."""
    owner = "ManualScheduleTrigger"
    checked = check_unit(unit, owner)
    check_points_type(points, owner)
    given = list(points) if isinstance(points, Iterable) else [points]
    return checked, given, [check_amount(p, checked, "point", owner) for p in given]


def check_points_type(points: object, owner: str) -> None:
    """Raises ``TriggerTypeError`` unless ``points`` is a number or an iterable of them."""
    if not isinstance(points, (numbers.Real, Iterable)) or isinstance(points, (str, bytes)):
        raise TriggerTypeError(
            f"{owner} points must be a number or a list of numbers, got "
            f"{type(points).__name__} {points!r}; e.g. {owner}([10, 20], 'epoch')"
        )


def check_early_stopping(patience: object, mode: object) -> None:
    """Raises unless ``patience`` is an int >= 0 and ``mode`` is 'auto', 'min' or 'max'."""
    owner = "EarlyStoppingTrigger"
    if isinstance(patience, bool) or not isinstance(patience, int):
        raise TriggerTypeError(
            f"{owner} patience must be an int number of checks, got "
            f"{type(patience).__name__} {patience!r}"
        )
    if patience < 0:
        raise ConfigurationError(f"{owner} patience must be >= 0, got {patience}")
    if mode not in ("auto", "min", "max"):
        raise ConfigurationError(
            f"{owner} mode must be 'auto', 'min' or 'max', got {mode!r}; 'min' suits "
            "losses and 'max' accuracies"
        )


def explain_unread_value(owner: str, key: str, manager: ManagerView, present: bool) -> None:
    """At a value trigger's check that found no mean of ``key``: warns with
    :class:`MissingObservationWarning` that it was not reported.

    Raises:
        ConfigurationError: ``key`` was reported this iteration (``present``), but never as a
            scalar.
    """
    if present and key in manager.observation:
        raise ConfigurationError(
            f"{owner} monitors {key!r}, but its reported value "
            f"{manager.observation[key]!r} is not a scalar "
            "number; report a float or a zero-dimensional tensor under that key"
        )
    warnings.warn(
        MissingObservationWarning(
            f"{owner} monitors {key!r}, which is not in the observation at iteration "
            f"{manager.iteration} (keys: {sorted(manager.observation)}); check the key "
            "or the check trigger"
        ),
        stacklevel=4,
    )


def check_training_length(max_trigger: object) -> Any:
    """Returns ``EarlyStoppingTrigger``'s ``max_trigger``; raises unless it defines a training
    length (PPE's is always an interval trigger; ours may be any trigger)."""
    if getattr(max_trigger, "get_training_length", None) is None:
        raise ConfigurationError(
            f"EarlyStoppingTrigger max_trigger {max_trigger!r} has no training "
            "length; pass a (period, unit) pair such as (100, 'epoch')"
        )
    return max_trigger
