"""The manager's state dictionary: its layout (PPE's), saving, loading and mismatch messages."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core._version import __version__
from ppe_core.errors import StateVersionWarning
from ppe_core.training._manager_checks import check_state_object
from ppe_core.training._protocols import StateObjectProtocol
from ppe_core.training._resume import VERSION_KEY, ResumeStates, rank_resume_states
from ppe_core.training._state_mismatch import (
    load_model_state,
    load_optimizer_state,
    require_iteration,
    require_states,
)

if TYPE_CHECKING:
    from ppe_core.training._schedule import Schedule

__all__ = [
    "PPE_CORE_STATE_KEY",
    "PPE_FORMAT_VERSION",
    "VERSION_KEY",
    "ManagerState",
    "TransformModel",
]

#: ``transform_model(name, model)`` returns the module whose state is saved and observed.
TransformModel = Callable[[str, torch.nn.Module], torch.nn.Module]

#: The key under which ppe-core keeps its own resume data in a state dictionary. PPE's
#: ``load_state_dict`` ignores unknown top-level keys, so such states still load into PPE.
PPE_CORE_STATE_KEY = "_ppe_core"
#: The PPE release whose state format ppe-core writes, saved as ``state['ppe_version']``: PPE
#: warns on load unless that field equals its own version, so ppe-core's version goes under
#: ``state['_ppe_core']['version']`` (:data:`VERSION_KEY`) instead.
PPE_FORMAT_VERSION = "0.9.0"
# PPE releases whose states load without a StateVersionWarning (the format is the same).
_COMPATIBLE_PPE_VERSIONS = ("0.9.",)


class ManagerState:
    """What an ExtensionsManager saves and restores, and how: the manager's base class.

    The layout is PPE's: ``{'_start_iteration': int, '_start_execution': int, 'models':
    {name: state}, 'optimizers': {name: state}, 'state_objects': {name: state},
    'extensions': {name: {'extension': ..., 'trigger': ...}}, 'ppe_version': str}``, so PPE's
    ``load_state_dict`` reads it; ``ppe_version`` is :data:`PPE_FORMAT_VERSION`. ppe-core's
    own version and resume data (a Trainer's RNG and loader states, its handler's state) go
    under :data:`PPE_CORE_STATE_KEY`, which PPE ignores.

    The manager sets the attributes annotated here; the state reads them when saving and sets
    the counts when loading.

    Args:
        state_objects: Further objects with ``state_dict``/``load_state_dict``.

    Raises:
        ArgumentTypeError: A state object lacks ``state_dict`` or ``load_state_dict``.
    """

    #: The registered models by name (as registered, before ``transform_model``).
    _models: dict[str, torch.nn.Module]
    #: The optimizers by name (optimizers set later are saved too).
    _optimizers: dict[str, torch.optim.Optimizer]
    #: The default ``(name, module) -> module`` whose result is saved.
    _transform_model: TransformModel
    _schedule: Schedule
    _iteration: int
    _start_iteration: int
    execution: int

    def __init__(self, state_objects: Mapping[str, StateObjectProtocol]) -> None:
        self._objects: dict[str, StateObjectProtocol] = {}
        # State objects a state may lack (added by ppe-core for PPE's layout, not by the user).
        self._optional: set[str] = set()
        # ppe-core's own resume data, saved under PPE_CORE_STATE_KEY.
        self._resume_states = ResumeStates()
        for name, obj in state_objects.items():
            self.add_state_object(name, obj)

    def add_state_object(
        self, name: str, obj: StateObjectProtocol, *, optional: bool = False
    ) -> None:
        """Saves ``obj`` under ``state_dict()['state_objects'][name]`` from now on.

        Like the ``state_objects=`` argument; for parts (a trainer, a handler) that join later.

        Args:
            name: Its key in ``'state_objects'``.
            obj: Anything with ``state_dict()`` and ``load_state_dict(state)``.
            optional: Whether a loaded state may lack it (it then keeps its state).

        Raises:
            ArgumentTypeError: ``obj`` lacks ``state_dict`` or ``load_state_dict``.
        """
        check_state_object(name, obj)
        self._objects[name] = obj
        if optional:
            self._optional.add(name)
        else:
            self._optional.discard(name)

    def add_resume_state(self, name: str, obj: StateObjectProtocol) -> None:
        """Saves ``obj`` under ``state_dict()['_ppe_core'][name]``, a key PPE ignores.

        For ppe-core's own resume data (a Trainer's RNG and loader states, its handler's
        state): PPE's ``load_state_dict`` still reads the state. An empty
        ``obj.state_dict()`` is left out; a loaded state without the entry leaves ``obj`` as
        it is.

        Raises:
            ConfigurationError: ``name`` is a key ppe-core writes there itself (``version``,
                ``world_size``, ``ranks``).
        """
        self._resume_states.add(name, obj)

    def resume_state_dict(self) -> dict[str, Any]:
        """This process's own resume data: what :meth:`state_dict` keeps under ``'_ppe_core'``.

        Empty states are left out. Under torch.distributed it differs between ranks (each
        rank's RNG and loader states); a snapshot gathers it from every rank so that each rank
        resumes with its own.
        """
        return self._resume_states.state_dict()

    def state_dict(self, *, transform_models: TransformModel | None = None) -> dict[str, Any]:
        """Returns the training state in PPE's layout (see the class docstring).

        PPE's ``load_state_dict`` reads it. With the standard extensions it holds only
        tensors, numbers, strings and containers, so ``torch.load(..., weights_only=True)``
        reads it.

        Args:
            transform_models: ``(name, module) -> module`` whose result's state is saved;
                the manager's ``transform_model`` by default.
        """
        transform = self._transform_model if transform_models is None else transform_models
        return {
            "_start_iteration": self._iteration,
            "_start_execution": self.execution,
            "models": {name: transform(name, m).state_dict() for name, m in self._models.items()},
            "optimizers": {name: opt.state_dict() for name, opt in self._optimizers.items()},
            "state_objects": {name: obj.state_dict() for name, obj in self._objects.items()},
            "extensions": {name: e.state_dict() for name, e in self._schedule.entries.items()},
            "ppe_version": PPE_FORMAT_VERSION,
            PPE_CORE_STATE_KEY: {VERSION_KEY: __version__, **self.resume_state_dict()},
        }

    def _load_state(
        self, to_load: Mapping[str, Any], transform_models: TransformModel | None
    ) -> list[str]:
        """Restores models, optimizers, state objects, extensions and the counts.

        Everything required is checked before anything is loaded. A registered extension
        without an entry in the state keeps its state; the caller warns about those once the
        counts are restored.

        Returns:
            The registered extensions the state has nothing for.

        Raises:
            StateDictKeyError: The state lacks the iteration or a registered model, optimizer
                or state object.
            StateDictMismatchError: A model's or optimizer's state does not fit it.
        """
        transform = self._transform_model if transform_models is None else transform_models
        model_states = require_states(to_load, "models", self._models)
        optimizer_states = require_states(to_load, "optimizers", self._optimizers)
        require_iteration(to_load)
        _check_version(to_load.get("ppe_version"))
        object_states: Mapping[str, Any] = {}
        if "state_objects" in to_load and self._objects:
            required = [n for n in self._objects if n not in self._optional]
            object_states = require_states(to_load, "state_objects", required)
        for name, model in self._models.items():
            load_model_state(name, transform(name, model), model_states[name])
        for name, optimizer in self._optimizers.items():
            load_optimizer_state(name, optimizer, optimizer_states[name])
        for name, obj in self._objects.items():
            if name in object_states:
                obj.load_state_dict(object_states[name])
        extension_states: Mapping[str, Any] = to_load.get("extensions") or {}
        # Under torch.distributed each rank restores its own entry (see rank_resume_states).
        internal_states = rank_resume_states(to_load.get(PPE_CORE_STATE_KEY) or {})
        missing = [name for name in self._schedule.entries if name not in extension_states]
        for name, entry in self._schedule.entries.items():
            if name in extension_states:
                entry.load_state_dict(extension_states[name])
        self._resume_states.load_state_dict(internal_states, extension_states)
        iteration = self._start_iteration = self._iteration = int(to_load["_start_iteration"])
        self.execution = int(to_load.get("_start_execution", iteration))
        return missing


def _check_version(saved: object) -> None:
    """Warns (as PPE does) when a state was written by another or an unknown version."""
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
