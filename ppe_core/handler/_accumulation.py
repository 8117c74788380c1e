"""Gradient accumulation, the Logic's ``grad_accumulation_steps`` option (PPE has none).

Batches are grouped into windows of ``grad_accumulation_steps``, restarting at each epoch and
cut at its end; the optimizers are zeroed at a window's first batch and stepped at its last,
each loss divided by the window's size, so the update equals one step on the concatenated
batch. On the window's other batches a data-parallel model skips its gradient reduction: DDP's
``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``. Nothing here runs per step
without the option.

A snapshot taken inside a window holds the gradients accumulated so far (each rank's own,
unreduced; FSDP2's unsharded ones), and a resume puts them back before its first step, so that
it continues the window as the uninterrupted run does. They are read only when the state is
taken (no per-step cost but one attribute set); window-aligned states hold none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import ConfigurationError, StateDictMismatchError

__all__ = ["WINDOW_STATE_KEY", "Accumulation", "no_sync"]

#: The Logic's ``state_dict()`` key of an unfinished window's gradients: ``{model name:
#: {parameter name: gradient}}`` (absent when the state is window-aligned).
WINDOW_STATE_KEY = "accumulation"


class Accumulation:
    """The accumulation part of ``ppe.handler.Logic``'s step, mixed into it.

    Attributes:
        grad_accumulation_steps: The option: batches per optimizer step (1: no accumulation).
    """

    grad_accumulation_steps: int = 1
    #: Batches in the current epoch (``None``: the loader has no ``len()``).
    _epoch_length: int | None = None
    #: The trainer's models while a window is unfinished (its gradients are training state),
    #: else None; set at each optimizer step (``train_step_optimizers``) with the option only.
    _open_window: Mapping[str, torch.nn.Module] | None = None
    #: A loaded unfinished window's gradients, put back at the next epoch start.
    _loaded_window: Mapping[str, Mapping[str, torch.Tensor]] | None = None

    if TYPE_CHECKING:

        def _forward_backward(self, model: torch.nn.Module, batch: Any, window: int) -> Any: ...

        def _window_model_names(self) -> list[str]: ...

    def _measure_epoch(self, loader: Iterable[Any]) -> None:
        """At an epoch's start: its length, where the last window is cut."""
        try:
            self._epoch_length = len(loader)  # type: ignore[arg-type]
        except TypeError:
            self._epoch_length = None

    def _window(self, batch_idx: int) -> tuple[int, bool]:
        """(size of the accumulation window holding batch_idx, whether batch_idx ends it)."""
        n = self.grad_accumulation_steps
        start = batch_idx - batch_idx % n
        end = start + n if self._epoch_length is None else min(start + n, self._epoch_length)
        return end - start, batch_idx + 1 >= end

    def _accumulate(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch_idx: int, batch: Any
    ) -> Any:
        """One batch of a window: zero_grad at its first, the loss divided by its size, no
        gradient reduction before its last (the optimizer steps there, in
        ``train_step_optimizers``)."""
        window, ends = self._window(batch_idx)
        if batch_idx % self.grad_accumulation_steps == 0:
            optimizer.zero_grad()
        with contextlib.nullcontext() if ends else no_sync(model):
            return self._forward_backward(model, batch, window)

    # Snapshots inside a window ----------------------------------------------------------------
    def _window_state(self) -> dict[str, Any]:
        """``{WINDOW_STATE_KEY: {model name: {parameter name: gradient}}}`` while a window is
        unfinished, else ``{}``: the gradients as they are (this rank's, unreduced; scaled by
        the grad scaler, whose state is saved beside), not copied (a background snapshot
        copies the state before training goes on)."""
        models = self._open_window
        if models is None:
            return {}
        names = [name for name in self._window_model_names() if name in models]
        return {WINDOW_STATE_KEY: {name: window_gradients(models[name]) for name in names}}

    def _load_window_state(self, state: Mapping[str, Any]) -> None:
        """Keeps a loaded window's gradients for the next epoch start (none: nothing to put
        back, the resume starts a window)."""
        self._loaded_window = state.get(WINDOW_STATE_KEY)

    def _restore_window(self, models: Mapping[str, torch.nn.Module]) -> None:
        """At an epoch start: puts a loaded window's gradients back, once (per epoch, not
        per step)."""
        loaded, self._loaded_window = self._loaded_window, None
        if loaded is None:
            return
        for name, grads in loaded.items():
            if name in models:
                restore_gradients(name, models[name], grads)


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
