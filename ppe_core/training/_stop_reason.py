"""The manager's stop condition (:class:`StopCondition`), and why training ended:
``manager.stop_reason`` and ``trainer.stop_reason``.

PPE's manager only answers whether to stop, and calls a stateful stop trigger again whenever
asked. ppe-core consults it once per iteration, saves its state and last answer with a snapshot,
and keeps which condition ended training (the default ``max_epochs``, the user's stop trigger,
or an error) and when, for logs and for code that must tell a finished run from a failed or
early-stopped one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ppe_core.training._manager_checks import check_max_epochs
from ppe_core.training.triggers import Trigger, get_trigger, next_due

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

__all__ = ["StopCondition", "StopKind", "StopReason", "max_epochs_trigger", "reached_length"]

StopKind = Literal["max_epochs", "stop_trigger", "error"]


def reached_length(
    trigger: Trigger | None, iteration: int, iters_per_epoch: int
) -> tuple[float, str] | None:
    """The training length ``trigger`` announces when ``iteration`` reached it, else None.

    A stop trigger that fires because training reached its full length (``max_epochs``, an
    ``EarlyStoppingTrigger``'s ``max_trigger``) did not stop early: the reason names the length
    instead of "fired". Triggers that announce no length (a function, a bad ``max_trigger``)
    give None.
    """
    get_length = getattr(trigger, "get_training_length", None)
    if get_length is None:
        return None
    try:
        period, unit = get_length()
    except Exception:  # a trigger that cannot tell its length: no length reached
        return None
    if unit == "epoch":
        reached = iteration >= period * iters_per_epoch
    elif unit == "iteration":
        reached = iteration >= period
    else:
        return None
    return (period, unit) if reached else None


def _length_text(length: tuple[float, str]) -> str:
    period, unit = length
    return f"{period:g} {unit}{'' if period == 1 else 's'}"


@dataclass(frozen=True)
class StopReason:
    """Which condition ended training, and when.

    Read it as ``trainer.stop_reason`` or ``manager.stop_reason`` (None while training goes
    on). ``str()`` gives a sentence for logs, e.g. ``"stop_trigger EarlyStoppingTrigger(...)
    fired at iteration 14 (epoch 1.75)"`` for an early stop, ``"max_epochs (3) reached at
    iteration 24 (epoch 3)"`` for a full run, and ``"stop_trigger EarlyStoppingTrigger(...)
    reached its maximum (3 epochs) at iteration 24 (epoch 3)"`` when the early-stopping
    trigger ended training at its ``max_trigger``, not early.

    Attributes:
        kind: ``"max_epochs"``, ``"stop_trigger"`` or ``"error"`` (see :data:`StopKind`).
        iteration: Completed iterations when training ended.
        epoch_detail: The same as a fraction of epochs.
        trigger: The stop trigger that fired; None for ``"error"``.
        error: The exception that ended training; None unless ``kind == "error"``.
        length: The training length ``(period, unit)`` the stop trigger announces, when
            training ended by reaching it (a full run); None for an early stop or an error.
    """

    kind: StopKind
    iteration: int
    epoch_detail: float
    trigger: Trigger | None = None
    error: BaseException | None = None
    length: tuple[float, str] | None = None

    def __str__(self) -> str:
        when = f"at iteration {self.iteration} (epoch {self.epoch_detail:g})"
        if self.kind == "error":
            return f"error {type(self.error).__name__}: {self.error} {when}"
        if self.length is not None:
            if self.kind == "max_epochs" and self.length[1] == "epoch":
                return f"max_epochs ({self.length[0]:g}) reached {when}"
            return (
                f"{self.kind} {self.trigger!r} reached its maximum ({_length_text(self.length)}) "
                f"{when}"
            )
        return f"{self.kind} {self.trigger!r} fired {when}"


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
    """The manager's stop trigger, consulted at most once per iteration, and why training ended.

    The manager consults it at the iterations the trigger's ``next_check`` announces
    (:attr:`due`), by whichever asks first: the manager after an iteration's extensions ran, or
    a read of ``manager.stop_trigger``. Both get the same answer for the same iteration
    (stateful triggers need that); the first True one, or an error, is the :attr:`reason`.

    It is also the stop trigger's resume state, ``state['_ppe_core']['stop_trigger']``: the
    trigger's own state (an ``EarlyStoppingTrigger``'s best value and count of checks) and the
    answer at the iteration it last consulted it, so that a snapshot taken after that call
    resumes without calling it again for that iteration (PPE saves neither). A stateless
    trigger (``max_epochs``') saves nothing.

    Args:
        trigger: The stop trigger.
        kind: ``"max_epochs"`` for the default ``(max_epochs, 'epoch')``, else
            ``"stop_trigger"``.
    """

    def __init__(self, trigger: Trigger, kind: StopKind) -> None:
        self.trigger = trigger
        self.kind = kind
        #: The first iteration at which the trigger may fire; -1 until the manager's schedule
        #: is built.
        self.due = -1
        #: The iteration of the last answer (-1: none), and that answer.
        self.checked_at, self.value = -1, False
        #: Whether the manager saw the condition fire after an iteration.
        self.stopped = False
        #: Why training ended; None while it goes on.
        self.reason: StopReason | None = None
        #: Whether the last loaded state had an entry (the manager warns when it had none).
        self.loaded = False

    def consult(self, manager: ManagerView, iteration: int, iters_per_epoch: int) -> bool:
        """Calls the trigger once for ``iteration``; later calls for it repeat the answer."""
        if iteration == self.checked_at:
            if self.value:  # also when restored with the state (the first reason counts)
                self.record(self.kind, iteration, iters_per_epoch, self.trigger)
            return self.value
        value = bool(self.trigger(manager))
        self.due = next_due(self.trigger, iteration, iters_per_epoch)
        self.checked_at, self.value = iteration, value
        if value:
            self.record(self.kind, iteration, iters_per_epoch, self.trigger)
        return value

    def record(
        self,
        kind: StopKind,
        iteration: int,
        iters_per_epoch: int,
        trigger: Trigger | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Records why training ended at ``iteration``: the stop ``trigger`` that fired or the
        ``error``; only the first reason counts."""
        if self.reason is None:
            # A full run (max_epochs, an EarlyStoppingTrigger at its max_trigger) says so
            # rather than "fired".
            length = (
                None if error is not None else reached_length(trigger, iteration, iters_per_epoch)
            )
            self.reason = StopReason(
                kind, iteration, iteration / iters_per_epoch, trigger, error, length
            )

    def state_dict(self) -> dict[str, Any]:
        trigger = self.trigger.state_dict()
        if not trigger:
            return {}
        return {"trigger": trigger, "checked_at": self.checked_at, "value": self.value}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.trigger.load_state_dict(state["trigger"])
        self.checked_at = int(state["checked_at"])
        self.value = bool(state["value"])
        self.loaded = True
