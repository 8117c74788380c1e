"""What a snapshot needs beyond weights to resume bit-exactly: RNG states and epoch order,
for each rank under torch.distributed, and the epoch length, checked on load; kept under the
state's ``'_ppe_core'`` key (:class:`ResumeStates`) by a manager that a trainer reaches as a
:class:`ResumeStateHost`."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ppe_core.distributed import group_world
from ppe_core.errors import (
    ConfigurationError,
    EpochLengthChangedWarning,
    WorldSizeMismatchWarning,
)
from ppe_core.training._state import PPE_CORE_STATE_KEY

if TYPE_CHECKING:
    from ppe_core.training._protocols import StateObjectProtocol

__all__ = [
    "ELAPSED_TIME_KEY",
    "RANKS_KEY",
    "STOP_TRIGGER_KEY",
    "VERSION_KEY",
    "WORLD_SIZE_KEY",
    "EpochLength",
    "EpochLengthChangedWarning",
    "ResumeStateHost",
    "ResumeStates",
    "TrainerState",
    "WorldSizeMismatchWarning",
    "attach_resume_state",
    "rank_resume_states",
    "record_ranks",
]

#: Under ``state['_ppe_core']``: the number of processes of the run that saved the state.
WORLD_SIZE_KEY = "world_size"
#: Under ``state['_ppe_core']``: every rank's own resume data, in rank order (a snapshot
#: gathers them); the entries beside it are the saving rank's, as in a single process.
RANKS_KEY = "ranks"
#: Under ``state['_ppe_core']``: the ppe-core version that saved the state.
VERSION_KEY = "version"
#: Under ``state['_ppe_core']``: the manager's stop trigger's state (PPE saves none).
STOP_TRIGGER_KEY = "stop_trigger"
#: Under ``state['_ppe_core']``: the manager's elapsed time when the state was saved.
ELAPSED_TIME_KEY = "elapsed_time"
# Keys of state['_ppe_core'] that add_resume_state may not take: ppe-core writes them itself.
_RESERVED_KEYS = frozenset(
    {VERSION_KEY, WORLD_SIZE_KEY, RANKS_KEY, STOP_TRIGGER_KEY, ELAPSED_TIME_KEY}
)


class ResumeStates:
    """The resume data a manager saves under ``state['_ppe_core']``, by name.

    PPE's ``load_state_dict`` ignores that key, so the state still loads into PPE; PPE's
    states lack it, and the objects then keep their state.
    """

    def __init__(self) -> None:
        self._objects: dict[str, StateObjectProtocol] = {}

    def add(self, name: str, obj: StateObjectProtocol, *, builtin: bool = False) -> None:
        """Saves ``obj`` under ``name`` from now on.

        Args:
            name: Its key.
            obj: Anything with ``state_dict()`` and ``load_state_dict(state)``.
            builtin: The manager's own entry (the stop trigger's), which may take a reserved key.

        Raises:
            ConfigurationError: ``name`` is a key ppe-core writes there itself.
        """
        if name in _RESERVED_KEYS and not builtin:
            raise ConfigurationError(
                f"the resume-state name {name!r} is reserved ({sorted(_RESERVED_KEYS)} "
                "are written by ppe-core itself); pass another name"
            )
        self._objects[name] = obj

    def state_dict(self) -> dict[str, Any]:
        """Every object's state by name, empty states left out."""
        states = {name: obj.state_dict() for name, obj in self._objects.items()}
        return {name: state for name, state in states.items() if state}

    def load_state_dict(self, saved: Mapping[str, Any], extensions: Mapping[str, Any]) -> None:
        """Restores each object that ``saved`` (this rank's entries) has a state for.

        Args:
            saved: This rank's entries of the loaded ``state['_ppe_core']``.
            extensions: The loaded ``state['extensions']``: before the ``'_ppe_core'`` key,
                ppe-core kept the trainer state there, as an extension named ``_<name>``.
        """
        for name, obj in self._objects.items():
            state = saved.get(name, extensions.get(f"_{name}", {}).get("extension"))
            if state is not None:
                obj.load_state_dict(state)

    def load_from(self, to_load: Mapping[str, Any]) -> None:
        """Restores the objects from a loaded manager state: from this rank's entries of its
        ``'_ppe_core'`` (:func:`rank_resume_states`), else from its ``'extensions'``."""
        saved = rank_resume_states(to_load.get(PPE_CORE_STATE_KEY) or {})
        self.load_state_dict(saved, to_load.get("extensions") or {})


