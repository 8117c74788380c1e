"""``DistributedDataParallel`` with PPE's constructor and state-dict layout, on torch's DDP."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import torch

from ppe_core.errors import ConfigurationError

__all__ = ["DistFunc", "DistributedDataParallel", "HookFun", "Tensors"]

#: PPE's type aliases at this path, for annotations in PPE code: one tensor or a tuple of them,
#: PPE's custom collective (``reduce_function``/``broadcast_function``, refused here) and a
#: hook taking the module.
Tensors: TypeAlias = tuple[torch.Tensor, ...] | torch.Tensor
_Group: TypeAlias = torch.distributed.ProcessGroup | None
DistFunc: TypeAlias = Callable[[Sequence[torch.Tensor], _Group], None]
HookFun: TypeAlias = Callable[["DistributedDataParallel"], None]


def _buffers_keyword() -> str:
    parameters = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    return "forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers"


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """PyTorch's ``DistributedDataParallel`` accepting PPE's arguments.

    PPE 0.9 ships its own DDP module; ppe-core keeps PyTorch's (bucketed all-reduce overlapped
    with backward) and maps PPE's arguments onto it, so ``ppe.nn.parallel.
    DistributedDataParallel(model)`` keeps working. Like PPE's, :meth:`state_dict` and
    :meth:`load_state_dict` use the wrapped module's keys (no ``module.`` prefix), so
    snapshots load into unwrapped models and back. ``no_sync()`` skips the all-reduce, as in
    both. Every ``torch.nn.parallel.DistributedDataParallel`` keyword (``device_ids``,
    ``gradient_as_bucket_view``, ...) is passed through.

    Args:
        module: The model to replicate; its parameters must be on the device to train on.
        broadcast_buffers: Broadcast rank 0's buffers (e.g. BatchNorm statistics) at every
            forward.
        negotiate_grads: Let parameters go without gradients in some steps (dynamic graphs);
            mapped onto torch's ``find_unused_parameters``. Pass False for a static graph:
            it saves a graph traversal per step.
        process_group: Group to synchronize over; the default group when None.
        reduce_function: PPE's custom all-reduce; not supported (use
            ``register_comm_hook``).
        broadcast_function: PPE's custom broadcast; not supported.
        **kwargs: Passed to ``torch.nn.parallel.DistributedDataParallel``.

    Raises:
        ConfigurationError: ``reduce_function`` or ``broadcast_function`` was given.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        broadcast_buffers: bool = True,
        negotiate_grads: bool = True,
        process_group: Any | None = None,
        reduce_function: Any | None = None,
        broadcast_function: Any | None = None,
        **kwargs: Any,
    ) -> None:
        if reduce_function is not None or broadcast_function is not None:
            raise ConfigurationError(
                "ppe_core.nn.parallel.DistributedDataParallel does not take reduce_function/"
                "broadcast_function (PyTorch's DDP does the communication); customize the "
                "gradient all-reduce with register_comm_hook(state, hook) instead"
            )
        kwargs.setdefault("find_unused_parameters", negotiate_grads)
        if not broadcast_buffers:
            # Newer torch deprecates broadcast_buffers for forward_sync_buffers, which (like
            # PPE) still syncs the buffers once at construction.
            kwargs.setdefault(_buffers_keyword(), False)
        super().__init__(module, process_group=process_group, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """Returns the wrapped module's state dict (keys without ``module.``), as PPE does."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Loads a state dict of the wrapped module (keys without ``module.``)."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)
