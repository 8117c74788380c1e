"""Stateless schedule triggers: ``IntervalTrigger`` and ``ManualScheduleTrigger``."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ppe_core.training.triggers._base import NEVER, Trigger
from ppe_core.training.triggers._checks import check_epoch_length, check_period, check_points

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView


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
