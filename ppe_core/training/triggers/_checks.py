"""Trigger arguments checked, and periods read as exact fractions.

PPE's interval triggers assert the unit and compare float epoch counts; ppe-core checks each
argument with a message naming the trigger and the fix, and reads a period or point as an
exact fraction (a third of an epoch fires exactly every third of an epoch, however the float
rounds).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from fractions import Fraction

from ppe_core.errors import ConfigurationError, TriggerTypeError
from ppe_core.training.triggers._base import UNITS

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
    """Validates a trigger unit, naming the owner and the accepted values in the error."""
    example = f"e.g. {owner}(1, 'epoch')"
    if not isinstance(unit, str):
        raise TriggerTypeError(
            f"{owner} unit must be the string 'epoch' or 'iteration', got "
            f"{type(unit).__name__} {unit!r}; the arguments are (period, unit), {example}"
        )
    if unit not in UNITS:
        stem = unit.lower().rstrip("s")
        hint = f"; did you mean {stem!r}?" if stem in UNITS else f"; {example}"
        raise ConfigurationError(f"{owner} unit must be 'epoch' or 'iteration', got {unit!r}{hint}")
    return unit


def check_amount(value: object, unit: str, what: str, owner: str) -> Fraction:
    """Validates a positive period or point and returns it as an exact fraction.

    Args:
        value: The user's number.
        unit: The already validated unit; ``'iteration'`` amounts must be whole numbers.
        what: The argument's name for messages (``'period'``, ``'point'``).
        owner: The trigger class name for messages.
    """
    number = _positive_number(
        value,
        f"{owner} {what} must be a positive int or float, got {type(value).__name__} "
        f"{value!r}; the arguments are ({what}, unit), e.g. {owner}(1, 'epoch')",
        f"{owner} {what} must be a finite number > 0, got {value!r}; use e.g. 1 or 0.5",
    )
    if unit == "iteration":
        if not number.is_integer():
            raise ConfigurationError(
                f"{owner} {what} in 'iteration' units must be a whole number, got {value!r}; "
                "round it, or use unit='epoch' for fractions of an epoch"
            )
        return Fraction(int(number))
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    exact = Fraction(number)
    close = exact.limit_denominator(_MAX_DENOMINATOR)
    return close if close > 0 and abs(close - exact) <= exact * Fraction(1, 10**6) else exact


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


def check_compare(
    compare: Callable[[float, float], bool], owner: str
) -> Callable[[float, float], bool]:
    """A value trigger's ``compare``; raises unless it is callable."""
    if not callable(compare):
        raise TriggerTypeError(
            f"{owner} compare must be a callable compare(best, new) -> bool, got "
            f"{type(compare).__name__} {compare!r}; e.g. lambda best, new: new < best"
        )
    return compare


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
