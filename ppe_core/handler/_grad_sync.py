"""The gradient-synchronisation switch of a data-parallel model, for gradient accumulation.

DDP's ``no_sync()`` and FSDP2's ``set_requires_gradient_sync(False)`` both skip the gradient
reduction on the accumulation window's non-final batches. Asked only when accumulating, on
those batches: nothing per step otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["no_sync_of"]


def no_sync_of(
    model: torch.nn.Module,
) -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
    """A context factory without gradient reduction for ``model``, or None when it has none."""
    no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel
    if no_sync is not None:
        return no_sync  # type: ignore[no-any-return]
    if callable(getattr(model, "set_requires_gradient_sync", None)):  # FSDP2's FSDPModule
        return lambda: _fsdp_no_sync(model)
    return None


@contextlib.contextmanager
def _fsdp_no_sync(model: Any) -> Iterator[None]:
    """FSDP2 keeps the unsharded gradients and reduce-scatters them at the synced backward."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
