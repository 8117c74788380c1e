"""Grad scalers beyond the Logic's ``grad_scaler`` option: the runtime's scaler adopted, and
every scaler's state saved with the trainer.

PPE's Logic scales losses with its ``grad_scaler`` option only, and no snapshot holds a
scaler's state, so a resumed mixed-precision run starts again from the initial scale. Here the
Handler offers the Logic the scaler its model's runtime was given (e.g. ppe_cuda with fp16
autocast), and the Handler's and the Logic's ``state_dict`` carry each scaler's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.handler._optimizer_targets import StagedSteps

if TYPE_CHECKING:
    from ppe_core.handler._logic import BaseLogic
    from ppe_core.runtime import BaseRuntime

__all__ = ["HandlerScalerState", "LogicScalerState", "offer_runtime_scaler"]


def offer_runtime_scaler(logic: BaseLogic, runtimes: Iterable[object]) -> None:
    """Offers ``logic`` the first ``grad_scaler`` found in the ``runtimes``' options (a runtime
    whose ``__init__`` skipped ``BaseRuntime``'s may have no options)."""
    for runtime in runtimes:
        options = getattr(runtime, "options", None)
        scaler = options.get("grad_scaler") if isinstance(options, Mapping) else None
        if isinstance(scaler, torch.amp.GradScaler):
            logic.offer_grad_scaler(scaler)
            return


class LogicScalerState(StagedSteps):
    """The grad scalers' part of ``ppe.handler.Logic``, mixed into it: the runtime's scaler
    adopted, the scalers' state (each optimizer's own with the staged steps) saved and
    restored."""

    def offer_grad_scaler(self, scaler: torch.amp.GradScaler) -> None:
        """Scale losses with the runtime's scaler unless a ``grad_scaler`` option was given."""
        if self._grad_scaler is None:
            self._grad_scaler = scaler
            self._plan = None

    def state_dict(self) -> dict[str, Any]:
        """``{"grad_scaler": scaler.state_dict()}`` with a grad scaler, else ``{}``; with
        the ``optimizers`` option, also ``"grad_scalers"``: the state of each optimizer's own
        scaler, by optimizer name; inside a gradient-accumulation window, also
        ``"accumulation"``: the window's gradients so far (see ``_accumulation``)."""
        state = {} if self._grad_scaler is None else {"grad_scaler": self._grad_scaler.state_dict()}
        own = self._own_scalers()
        if own:
            state["grad_scalers"] = {name: scaler.state_dict() for name, scaler in own.items()}
        state.update(self._window_state())  # inside an accumulation window: its gradients
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the grad scalers' states (each ignored when this logic has no such scaler),
        and keep an unfinished window's gradients for the resumed epoch's start."""
        _load_states({"grad_scaler": self._grad_scaler}, state)
        _load_states(self._own_scalers(), state.get("grad_scalers", {}))
        self._load_window_state(state)


class HandlerScalerState:
    """The snapshot state of ``ppe.handler.Handler``, mixed into it: the grad scaler's state
    and the rest of the logic's."""

    # The Handler's attributes used here.
    _logic: BaseLogic
    _entry_runtime: BaseRuntime

    def _grad_scaler(self) -> torch.amp.GradScaler | None:
        """The logic's grad scaler, else the one given in the runtime options."""
        scaler = self._logic.get_grad_scaler() or self._entry_runtime.options.get("grad_scaler")
        return scaler if isinstance(scaler, torch.amp.GradScaler) else None

    def state_dict(self) -> dict[str, Any]:
        """``{"grad_scaler": scaler.state_dict()}`` when training with a grad scaler (from
        the options or the runtime options), and ``"logic"``: the rest of the logic's
        ``state_dict()`` (each optimizer's own grad scaler, ...) when it has more; saved in
        trainer snapshots."""
        scaler = self._grad_scaler()
        state = {} if scaler is None else {"grad_scaler": scaler.state_dict()}
        logic = {k: v for k, v in self._logic.state_dict().items() if k != "grad_scaler"}
        if logic:
            state["logic"] = logic
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the grad scaler's state (ignored without a grad scaler) and the logic's."""
        _load_states({"grad_scaler": self._grad_scaler()}, state)
        logic = state.get("logic")
        if isinstance(logic, Mapping) and logic:
            self._logic.load_state_dict(logic)


def _load_states(
    scalers: Mapping[str, torch.amp.GradScaler | None], state: Mapping[str, Any]
) -> None:
    """Restores each scaler from ``state`` under its key (skipped without the state or the
    scaler)."""
    for key, scaler in scalers.items():
        if scaler is not None and state.get(key) is not None:
            scaler.load_state_dict(state[key])
