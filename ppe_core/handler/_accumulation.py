"""Gradient accumulation, the Logic's ``grad_accumulation_steps`` option (PPE has none).

Batches are grouped into windows of ``grad_accumulation_steps``, restarting at each epoch and
cut at its end; the optimizers are zeroed at a window's first batch and stepped at its last,
each loss divided by the window's size, so the update equals one step on the concatenated
batch. On the window's other batches a data-parallel model skips its gradient reduction: DDP's
``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``. Nothing here runs per step
without the option.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

__all__ = ["Accumulation", "no_sync"]


class Accumulation:
    """The accumulation part of ``ppe.handler.Logic``'s step, mixed into it.

    Attributes:
        grad_accumulation_steps: The option: batches per optimizer step (1: no accumulation).
    """

    grad_accumulation_steps: int = 1
    #: Batches in the current epoch (``None``: the loader has no ``len()``).
    _epoch_length: int | None = None

    if TYPE_CHECKING:

        def _forward_backward(self, model: torch.nn.Module, batch: Any, window: int) -> Any: ...

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
