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

if TYPE_CHECKING:
    from ppe_core.handler._logic import BaseLogic

__all__ = ["load_scaler_states", "offer_runtime_scaler", "runtime_scaler", "scaler_states"]


def runtime_scaler(runtime: object) -> torch.amp.GradScaler | None:
    """The ``grad_scaler`` in ``runtime``'s options, if any (a runtime whose ``__init__``
    skipped ``BaseRuntime``'s may have no options)."""
    options = getattr(runtime, "options", None)
    scaler = options.get("grad_scaler") if isinstance(options, Mapping) else None
    return scaler if isinstance(scaler, torch.amp.GradScaler) else None


def offer_runtime_scaler(logic: BaseLogic, runtimes: Iterable[object]) -> None:
    """Offers ``logic`` the first ``grad_scaler`` found in the ``runtimes``' options."""
    for runtime in runtimes:
        scaler = runtime_scaler(runtime)
        if scaler is not None:
            logic.offer_grad_scaler(scaler)
            return


def scaler_states(scalers: Mapping[str, torch.amp.GradScaler | None]) -> dict[str, Any]:
    """Each scaler's ``state_dict()`` under its key (scalers that are None left out)."""
    return {key: scaler.state_dict() for key, scaler in scalers.items() if scaler is not None}


def load_scaler_states(
    scalers: Mapping[str, torch.amp.GradScaler | None], state: Mapping[str, Any]
) -> None:
    """Restores each scaler from ``state`` under its key (skipped without the state or the
    scaler)."""
    for key, scaler in scalers.items():
        if scaler is not None and state.get(key) is not None:
            scaler.load_state_dict(state[key])
