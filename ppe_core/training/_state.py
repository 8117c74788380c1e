"""The manager's state dictionary: its layout (PPE's), saving, loading and mismatch messages."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    MissingExtensionStateWarning,
    StateDictKeyError,
    StateDictMismatchError,
    StateVersionWarning,
)
from ppe_core.training._extension import ExtensionEntry
from ppe_core.training._protocols import StateObjectProtocol
from ppe_core.training._resume import (
    RANKS_KEY,
    WORLD_SIZE_KEY,
    EpochLength,
    EpochLengthChangedWarning,
    rank_resume_states,
)
from ppe_core.training._state_mismatch import load_model_state, load_optimizer_state

__all__ = [
    "PPE_CORE_STATE_KEY",
    "PPE_FORMAT_VERSION",
    "VERSION_KEY",
    "EpochLength",
    "EpochLengthChangedWarning",
    "LoadedCounts",
    "ManagerState",
    "MissingExtensionStateWarning",
    "StateDictKeyError",
    "StateDictMismatchError",
    "StateVersionWarning",
    "TransformModel",
    "load_model_state",
    "load_optimizer_state",
    "warn_missing_extension_states",
]

#: ``transform_model(name, model)`` returns the module whose state is saved and observed.
TransformModel = Callable[[str, torch.nn.Module], torch.nn.Module]

#: The key under which ppe-core keeps its own resume data in a state dictionary. PPE's
#: ``load_state_dict`` ignores unknown top-level keys, so such states still load into PPE.
PPE_CORE_STATE_KEY = "_ppe_core"
#: The PPE release whose state format ppe-core writes, saved as ``state['ppe_version']``: PPE
#: warns on load unless that field equals its own version, so ppe-core's version goes under
#: ``state['_ppe_core']['version']`` instead.
PPE_FORMAT_VERSION = "0.9.0"
#: The key of ppe-core's own version in ``state['_ppe_core']``.
VERSION_KEY = "version"
# Keys of state['_ppe_core'] that are not resume states added by add_resume_state.
_RESERVED_RESUME_KEYS = frozenset({VERSION_KEY, WORLD_SIZE_KEY, RANKS_KEY})
# PPE releases whose states load without a StateVersionWarning (the format is the same).
_COMPATIBLE_PPE_VERSIONS = ("0.9.",)


class LoadedCounts:
    """What a loaded state restores beyond the objects: the counts to resume from."""

    __slots__ = ("execution", "iteration", "missing_extensions")

    def __init__(self, iteration: int, execution: int, missing_extensions: list[str]) -> None:
        self.iteration = iteration
        self.execution = execution
        #: Registered extensions the state had nothing for (they keep their state).
        self.missing_extensions = missing_extensions


def warn_missing_extension_states(missing: Sequence[str], *, stacklevel: int) -> None:
    """Warns that the loaded state has nothing for the registered extensions ``missing``."""
    warnings.warn(
        MissingExtensionStateWarning(
            f"the loaded state has no entry for the extensions {list(missing)}; they keep their "
            "current state (the state was saved without them, or under other names)"
        ),
        stacklevel=stacklevel + 1,
    )


class ManagerState:
    """What an ExtensionsManager saves and restores, and how.

    The layout is PPE's: ``{'_start_iteration': int, '_start_execution': int, 'models':
    {name: state}, 'optimizers': {name: state}, 'state_objects': {name: state},
    'extensions': {name: {'extension': ..., 'trigger': ...}}, 'ppe_version': str}``, so PPE's
    ``load_state_dict`` reads it; ``ppe_version`` is :data:`PPE_FORMAT_VERSION`. ppe-core's
    own version and resume data (a Trainer's RNG and loader states, its handler's state) go
    under :data:`PPE_CORE_STATE_KEY`, which PPE ignores.

    Args:
        models: The registered models by name (as registered, before ``transform_model``).
        optimizers: The optimizers by name (the manager's dictionary itself, so optimizers
            set later are saved too).
        state_objects: Further objects with ``state_dict``/``load_state_dict``.
        transform_model: The default ``(name, module) -> module`` whose result is saved.

    Raises:
        ArgumentTypeError: A state object lacks ``state_dict`` or ``load_state_dict``.
    """

    def __init__(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        state_objects: Mapping[str, StateObjectProtocol],
        transform_model: TransformModel,
    ) -> None:
        self._models = models
        self._optimizers = optimizers
        self._transform_model = transform_model
        self._objects: dict[str, StateObjectProtocol] = {}
        # State objects a state may lack (added by ppe-core for PPE's layout, not by the user).
        self._optional: set[str] = set()
        # ppe-core's own resume data, saved under PPE_CORE_STATE_KEY.
        self._internal: dict[str, StateObjectProtocol] = {}
        for name, obj in state_objects.items():
            self.add_state_object(name, obj)

    def add_state_object(
        self, name: str, obj: StateObjectProtocol, *, optional: bool = False
    ) -> None:
        """Saves ``obj`` under ``state['state_objects'][name]`` from now on.

        Args:
            name: Its key in ``'state_objects'``.
            obj: Anything with ``state_dict()`` and ``load_state_dict(state)``.
            optional: Whether a loaded state may lack it (then it keeps its state).

        Raises:
            ArgumentTypeError: ``obj`` lacks ``state_dict`` or ``load_state_dict``.
        """
        if not (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ):
            raise ArgumentTypeError(
                f"state object {name!r} must have state_dict() and load_state_dict(), got "
                f"{type(obj).__name__}"
            )
        self._objects[name] = obj
        if optional:
            self._optional.add(name)
        else:
            self._optional.discard(name)

    def add_resume_state(self, name: str, obj: StateObjectProtocol) -> None:
        """Saves ``obj`` under ``state['_ppe_core'][name]`` (a key PPE ignores).

        An empty ``obj.state_dict()`` is left out; a loaded state without the entry leaves
        ``obj`` as it is.

        Raises:
            ConfigurationError: ``name`` is one of the keys ppe-core itself writes there.
        """
        if name in _RESERVED_RESUME_KEYS:
            raise ConfigurationError(
                f"the resume-state name {name!r} is reserved ({sorted(_RESERVED_RESUME_KEYS)} "
                "are written by ppe-core itself); pass another name"
            )
        self._internal[name] = obj

    def resume_state_dict(self) -> dict[str, Any]:
        """ppe-core's own resume data (``state['_ppe_core']``), empty states left out."""
        internal = {name: obj.state_dict() for name, obj in self._internal.items()}
        return {name: value for name, value in internal.items() if value}

    def state_dict(
        self,
        iteration: int,
        execution: int,
        entries: Mapping[str, ExtensionEntry],
        transform_models: TransformModel | None = None,
    ) -> dict[str, Any]:
        """Returns the state in PPE's layout (see the class docstring)."""
        from ppe_core._version import __version__

        transform = self._transform_model if transform_models is None else transform_models
        state: dict[str, Any] = {
            "_start_iteration": iteration,
            "_start_execution": execution,
            "models": {name: transform(name, m).state_dict() for name, m in self._models.items()},
            "optimizers": {name: opt.state_dict() for name, opt in self._optimizers.items()},
            "state_objects": {name: obj.state_dict() for name, obj in self._objects.items()},
            "extensions": {name: entry.state_dict() for name, entry in entries.items()},
            "ppe_version": PPE_FORMAT_VERSION,
        }
        state[PPE_CORE_STATE_KEY] = {VERSION_KEY: __version__, **self.resume_state_dict()}
        return state

    def load_state_dict(
        self,
        to_load: Mapping[str, Any],
        entries: Mapping[str, ExtensionEntry],
        transform_models: TransformModel | None = None,
    ) -> LoadedCounts:
        """Restores models, optimizers, state objects and extensions from ``to_load``.

        Everything required is checked before anything is loaded. A registered extension
        without an entry in the state keeps its state; the caller warns about those
        (:func:`warn_missing_extension_states`) once it restored the counts.

        Returns:
            The iteration counts to resume from and the extensions the state lacks.

        Raises:
            StateDictKeyError: The state lacks the iteration or a registered model, optimizer
                or state object.
            StateDictMismatchError: A model's or optimizer's state does not fit it.
        """
        transform = self._transform_model if transform_models is None else transform_models
        model_states = _require(to_load, "models", self._models)
        optimizer_states = _require(to_load, "optimizers", self._optimizers)
        if "_start_iteration" not in to_load:
            raise StateDictKeyError(
                "the state has no '_start_iteration' entry; pass what trainer.state_dict() or "
                "manager.state_dict() returned (or a snapshot file loaded with torch.load)"
            )
        _check_version(to_load.get("ppe_version"))
        object_states: Mapping[str, Any] | None = None
        if "state_objects" in to_load and self._objects:
            required = [n for n in self._objects if n not in self._optional]
            object_states = _require(to_load, "state_objects", required)
        for name, model in self._models.items():
            load_model_state(name, transform(name, model), model_states[name])
        for name, optimizer in self._optimizers.items():
            load_optimizer_state(name, optimizer, optimizer_states[name])
        if object_states is not None:
            for name, obj in self._objects.items():
                if name in object_states:
                    obj.load_state_dict(object_states[name])
        extension_states: Mapping[str, Any] = to_load.get("extensions") or {}
        # Under torch.distributed each rank restores its own entry (see rank_resume_states).
        internal_states = rank_resume_states(to_load.get(PPE_CORE_STATE_KEY) or {})
        missing = []
        for name, entry in entries.items():
            if name in extension_states:
                entry.load_state_dict(extension_states[name])
            else:
                missing.append(name)
        for name, obj in self._internal.items():
            # Before the '_ppe_core' key, ppe-core kept the trainer state among the extensions.
            legacy = extension_states.get(f"_{name}", {}).get("extension")
            saved = internal_states.get(name, legacy)
            if saved is not None:
                obj.load_state_dict(saved)
        iteration = int(to_load["_start_iteration"])
        return LoadedCounts(iteration, int(to_load.get("_start_execution", iteration)), missing)


