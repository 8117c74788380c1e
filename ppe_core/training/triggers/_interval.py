"""Stateless schedule triggers: ``IntervalTrigger`` and ``ManualScheduleTrigger``.

Beyond PPE (which asserts the unit and compares float epoch counts), each argument is checked
with a message naming the trigger and the fix, and a period or point is read as an exact
fraction: a third of an epoch fires exactly every third of an epoch, however the float rounds.
"""

from __future__ import annotations

import math
import numbers
from bisect import bisect_right
from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ppe_core.errors import ConfigurationError, TriggerTypeError
from ppe_core.training.triggers._base import NEVER, UNITS, Trigger, _positive_number

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

# Fractional periods are read as the nearest fraction with at most this denominator, so that
# 0.1 or 1/3 of an epoch mean exactly a tenth or a third despite float rounding.
_MAX_DENOMINATOR = 1_000_000


class _Schedule(Trigger):
    """A trigger decided by the iteration count and the epoch length alone (:meth:`may_fire`)."""

    _unit: str

    @property
    def unit(self) -> str:
        """``'iteration'`` or ``'epoch'``."""
        return self._unit

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether the schedule fires at the iteration just completed."""
        return self.may_fire(manager.iteration, manager.iters_per_epoch)


class IntervalTrigger(_Schedule):
    """Fires every ``period`` iterations or epochs.

    The decision depends only on ``manager.iteration`` and the epoch length, so skipped calls,
    resumed runs and the manager's :meth:`next_check` scheduling all agree. A fractional epoch
    period fires once per boundary, at the first iteration that reaches it: with 5 iterations
    per epoch, ``(0.5, 'epoch')`` fires at iterations 3, 5, 8, 10, ... (boundaries 2.5, 5, 7.5,
    10). Should several boundaries fall within one iteration, it fires once there.

    Args:
        period: Interval length, > 0; a whole number when ``unit`` is ``'iteration'``.
        unit: ``'iteration'`` or ``'epoch'``.

    Raises:
        TriggerTypeError: ``period`` is not a number or ``unit`` not a string.
        ConfigurationError: ``period`` is not positive (or not whole for iterations), or
            ``unit`` is neither ``'epoch'`` nor ``'iteration'``.
    """

    def __init__(self, period: float, unit: str) -> None:
        self._unit, self._ratio = check_period(period, unit)
        self._period = period

    @property
    def period(self) -> float:
        """The interval length as given."""
        return self._period

    @property
    def fires_every_iteration(self) -> bool:  # type: ignore[override]
        """``(1, 'iteration')`` fires after every iteration."""
        return self._unit == "iteration" and self._ratio == 1

    def _boundary(self, iters_per_epoch: int) -> tuple[int, int]:
        # Boundary k lies at k * num / den completed iterations (an iteration ratio is whole).
        scale = 1 if self._unit == "iteration" else check_epoch_length(iters_per_epoch, self)
        return self._ratio.numerator * scale, self._ratio.denominator

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Returns whether a boundary lies in ``(iteration - 1, iteration]``."""
        if iteration <= 0:
            return False
        num, den = self._boundary(epoch_length)
        return (iteration * den) // num != ((iteration - 1) * den) // num

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        """Returns the iteration that reaches the first boundary after ``iteration``."""
        num, den = self._boundary(iters_per_epoch)
        k = max(iteration, 0) * den // num + 1
        return -(-k * num // den)

    def get_training_length(self) -> tuple[float, str]:
        """Returns ``(period, unit)``; the manager reads it from a stop trigger."""
        return self._period, self._unit

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._period!r}, {self._unit!r})"


class ManualScheduleTrigger(_Schedule):
    """Fires once at each of the given points (iterations or epochs).

    An epoch point fires at the first iteration that reaches it: ``(0.5, 'epoch')`` with 5
    iterations per epoch fires at iteration 3 (PPE rounded down to 2, before the point).
    Points that land on the same iteration fire once. Stateless, like :class:`IntervalTrigger`.

    Args:
        points: One point or a sequence of points, each > 0; whole numbers for iterations.
        unit: ``'iteration'`` or ``'epoch'``.

    Raises:
        TriggerTypeError: A point is not a number, or ``unit`` is not a string.
        ConfigurationError: A point is not positive (or not whole for iterations), or ``unit``
            is neither ``'epoch'`` nor ``'iteration'``.
    """

    def __init__(self, points: float | Iterable[float], unit: str) -> None:
        self._unit, self._points, self._fractions = check_points(points, unit)

    @property
    def points(self) -> list[float]:
        """The points as given."""
        return list(self._points)

    def _firing_iterations(self, iters_per_epoch: int) -> list[int]:
        # A pure function of the epoch length (no state): any call order agrees. The manager
        # asks at the points only (next_check), so nothing is cached.
        scale = 1 if self._unit == "iteration" else check_epoch_length(iters_per_epoch, self)
        return sorted({math.ceil(p * scale) for p in self._fractions})  # exact: fractions

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Returns whether ``iteration`` is the first to reach one of the points."""
        return iteration in self._firing_iterations(epoch_length)

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        """Returns the next scheduled iteration after ``iteration``, or :data:`NEVER`."""
        iterations = self._firing_iterations(iters_per_epoch)
        index = bisect_right(iterations, iteration)
        return iterations[index] if index < len(iterations) else NEVER

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._points!r}, {self._unit!r})"


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


def check_points_type(points: object, owner: str) -> None:
    """Raises ``TriggerTypeError`` unless ``points`` is a number or an iterable of them."""
    if not isinstance(points, (numbers.Real, Iterable)) or isinstance(points, (str, bytes)):
        raise TriggerTypeError(
            f"{owner} points must be a number or a list of numbers, got "
            f"{type(points).__name__} {points!r}; e.g. {owner}([10, 20], 'epoch')"
        )
