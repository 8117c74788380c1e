"""Epochs whose length is known only when the loader runs out (an ``IterableDataset``, a
generator, a stream): the manager counts with a provisional length until then."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ppe_core.errors import ConfigurationError
from ppe_core.training.triggers import NEVER, Trigger, next_due
from ppe_core.training.triggers._due import DueCheck

__all__ = ["PROVISIONAL_EPOCH_LENGTH", "check_triggers", "due_checks"]

#: The epoch length the manager counts with while the first epoch's is unknown: beyond any
#: run, so no epoch-based trigger is due before the loader runs out and the real length is set.
PROVISIONAL_EPOCH_LENGTH = 2**48


def _inner_triggers(extension: object) -> Iterator[tuple[str, object]]:
    """The triggers an extension keeps for itself (LogReport's ``trigger=``, ...)."""
    for attribute, value in vars(extension).items() if hasattr(extension, "__dict__") else ():
        if isinstance(value, DueCheck):
            yield attribute, value.trigger
        elif isinstance(value, Trigger):
            yield attribute, value


def due_checks(extensions: Iterable[object]) -> Iterator[DueCheck]:
    """The :class:`DueCheck` schedules held by ``extensions`` (reset once the length is known)."""
    for extension in extensions:
        if hasattr(extension, "__dict__"):
            for value in vars(extension).values():
                if isinstance(value, DueCheck):
                    yield value


def check_triggers(named: Iterable[tuple[str, Any, object]], iteration: int) -> None:
    """Refuses triggers that need the epoch length before the first epoch has ended.

    A trigger needs it when its next due iteration depends on the epoch length and falls
    inside the first epoch (``(0.5, 'epoch')``, ``ManualScheduleTrigger([0.25], 'epoch')``):
    with a loader of unknown length there is no such iteration to fire at. Triggers due at
    the end of an epoch or later (``(1, 'epoch')``, ``max_epochs``) and iteration- or
    time-based ones are fine.

    Args:
        named: ``(extension name, extension or None, trigger)`` of every registered entry
            (and the stop trigger).
        iteration: The completed iterations so far (a resumed first epoch starts later).

    Raises:
        ConfigurationError: A trigger needs the epoch length in the first epoch.
    """
    length = PROVISIONAL_EPOCH_LENGTH
    for name, extension, trigger in named:
        candidates: list[tuple[str, object]] = [("trigger", trigger)]
        if extension is not None:
            candidates.extend(_inner_triggers(extension))
        for attribute, candidate in candidates:
            due = next_due(candidate, iteration, length)
            if due < length and due != NEVER and due != next_due(candidate, iteration, 2 * length):
                where = name if attribute == "trigger" else f"{name} (its {attribute.lstrip('_')})"
                raise ConfigurationError(
                    f"{where} uses {candidate!r}, which needs the epoch length within the first "
                    "epoch, but the train loader has no len(), so the length is known only when "
                    "the loader runs out. Use an iteration-based trigger such as (100, "
                    "'iteration'), a whole number of epochs, or pass "
                    "trainer.run(..., train_len=<batches per epoch>)"
                )
