"""The stop condition: when training ends, decided once per iteration, and why it ended."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core.training._manager_checks import check_max_epochs
from ppe_core.training._stop_reason import StopKind, StopReason
from ppe_core.training.triggers import Trigger, get_trigger, next_due

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

__all__ = ["StopCondition", "StopKind", "StopReason", "max_epochs_trigger"]

#: Why training ended: ``"max_epochs"`` (the default stop trigger, ``(max_epochs, 'epoch')``,
#: fired), ``"stop_trigger"`` (a ``stop_trigger`` the user passed fired) or ``"error"`` (an
#: exception ended training).


class _NoEpochs(Trigger):
    """The stop trigger of ``max_epochs=0``: training is over before it starts.

    PPE accepts 0 (a manager built only to load a state into); an interval of 0 epochs has no
    period to divide by, so zero gets this trigger, which fires at once.
    """

    def __call__(self, manager: ManagerView) -> bool:
        return True

    def get_training_length(self) -> tuple[int, str]:
        return (0, "epoch")

    def __repr__(self) -> str:
        return "(0, 'epoch')"


def max_epochs_trigger(max_epochs: int) -> Trigger:
    """The manager's default stop trigger, ``(max_epochs, 'epoch')``; 0 stops at once.

    Raises:
        ConfigurationError: ``max_epochs`` is negative (or not a number).
    """
    check_max_epochs(max_epochs)
    if max_epochs == 0 and isinstance(max_epochs, int) and not isinstance(max_epochs, bool):
        return _NoEpochs()
    return get_trigger((max_epochs, "epoch"))


class StopCondition:
    """The manager's one stop condition: consulted at most once per iteration.

    The stop trigger is called only at the iterations its ``next_check`` announces
    (:attr:`due`), by whichever asks first: the manager after an iteration's extensions ran,
    or a read of ``manager.stop_trigger`` (a user's ``while not manager.stop_trigger`` loop).
    Both get the same answer for the same iteration, which stateful triggers (early stopping)
    need, and the first ``True`` answer is kept as the :attr:`reason`.

    Args:
        trigger: The stop trigger.
        kind: What its firing means: ``"max_epochs"`` for the manager's default trigger,
            ``"stop_trigger"`` for one the user passed.
    """

    __slots__ = ("_checked_at", "_kind", "_value", "due", "reached", "reason", "trigger")

    def __init__(self, trigger: Trigger, kind: StopKind) -> None:
        self.trigger = trigger
        self._kind: StopKind = kind
        #: The first iteration at which the trigger must be consulted; -1: not computed.
        self.due = -1
        #: Whether the manager saw the condition fire after an iteration (training is over).
        self.reached = False
        #: Why training ended; None while it goes on.
        self.reason: StopReason | None = None
        self._checked_at = -1
        self._value = False

    def invalidate(self) -> None:
        """Forgets the schedule and the last answer (the iteration count or epoch changed)."""
        self.due = -1
        self._checked_at = -1

    def reschedule(self, iteration: int, iters_per_epoch: int) -> int:
        """Recomputes :attr:`due` after ``iteration`` and returns it."""
        self.due = next_due(self.trigger, iteration, iters_per_epoch)
        return self.due

    def consult(self, manager: ManagerView, iteration: int, iters_per_epoch: int) -> bool:
        """Calls the trigger once for ``iteration``; later calls for it repeat the answer."""
        if iteration == self._checked_at:
            return self._value
        trigger = self.trigger
        value = bool(trigger(manager))
        self.due = next_due(trigger, iteration, iters_per_epoch)
        self._checked_at = iteration
        self._value = value
        if value and self.reason is None:
            self.reason = StopReason(self._kind, iteration, iteration / iters_per_epoch, trigger)
        return value

    def after_iteration(self, manager: ManagerView, iteration: int, iters_per_epoch: int) -> bool:
        """The manager's check once an iteration's extensions ran; True: training is over."""
        # An extension may have read manager.stop_trigger at this iteration already, moving
        # ``due`` past it: its answer (repeated by consult) still counts.
        due = self.due <= iteration or iteration == self._checked_at
        if due and self.consult(manager, iteration, iters_per_epoch):
            self.reached = True
        return self.reached

    def read(self, manager: ManagerView, iteration: int, iters_per_epoch: int) -> bool:
        """The answer for ``manager.stop_trigger``: consults the trigger only when it is due."""
        if self.reached:
            return True
        if iteration < self.due and iteration != self._checked_at:
            return False
        return self.consult(manager, iteration, iters_per_epoch)

    def record_error(self, error: BaseException, iteration: int, iters_per_epoch: int) -> None:
        """Records that ``error`` ended training, unless a stop trigger had fired before."""
        if self.reason is None:
            self.reason = StopReason("error", iteration, iteration / iters_per_epoch, error=error)
