"""Gradient accumulation, the Logic's ``grad_accumulation_steps`` option (PPE has none).

Batches are grouped into windows of ``grad_accumulation_steps``, restarting at each epoch and
cut at its end; the Logic zeroes the optimizers at a window's first batch and steps them at
its last, each loss divided by the window's size, so the update equals one step on the
concatenated batch. On the window's other batches a data-parallel model skips its gradient
reduction (:func:`no_sync`): DDP's ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``.
Nothing here runs per step without the option.

A snapshot taken inside a window holds the gradients accumulated so far (each rank's own,
unreduced; FSDP2's unsharded ones), and a resume puts them back before its first step, so that
it continues the window as the uninterrupted run does. They are read only when the state is
taken (no per-step cost but one attribute set); window-aligned states hold none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from ppe_core.errors import ConfigurationError, StateDictMismatchError

__all__ = ["WINDOW_STATE_KEY", "Accumulation", "no_sync"]

#: The Logic's ``state_dict()`` key of an unfinished window's gradients: ``{model name:
#: {parameter name: gradient}}`` (absent when the state is window-aligned).
WINDOW_STATE_KEY = "accumulation"


class Accumulation:
    """The window state of ``ppe.handler.Logic``'s ``grad_accumulation_steps`` option, owned by
    each Logic: where the epoch cuts the last window, and an unfinished window's gradients in
    snapshots. The Logic keeps the option and passes it in (its step reads it every batch)."""

    def __init__(self) -> None:
        #: Batches in the current epoch (``None``: the loader has no ``len()``).
        self.epoch_length: int | None = None
        #: The trainer's models while a window is unfinished (its gradients are training
        #: state), else None; set at each optimizer step, with the option only.
        self.open_window: Mapping[str, torch.nn.Module] | None = None
        #: A loaded unfinished window's gradients, put back at the next epoch start.
        self.loaded_window: Mapping[str, Mapping[str, torch.Tensor]] | None = None

    def begin_epoch(self, loader: Iterable[Any], models: Mapping[str, torch.nn.Module]) -> None:
        """At an epoch's start: its length, where the last window is cut; and a loaded
        window's gradients put back, once (per epoch, not per step)."""
        try:
            self.epoch_length = len(loader)  # type: ignore[arg-type]
        except TypeError:
            self.epoch_length = None
        loaded, self.loaded_window = self.loaded_window, None
        for name, grads in (loaded or {}).items():
            if name in models:
                restore_gradients(name, models[name], grads)

    def window(self, batch_idx: int, steps: int) -> tuple[int, bool]:
        """(size of the window of ``steps`` batches holding batch_idx, whether batch_idx ends
        it)."""
        start = batch_idx - batch_idx % steps
        end = start + steps if self.epoch_length is None else min(start + steps, self.epoch_length)
        return end - start, batch_idx + 1 >= end

    # Snapshots inside a window ----------------------------------------------------------------
    def state_dict(self, model_names: Iterable[str]) -> dict[str, Any]:
        """``{WINDOW_STATE_KEY: {model name: {parameter name: gradient}}}`` for the
        ``model_names`` the Logic trains while a window is unfinished, else ``{}``: the
        gradients as they are (this rank's, unreduced; scaled by the grad scaler, whose state
        is saved beside), not copied (a background snapshot copies the state before training
        goes on)."""
        models = self.open_window
        if models is None:
            return {}
        names = [name for name in model_names if name in models]
        return {WINDOW_STATE_KEY: {name: window_gradients(models[name]) for name in names}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Keeps a loaded window's gradients for the next epoch start (none: nothing to put
        back, the resume starts a window)."""
        self.loaded_window = state.get(WINDOW_STATE_KEY)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module of a (Distributed)DataParallel wrapper, so names lack ``module.``."""
    parallel = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    return model.module if isinstance(model, parallel) else model


def _fsdp_slots(model: torch.nn.Module) -> dict[int, Any]:
    """``id(sharded parameter) -> FSDP2's FSDPParam`` for the parameters FSDP2 manages.

    Inside a window FSDP2 keeps each parameter's gradient unsharded and unreduced in the
    FSDPParam (torch has no public name for it), not in the sharded parameter's ``.grad``.

    Raises:
        ConfigurationError: This torch's FSDP2 keeps them elsewhere.
    """
    slots: dict[int, Any] = {}
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if not callable(getattr(module, "set_requires_gradient_sync", None)) or get_state is None:
            continue
        groups = getattr(get_state(), "_fsdp_param_groups", None)
        if groups is None:
            raise ConfigurationError(
                f"torch {torch.__version__}'s FSDP2 keeps an accumulation window's gradients "
                "where ppe-core cannot read them, so a snapshot inside a window cannot hold "
                "them; take snapshots at window ends (a trigger that is a multiple of "
                "grad_accumulation_steps)"
            )
        for group in groups:
            for slot in group.fsdp_params:
                slots[id(slot.sharded_param)] = slot
    return slots


def window_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s gradients accumulated so far, by parameter name (parameters without one
    left out); FSDP2's unsharded ones for the parameters it manages."""
    slots = _fsdp_slots(model)
    grads: dict[str, torch.Tensor] = {}
    for name, parameter in _unwrapped(model).named_parameters():
        grad = parameter.grad
        slot = slots.get(id(parameter))
        if slot is not None:
            grad = slot.unsharded_accumulated_grad
            if grad is None and hasattr(slot, "_unsharded_param"):
                grad = slot._unsharded_param.grad
        if grad is not None:
            grads[name] = grad.detach()
    return grads


def restore_gradients(
    model_name: str, model: torch.nn.Module, grads: Mapping[str, torch.Tensor]
) -> None:
    """Puts :func:`window_gradients`' result back into ``model``; under FSDP2 as its own
    accumulated unsharded gradients, which its next backward adds to.

    Raises:
        StateDictMismatchError: A gradient names no parameter of ``model``, or does not fit it.
    """
    slots = _fsdp_slots(model)
    parameters = dict(_unwrapped(model).named_parameters())
    for name, grad in grads.items():
        parameter = parameters.get(name)
        slot = None if parameter is None else slots.get(id(parameter))
        if parameter is None:
            fits = "no such parameter"
        else:
            shape = tuple(parameter.shape if slot is None else slot._orig_size)
            fits = "" if tuple(grad.shape) == shape else f"shape {tuple(grad.shape)}, not {shape}"
        if fits:
            raise StateDictMismatchError(
                "the loaded state holds gradients of an unfinished accumulation window that do "
                f"not fit models[{model_name!r}] ({name!r}: {fits}); resume with the model "
                "that saved it, or remove state['_ppe_core']['handler']['logic']"
                f"[{WINDOW_STATE_KEY!r}] to resume without them (not the uninterrupted run)"
            )
        assert parameter is not None
        if slot is None:
            parameter.grad = grad.to(parameter.device, parameter.dtype)
        else:  # added to by FSDP2's next backward, reduced at the window's last
            slot.unsharded_accumulated_grad = grad.to(slot.device)


def no_sync(model: Any) -> contextlib.AbstractContextManager[Any]:
    """A context without gradient reduction for ``model`` (a no-op context when it has none)."""
    if hasattr(model, "no_sync"):  # DistributedDataParallel
        return model.no_sync()  # type: ignore[no-any-return]
    if callable(getattr(model, "set_requires_gradient_sync", None)):  # FSDP2's FSDPModule
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model: Any) -> Iterator[None]:
    """FSDP2 keeps the unsharded gradients and reduce-scatters them at the synced backward."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
