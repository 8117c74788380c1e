"""Schedules for extensions that run every iteration but act on an inner trigger."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core.training.triggers._base import Trigger, next_due

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

__all__ = ["DueCheck", "EveryIteration"]


class EveryIteration(Trigger):
    """Fires after every iteration, and says so through ``next_check``.

    Cheaper than ``IntervalTrigger(1, 'iteration')`` for extensions that must see every
    observation: the manager's check is a constant ``True``.
    """

    fires_every_iteration = True

    def __call__(self, manager: ManagerView) -> bool:
        return True

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        return iteration + 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class DueCheck:
    """Consults a trigger only at the iterations its ``next_check`` announces.

    For extensions that run every iteration (to accumulate values) but act on an inner
    trigger: the trigger sees the same calls it would get from the manager, scheduled by
    :func:`~ppe_core.training.triggers.next_due` as the manager schedules its own.

    Args:
        trigger: The inner trigger.

    Attributes:
        due: The first iteration at which the trigger must be consulted (-1: not known yet).
            An extension on the per-step path may compare ``manager.iteration`` with it
            before calling, to save the call on the other iterations.
    """

    def __init__(self, trigger: Trigger) -> None:
        self.trigger = trigger
        self._every = False
        self.reset()

    def reset(self) -> None:
        """Forgets the schedule: the next call asks ``next_check`` again (after a load)."""
        self.due: int = -1
        self._last: int = -1

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether the trigger fires at ``manager.iteration``."""
        iteration = manager.iteration
        if iteration <= self._last:  # the iteration was reset (e.g. a loaded state)
            self.due = -1
        self._last = iteration
        if self.due < 0:  # not known yet: as the manager would have scheduled it
            self._every = getattr(self.trigger, "fires_every_iteration", False) is True
            self.due = next_due(self.trigger, iteration - 1, manager.iters_per_epoch)
        if iteration < self.due:
            return False
        if self._every and iteration > 0:
            # Fires after every iteration, unconditionally (the Trigger contract the manager's
            # fast path relies on too): not consulted, as the manager does not consult it.
            # (Before the first iteration it is: IntervalTrigger does not fire there.)
            self.due = iteration + 1
            return True
        fired = bool(self.trigger(manager))
        self.due = next_due(self.trigger, iteration, manager.iters_per_epoch)
        return fired