def _require(to_load: Mapping[str, Any], key: str, registered: Iterable[str]) -> Mapping[str, Any]:
    states = to_load.get(key)
    if not isinstance(states, Mapping):
        raise StateDictKeyError(
            f"the state has no {key!r} mapping (its keys: {sorted(map(str, to_load))}); pass "
            "what trainer.state_dict() or manager.state_dict() returned, not a model's own "
            "state_dict (load that with model.load_state_dict)"
        )
    missing = [name for name in registered if name not in states]
    if missing:
        raise StateDictKeyError(
            f"the state's {key!r} lacks {missing} (it holds {sorted(states)}); register "
            f"the {key} under the names they were saved with"
        )
    return states


def _check_version(saved: object) -> None:
    """Warns (as PPE does) when a state was written by another or an unknown version."""
    from ppe_core._version import __version__

    if saved == __version__ or (
        isinstance(saved, str) and saved.startswith(_COMPATIBLE_PPE_VERSIONS)
    ):
        return
    written = "an unknown version" if saved is None else f"version {saved}"
    warnings.warn(
        StateVersionWarning(
            f"the loaded state was written by {written} (ppe-core is {__version__}, compatible "
            "with PPE 0.9); it loads, but states from other versions may differ"
        ),
        stacklevel=4,
    )
