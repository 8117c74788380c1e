"""Trigger arguments checked, and periods read as exact fractions.

PPE's interval triggers assert the unit and compare float epoch counts; ppe-core checks each
argument with a message naming the trigger and the fix, and reads a period or point as an
exact fraction (a third of an epoch fires exactly every third of an epoch, however the float
rounds).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

from ppe_core.errors import ConfigurationError, TriggerTypeError
from ppe_core.training.triggers._base import UNITS

__all__ = ["check_amount", "check_key", "check_unit"]

# Fractional periods are read as the nearest fraction with at most this denominator, so that
# 0.1 or 1/3 of an epoch mean exactly a tenth or a third despite float rounding.
_MAX_DENOMINATOR = 1_000_000


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
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TriggerTypeError(
            f"{owner} {what} must be a positive int or float, got {type(value).__name__} "
            f"{value!r}; the arguments are ({what}, unit), e.g. {owner}(1, 'epoch')"
        )
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigurationError(
            f"{owner} {what} must be a finite number > 0, got {value!r}; use e.g. 1 or 0.5"
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
