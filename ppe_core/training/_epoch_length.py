"""Epochs whose length is known only when the loader runs out (an ``IterableDataset``, a
generator, a stream): the manager counts with a provisional length until then
(``ExtensionsManager.set_epoch_length``, which refuses triggers that cannot wait for it:
:func:`check_triggers`), and the Trainer reads the first epoch one batch ahead. Every epoch's
end is checked against the length (PPE ends a short epoch in silence); a loaded state's is
checked by ``_resume.EpochLength``. A pass's length itself comes from :func:`optional_length`
(PPE takes ``len(loader)`` unchecked)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ppe_core.errors import ConfigurationError
from ppe_core.training.triggers import NEVER, Trigger, next_due
from ppe_core.training.triggers._due import DueCheck

if TYPE_CHECKING:
    from ppe_core.training._manager import ExtensionsManager
    from ppe_core.training._resume import TrainerState

__all__ = [
    "PROVISIONAL_EPOCH_LENGTH",
    "check_epoch_end",
    "check_given_length",
    "check_triggers",
    "due_checks",
    "optional_length",
    "run_first_epoch",
]

#: The epoch length the manager counts with while the first epoch's is unknown: beyond any
#: run, so no epoch-based trigger is due before the loader runs out and the real length is set.
PROVISIONAL_EPOCH_LENGTH = 2**48

#: What ``next(batches, _END)`` returns when the loader has run out.
_END: Any = object()


def optional_length(loader: Iterable[Any], given: int | None, argument: str) -> int | None:
    """The number of batches to take from ``loader``: ``given``, else ``len(loader)``, else
    None for a loader without ``len()`` (it is read until it runs out); a clear error for a
    ``given`` that is not a positive int and for an empty loader."""
    if given is not None:
        check_given_length(given, argument)
        return given
    try:
        length = len(loader)  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset's loader, a generator, a stream
        return None
    if length < 1:
        raise ConfigurationError(
            f"the loader ({type(loader).__name__}) is empty: len() is {length}. Check the "
            "dataset, and batch_size with drop_last=True (a dataset smaller than one batch "
            "yields nothing)."
        )
    return length


def check_given_length(given: object, argument: str) -> None:
    """Refuses a ``train_len``/``eval_len`` (``argument``) that is not a positive int (PPE
    takes it as it is)."""
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise ConfigurationError(
            f"{argument} must be a positive int, got {given!r}; pass the number of batches "
            f"to take per pass, or leave it out for len(loader)"
        )


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
        for value in vars(extension).values() if hasattr(extension, "__dict__") else ():
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


def check_epoch_end(
    manager: ExtensionsManager,
    loader: Iterable[Any],
    batches: Iterator[Any],
    *,
    sized: bool,
    first: int,
) -> None:
    """Refuses an epoch whose loader ran out (no stop trigger fired) with another number of
    batches than the epoch length: ``first`` is the iteration it started at, ``sized`` whether
    the length came from ``len()`` or ``train_len`` rather than the first epoch.

    Raises:
        ConfigurationError: The loader yielded no batch (an iterator read once), fewer than the
            epoch length, or (without ``len()``) more.
    """
    iters_per_epoch = manager.iters_per_epoch
    if not sized and manager.iteration == first:
        raise ConfigurationError(
            f"the train loader ({type(loader).__name__}) yielded no "
            f"batches in epoch {manager.epoch + 1}: an iterator or "
            "generator can be read only once. Pass an iterable that starts "
            "again on each iter() (a DataLoader over an IterableDataset, a "
            "class with __iter__), or train one epoch (max_epochs=1)"
        )
    done = manager.iteration % iters_per_epoch
    if done != 0:
        raise ConfigurationError(
            f"the train loader ran out after {done} batches but the epoch "
            f"length is {iters_per_epoch}; pass the real train_len, or "
            "leave train_len out to use len(train_loader)"
            if sized
            else f"the train loader (no len()) ran out after {done} batches "
            f"but its first epoch had {iters_per_epoch}; every epoch of a "
            "loader without len() must have as many batches (drop the "
            "last incomplete batch, or pass train_len=<batches per epoch>)"
        )
    if not sized and next(batches, _END) is not _END:
        raise ConfigurationError(
            f"the train loader (no len()) yields more batches than the "
            f"{iters_per_epoch} of its first epoch; every epoch of a loader "
            "without len() must have as many batches (or pass "
            "train_len=<batches per epoch> to cut each epoch there)"
        )


def run_first_epoch(
    trainer: Any,
    manager: ExtensionsManager,
    state: TrainerState,
    batches: Iterator[Any],
    begin: Callable[[], None],
    end: Callable[[], bool],
    train_step: Callable[[Any, int, Any], Any],
    profile: Any,
) -> None:
    """The first epoch over a loader without ``len()``, read one batch ahead.

    The batch after each step is read before the step's iteration ends, so when the loader
    runs out the manager learns the epoch length before the last iteration's extensions
    run: epoch triggers and ``max_epochs`` fire there, as with a known length. Where an
    extension that saves state (a snapshot) is due, the RNG and loader states are held
    from before that read, so a resume continues with the batch read ahead.
    """
    batch_idx = manager.iteration  # > 0 when resuming inside the first epoch
    batch = next(batches, _END)
    if batch is _END:
        raise ConfigurationError(
            f"the train loader ({type(state.loader).__name__}, no len()) yielded no "
            f"batches after {batch_idx}; check the dataset, and batch_size with "
            "drop_last=True (a dataset smaller than one batch yields nothing)"
        )
    while True:
        begin()
        train_step(trainer, batch_idx, batch)
        held = manager.needs_model_state()
        if held:
            state.hold()
        try:
            following = next(batches, _END)
        except BaseException:
            # The step succeeded: its iteration ends (as a sized loader's would, before
            # the next read), then the loader's error propagates.
            try:
                end()
            finally:
                state.release()
            raise
        if following is _END:
            manager.set_epoch_length(batch_idx + 1)
        try:
            stop = end()
        finally:
            if held:
                state.release()
        if profile is not None:
            profile.step()
        if stop or following is _END:
            return
        batch = following
        batch_idx += 1
