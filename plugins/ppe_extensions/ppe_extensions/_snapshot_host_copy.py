"""The host copy of a background snapshot's state, its large buffers refilled each time.

A background save reads the state while training goes on changing the live tensors, so the
snapshot first copies the state to host memory of its own (PPE's background writers save the
live tensors). Allocating fresh host buffers costs page faults on every snapshot; the large
ones are therefore kept and refilled by the next snapshot of the same shapes.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ppe_core.runtime import map_tensors

__all__ = ["BufferKey", "host_copy"]

#: Host copies of tensors at least this large are kept for the next snapshot and refilled:
#: allocating a fresh buffer of that size costs page faults on every snapshot (about 30 ms
#: for 50 MB), several times the copy itself.
_REUSE_BYTES = 1 << 16

BufferKey = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


def _reuse_key(t: torch.Tensor) -> BufferKey | None:
    """Key of a host buffer ``t`` can be copied into, or None for tensors always copied afresh.

    Only plain dense tensors (no subclass, quantized, sparse or conjugate/negative views) large
    enough to matter; a refilled buffer is then identical to ``t.to("cpu", copy=True)``.
    """
    if (
        type(t) not in (torch.Tensor, torch.nn.Parameter)
        or t.layout is not torch.strided
        or t.is_quantized
        or t.is_conj()
        or t.is_neg()
        or t.numel() * t.element_size() < _REUSE_BYTES
        or not t.is_contiguous()
    ):
        return None
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


def host_copy(obj: Any, reuse: dict[BufferKey, list[torch.Tensor]] | None = None) -> Any:
    """A copy of a state whose tensors are host tensors of their own and whose other values are
    deep copies: what a background save reads while training goes on changing the originals.

    Args:
        obj: The state (nested containers of tensors and other values).
        reuse: Host buffers no save reads any more (those of the previous snapshot, whose save
            finished). Large tensors are copied into a matching one instead of a new
            allocation; on return it holds this copy's large buffers, for the next call.
    """
    if reuse is None:
        return map_tensors(obj, lambda t: t.detach().to("cpu", copy=True), leaf=copy.deepcopy)
    free, used = dict(reuse), reuse
    used.clear()

    def copy_tensor(t: torch.Tensor) -> torch.Tensor:
        key = _reuse_key(t)
        if key is None:
            return t.detach().to("cpu", copy=True)
        buffers = free.get(key)
        if buffers:
            host = buffers.pop()
            host.copy_(t.detach())
        else:
            host = t.detach().to("cpu", copy=True)
        used.setdefault(key, []).append(host)
        return host

    return map_tensors(obj, copy_tensor, leaf=copy.deepcopy)
