"""Why training ended: ``manager.stop_reason`` and ``trainer.stop_reason``.

PPE's manager only answers whether to stop. ppe-core keeps which condition ended training (the
default ``max_epochs``, the user's stop trigger, or an error) and when, for logs and for code
that must tell a finished run from a failed or early-stopped one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ppe_core.training.triggers import Trigger

__all__ = ["StopKind", "StopReason", "reached_length"]

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