def record_ranks(
    internal: dict[str, Any], world_size: int, rank_states: Sequence[Mapping[str, Any]] | None
) -> None:
    """Adds the world size and, when given, every rank's resume data to ``internal``.

    Args:
        internal: ``state['_ppe_core']`` of what ``manager.state_dict()`` returned (changed
            in place).
        world_size: The number of processes of this run.
        rank_states: ``manager.resume_state_dict()`` of every rank, in rank order; None when
            they could not be gathered (the saving rank's entries then stand for every rank).
    """
    internal[WORLD_SIZE_KEY] = world_size
    if rank_states is not None:
        internal[RANKS_KEY] = [dict(entry) for entry in rank_states]


def rank_resume_states(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """The resume data this rank restores from a loaded ``state['_ppe_core']``.

    Its own entry when the state holds one per rank and the world size is the same; otherwise
    the saving rank's (a single process's state, or one saved without every rank's).

    Warns:
        WorldSizeMismatchWarning: The state records another world size than this run's.
    """
    world, rank = group_world()
    saved_world = saved.get(WORLD_SIZE_KEY)
    if isinstance(saved_world, int) and saved_world != world:
        warnings.warn(
            WorldSizeMismatchWarning(
                f"the loaded state was saved by a run of {saved_world} process(es) and this run "
                f"has {world}. Resumed exactly: the weights, the optimizer states and the "
                "iteration counts. Not resumed exactly: each rank's RNG states and loader "
                "position (every rank restores the saving rank's), and the data is split "
                f"differently over {world} process(es), so this is not the run the saved one "
                f"would have continued. Resume with {saved_world} process(es) to continue it "
                "exactly, or use another output directory to train anew (resuming across "
                "world sizes is not supported)."
            ),
            stacklevel=6,
        )
        return saved
    ranks = saved.get(RANKS_KEY)
    if isinstance(ranks, Sequence) and len(ranks) == world and isinstance(ranks[rank], Mapping):
        return {**saved, **ranks[rank]}
    return saved


class EpochLength:
    """The manager's iterations per epoch as resume data, ``state['_ppe_core']['manager']``,
    and whether they are known yet.

    Saved so that a resume can tell whether the epoch length changed (None while unknown, so
    that a resume learns it again). Loading keeps the saved value (:attr:`loaded`) until the
    manager knows its own length and compares the two (:meth:`check`), or takes it
    (:meth:`after_load`).

    Args:
        current: Returns the manager's iterations per epoch now.
    """

    def __init__(self, current: Callable[[], int]) -> None:
        self._current = current
        #: False while the length is a placeholder: an IgniteExtensionsManager's before its
        #: engine starts, a Trainer's in the first epoch over a loader without ``len()``.
        self.known = True
        #: Whether the length is learnt when the first epoch's loader runs out.
        self.learns = False
        #: The loaded state's iterations per epoch; None until one is loaded (or after use).
        self.loaded: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"iters_per_epoch": self._current() if self.known else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = state.get("iters_per_epoch")
        self.loaded = saved if isinstance(saved, int) and not isinstance(saved, bool) else None

    def check(self, iteration: int, *, stacklevel: int) -> None:
        """Warns when the loaded epoch length differs from the current one, then forgets it."""
        saved, self.loaded = self.loaded, None
        current = self._current() if self.known else None
        if saved is None or current is None or saved < 1 or saved == current:
            return
        warnings.warn(
            EpochLengthChangedWarning(
                f"the loaded state was saved with {saved} iterations per epoch, but this run has "
                f"{current} (the dataset length or the batch size changed). Training resumes at "
                f"iteration {iteration}, which was epoch {iteration / saved:.2f} and is epoch "
                f"{iteration / current:.2f} now: epoch boundaries shift, so epoch-based "
                "triggers (evaluation, LogReport, snapshots, max_epochs) fire at other "
                "iterations than in the saved run, and the resumed epoch is not the saved "
                "one's. Resume with the same dataset and batch size to continue the saved run "
                "exactly; if the change is intended, this warning can be filtered"
            ),
            stacklevel=stacklevel + 1,
        )

    def after_load(
        self, to_load: Mapping[str, Any], iteration: int, *, stacklevel: int
    ) -> int | None:
        """After the manager state ``to_load`` was loaded at ``iteration``: warns if it had
        another length than a known one (:meth:`check`). Returns the saved length for the
        manager to take when it learns its own and the saved run had learnt it already, else
        None (an unknown length that is not learnt, IgniteExtensionsManager's, is checked when
        the engine starts)."""
        if self.loaded is None:
            # A state without ppe-core's entry: PPE's IgniteExtensionsManager saves the length.
            self.load_state_dict({"iters_per_epoch": to_load.get("_epoch_length")})
        if self.known:
            self.check(iteration, stacklevel=stacklevel + 1)
        elif self.learns:
            saved, self.loaded = self.loaded, None
            return saved
        return None


class ResumeStateHost(Protocol):
    """Where a trainer registers what it needs saved beyond the models and optimizers.

    ``ExtensionsManager`` implements it; ``attach_resume_state`` uses it for the Trainer's RNG
    and loader states and its handler's state.
    """

    def add_state_object(
        self, name: str, obj: StateObjectProtocol, *, optional: bool = False
    ) -> None: ...

    def add_resume_state(self, name: str, obj: StateObjectProtocol) -> None: ...


def attach_resume_state(manager: ResumeStateHost, state: TrainerState, handler: Any) -> None:
    """Makes ``manager`` save what a Trainer needs to resume.

    The trainer state and the handler's state (its GradScaler's, ...) travel under the
    state dictionary's ``'_ppe_core'`` key, which PPE's ``load_state_dict`` ignores; a
    handler without ``state_dict``/``load_state_dict``, or with an empty state, adds nothing.
    """
    manager.add_resume_state("trainer_state", state)
    if callable(getattr(handler, "state_dict", None)) and callable(
        getattr(handler, "load_state_dict", None)
    ):
        manager.add_resume_state("handler", handler)
        if handler.state_dict().get("grad_scaler") is not None:
            # Also where PPE's create_trainer(options={'grad_scaler': ...}) keeps it, so that
            # snapshots move between PPE and ppe-core with the scaler's state.
            manager.add_state_object(PPE_GRAD_SCALER_KEY, _GradScalerMirror(handler), optional=True)


#: The ``state_objects`` name PPE's ``create_trainer`` gives ``options={'grad_scaler': ...}``.
PPE_GRAD_SCALER_KEY = "options___::__grad_scaler"


class _GradScalerMirror:
    """The handler's GradScaler state as a state object under PPE's name."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler

    def state_dict(self) -> dict[str, Any]:
        return dict(self._handler.state_dict().get("grad_scaler") or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self._handler.load_state_dict({"grad_scaler": state_dict})


def _numpy_state() -> dict[str, Any] | None:
    try:
        import numpy as np
    except ImportError:
        return None
    state: Any = np.random.get_state()
    name, keys, pos, has_gauss, gauss = state
    # Plain types and a tensor only, so the snapshot loads with weights_only=True.
    return {
        "name": str(name),
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }


def _set_numpy_state(state: dict[str, Any] | None) -> None:
    if state is None:
        return
    import numpy as np

    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["name"], keys, state["pos"], state["has_gauss"], state["gauss"]))


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _set_python_state(state: list[Any]) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def _loader_generators(loader: Iterable[Any]) -> list[torch.Generator]:
    """Generators that decide a loader's order: its own and its samplers' (deduplicated)."""
    found: list[torch.Generator] = []
    for owner in (
        loader,
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(g is not generator for g in found):
            found.append(generator)
    return found


class TrainerState:
    """Carries RNG states and the epoch's order-deciding state through snapshots.

    The Trainer registers it with its manager, which saves it under
    ``state["_ppe_core"]["trainer_state"]`` (a key PPE ignores). Under torch.distributed
    every rank has its own (per-rank seeds, per-rank data draws): a snapshot gathers every
    rank's under ``state["_ppe_core"]["ranks"]`` and each rank restores its own
    (:func:`rank_resume_states`). At each epoch start it records the
    RNG states that decide the loader's order; ``state_dict`` adds the current states of the
    torch, numpy and Python generators, the loader's generators and every runtime (device
    RNGs). On resume the trainer rebuilds the interrupted epoch from the epoch-start states
    (same sample order), skips the consumed batches, then restores the current states.

    Args:
        runtimes: Returns the runtimes whose device RNG states are saved.
    """

    def __init__(self, runtimes: Callable[[], list[Any]]) -> None:
        self._runtimes = runtimes
        self._epoch_start: dict[str, Any] | None = None
        self.loader: Iterable[Any] = ()
        self.pending: dict[str, Any] | None = None  # loaded, applied at the next epoch start
        self._held: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        if self._held is not None:
            return dict(self._held)
        state = {
            "torch": torch.get_rng_state(),
            "numpy": _numpy_state(),
            "python": _python_state(),
            "devices": [runtime.rng_state() for runtime in self._runtimes()],
            "loader": [g.get_state() for g in _loader_generators(self.loader)],
            "epoch_start": self._epoch_start,
        }
        if _stateful(self.loader):
            state["loader_state"] = self.loader.state_dict()  # type: ignore[attr-defined]
        return state

    def hold(self) -> None:
        """Keeps the current states as what :meth:`state_dict` returns until :meth:`release`.

        A loader without ``len()`` is read one batch ahead (to know which batch ends the
        epoch); the trainer holds the states before that read, so that a snapshot taken in the
        step's extensions resumes before the batch read ahead, as with a sized loader.
        """
        self._held = None
        self._held = self.state_dict()

    def release(self) -> None:
        """Back to the current states (see :meth:`hold`)."""
        self._held = None

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        missing = {"torch", "python"} - set(to_load)
        if missing:
            from ppe_core.errors import StateDictKeyError

            raise StateDictKeyError(
                f"the saved trainer state lacks {sorted(missing)}; it was not written by "
                "ppe-core's Trainer. Remove the entry from the state to resume without RNG "
                "states (the run then continues, but not bit-exactly)."
            )
        self.pending = dict(to_load)

    def start_epoch(self, loader: Iterable[Any], skip: int) -> Iterator[Any]:
        """An iterator over the epoch from batch ``skip``, with RNG states as in the original.

        Without loaded state this records the epoch-start states and starts the epoch.
        """
        self.loader = loader
        state, self.pending = self.pending, None
        if state is not None and skip == 0:
            # Saved at an epoch boundary: the states then are the next epoch's start states.
            self._restore_current(state, loader)
            state = None
        if state is None or state.get("epoch_start") is None:
            self._record_epoch_start(loader)
            batches = _resume_batches(loader, skip, state)
            if state is not None:
                self._restore_current(state, loader)
            return batches
        epoch_start = state["epoch_start"]
        torch.set_rng_state(epoch_start["torch"])
        for generator, saved in zip(
            _loader_generators(loader), epoch_start["loader"], strict=False
        ):
            generator.set_state(saved)
        self._epoch_start = epoch_start
        # Draws the epoch's order exactly as the original did.
        batches = _resume_batches(loader, skip, state)
        self._restore_current(state, loader)
        return batches

    def _record_epoch_start(self, loader: Iterable[Any]) -> None:
        self._epoch_start = {
            "torch": torch.get_rng_state(),
            "loader": [g.get_state() for g in _loader_generators(loader)],
        }

    def _restore_current(self, state: dict[str, Any], loader: Iterable[Any]) -> None:
        torch.set_rng_state(state["torch"])
        _set_numpy_state(state.get("numpy"))
        _set_python_state(state["python"])
        for runtime, saved in zip(self._runtimes(), state.get("devices") or [], strict=False):
            if saved is not None:
                runtime.set_rng_state(saved)
        for generator, saved in zip(
            _loader_generators(loader), state.get("loader") or [], strict=False
        ):
            generator.set_state(saved)


class _SkipFirst(torch.utils.data.Sampler[list[int]]):
    """A batch sampler that drops the first ``n`` batches without loading them.

    :meth:`prime` draws the skipped indices; the trainer calls it right after creating the
    loader's iterator so random draws happen in the same order as in an uninterrupted epoch
    (the loader's base seed first, then the sampler's).
    """

    def __init__(self, batch_sampler: Iterable[list[int]], n: int) -> None:
        self._batch_sampler = batch_sampler
        self._n = n
        self._primed: Iterator[list[int]] | None = None

    def prime(self) -> None:
        if self._primed is None:
            batches = iter(self._batch_sampler)
            for _ in range(self._n):
                next(batches, None)
            self._primed = batches

    def __iter__(self) -> Iterator[list[int]]:
        self.prime()
        batches, self._primed = self._primed, None
        assert batches is not None
        yield from batches

    def __len__(self) -> int:
        total = len(self._batch_sampler) if isinstance(self._batch_sampler, Sized) else 0
        return max(0, total - self._n)


def _stateful(loader: object) -> bool:
    """Whether the loader saves its own position (torchdata's ``StatefulDataLoader``)."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def _resume_batches(
    loader: Iterable[Any], n: int, state: Mapping[str, Any] | None
) -> Iterator[Any]:
    """The epoch from batch ``n``: from the loader's own saved position when it has one.

    A loader with ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``)
    over a dataset that has them too restores its position, so consumed batches are not read
    again. Any other loader is re-read from the epoch's start by :func:`_skip`; so is a
    ``StatefulDataLoader`` over a dataset without a state, whose own fast-forward miscounts
    after a resume (torchdata 0.11: a second resume ran past the end of the data).
    """
    saved = state.get("loader_state") if state is not None else None
    if n and saved is not None and _stateful(getattr(loader, "dataset", None)):
        loader.load_state_dict(saved)  # type: ignore[attr-defined]
        return iter(loader)
    return _skip(loader, n)


