"""Why training ended: ``manager.stop_reason`` and ``trainer.stop_reason``.

PPE's manager only answers whether to stop. ppe-core keeps which condition ended training (the
default ``max_epochs``, the user's stop trigger, or an error) and when, for logs and for code
that must tell a finished run from a failed or early-stopped one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ppe_core.training.triggers import Trigger

__all__ = ["StopKind", "StopReason"]

StopKind = Literal["max_epochs", "stop_trigger", "error"]


@dataclass(frozen=True)
class StopReason:
    """Which condition ended training, and when.

    Read it as ``trainer.stop_reason`` or ``manager.stop_reason`` (None while training goes
    on). ``str()`` gives a sentence for logs, e.g. ``"stop_trigger EarlyStoppingTrigger(...)
    fired at iteration 14 (epoch 1.75)"``.

    Attributes:
        kind: ``"max_epochs"``, ``"stop_trigger"`` or ``"error"`` (see :data:`StopKind`).
        iteration: Completed iterations when training ended.
        epoch_detail: The same as a fraction of epochs.
        trigger: The stop trigger that fired; None for ``"error"``.
        error: The exception that ended training; None unless ``kind == "error"``.
    """

    kind: StopKind
    iteration: int
    epoch_detail: float
    trigger: Trigger | None = None
    error: BaseException | None = None

    def __str__(self) -> str:
        when = f"at iteration {self.iteration} (epoch {self.epoch_detail:g})"
        if self.kind == "error":
            return f"error {type(self.error).__name__}: {self.error} {when}"
        return f"{self.kind} {self.trigger!r} fired {when}"