def _skip(loader: Iterable[Any], n: int) -> Iterator[Any]:
    """Iterate ``loader`` from batch ``n`` in the order an uninterrupted epoch would have.

    For a single-process map-style ``DataLoader`` the consumed batches' indices are drawn (so
    the order is the same) but their samples are never loaded; the main-process RNG they
    would have used is restored from the snapshot afterwards. Worker processes keep RNG
    states a snapshot cannot capture (random augmentation in workers), and batches are dealt
    to workers round-robin, so with ``num_workers > 0`` (and for other iterables) the batches
    are read and dropped to reproduce them exactly.
    """
    if (
        n
        and isinstance(loader, torch.utils.data.DataLoader)
        and loader.batch_sampler is not None
        and loader.num_workers == 0
    ):
        sampler = _SkipFirst(loader.batch_sampler, n)
        clone = _clone_with_batch_sampler(loader, sampler)
        if clone is not None:
            clone_batches = iter(clone)
            sampler.prime()
            return clone_batches
    batches = iter(loader)
    for _ in range(n):
        next(batches)
    return batches


def _clone_with_batch_sampler(
    loader: torch.utils.data.DataLoader[Any], batch_sampler: _SkipFirst
) -> torch.utils.data.DataLoader[Any] | None:
    kwargs: dict[str, Any] = {
        "batch_sampler": batch_sampler,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "generator": loader.generator,
    }
    try:
        return torch.utils.data.DataLoader(loader.dataset, **kwargs)
    except (TypeError, ValueError):  # an unusual subclass: fall back to reading the batches
        return None
