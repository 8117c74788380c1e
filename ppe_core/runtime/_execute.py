"""Code blocks: the runtime's unit of work, and how the generic runtimes execute one.

A :class:`CodeBlock` names a function, the optimizers that learn from it and whether to
backpropagate; the runtime that owns it runs it with ``runtime.execute(block, batch)``.
:func:`run_code_block` is that execution for the generic runtimes: zero_grad, forward,
backward, step. The block's builders (``ppe.handler.forward`` / ``update_parameters``) live in
the handler package; the type lives here, beside the contract that consumes it. Outputs that
give nothing to backpropagate raise an error saying why (PPE steps without gradients in silence).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import CodeBlockError

if TYPE_CHECKING:
    from ppe_core.runtime._runtime import BaseRuntime

__all__ = ["CodeBlock", "CodeBlockError", "call_with_batch", "run_code_block"]


@dataclass
class CodeBlock:
    """A function plus what to do around it, executed by ``runtime.execute(block, batch)``.

    Build one with ``ppe.handler.forward`` or ``ppe.handler.update_parameters`` and call it
    with a batch.

    Attributes:
        func: The function (a module or a module's bound method).
        optimizers: The optimizers stepped after the backward pass (none: forward only).
        backprop: Whether to backpropagate from the outputs.
        backprop_from: The output key to backpropagate (``None``: every scalar float output
            computed with autograd).
        backprop_to: Names where backpropagation stops; carried for runtimes that support it
            (the generic runtimes ignore it, as in PPE).
        state: Extra state for runtimes, saved by :meth:`state_dict`.
        runtime: The runtime that executes the block.
    """

    func: Callable[..., Any]
    optimizers: list[torch.optim.Optimizer]
    backprop: bool
    backprop_from: str | None
    backprop_to: set[str] | None
    state: dict[str, Any]
    runtime: BaseRuntime

    def state_dict(self) -> dict[str, Any]:
        """The block's state; entries that have a ``state_dict()`` are saved through it."""
        return {k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in self.state.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; stateful entries load in place."""
        for key, value in state.items():
            if hasattr(self.state.get(key), "load_state_dict"):
                self.state[key].load_state_dict(value)
            else:
                self.state[key] = value

    def __call__(self, inputs: Any) -> Any:
        return self.runtime.execute(self, inputs)


def call_with_batch(func: Any, batch: Any) -> Any:
    """Call ``func`` with a batch: a dict as keywords, a list/tuple positionally, else as is."""
    if type(batch) is dict or isinstance(batch, Mapping):  # a dict skips the ABC check
        return func(**batch)
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return func(*batch)
    return func(batch)


def run_code_block(
    code_block: CodeBlock,
    batch: Any,
    autocast: dict[str, Any] | None = None,
    grad_scaler: torch.amp.GradScaler | None = None,
) -> Any:
    """Execute ``code_block`` on ``batch`` and return its function's outputs.

    Args:
        code_block: What to run and which optimizers update from it.
        batch: The function's inputs (see :func:`call_with_batch`).
        autocast: ``torch.autocast`` keyword arguments for the forward pass, or ``None``.
        grad_scaler: Scales the backpropagated outputs and steps the optimizers, or ``None``.
    """
    optimizers = code_block.optimizers
    for optimizer in optimizers:
        optimizer.zero_grad()
    if autocast is None:
        out = call_with_batch(code_block.func, batch)
    else:
        with torch.autocast(**autocast):
            out = call_with_batch(code_block.func, batch)
    if code_block.backprop:
        tensors = _to_backprop(out, code_block.backprop_from)
        if grad_scaler is not None:
            tensors = [grad_scaler.scale(t) for t in tensors]
        torch.autograd.backward(tensors)
    if grad_scaler is None:
        for optimizer in optimizers:
            optimizer.step()
    elif optimizers:  # GradScaler.update needs a step first
        for optimizer in optimizers:
            grad_scaler.step(optimizer)
        grad_scaler.update()
    return out


def _to_backprop(out: Any, backprop_from: str | None) -> list[torch.Tensor]:
    """The outputs a block backpropagates: ``backprop_from``, else every scalar float loss."""
    if backprop_from is not None:
        value = out.get(backprop_from) if isinstance(out, Mapping) else None
        if not isinstance(value, torch.Tensor) or value.grad_fn is None:
            raise backprop_error(out, backprop_from)
        return [value]
    items = out.values() if isinstance(out, Mapping) else [out]
    tensors = [
        v
        for v in items
        if isinstance(v, torch.Tensor)
        and v.grad_fn is not None
        and v.numel() == 1
        and (v.dtype.is_floating_point or v.dtype.is_complex)
    ]
    if not tensors:
        raise backprop_error(out, None)
    return tensors


def backprop_error(out: Any, backprop_from: str | None) -> CodeBlockError:
    """Why a code block's outputs ``out`` give nothing to backpropagate: ``backprop_from`` is
    missing or not a tensor computed with autograd, or (``None``) no output is a one-element
    float tensor computed with autograd."""
    got = sorted(out) if isinstance(out, Mapping) else type(out).__name__
    if backprop_from is None:
        return CodeBlockError(
            f"update_parameters found nothing to backpropagate in the outputs {got}: no "
            "one-element float tensor computed with autograd. Return the loss, e.g. "
            "{'loss': loss}, or name it with backprop_from='loss'."
        )
    if not isinstance(out, Mapping) or backprop_from not in out:
        return CodeBlockError(
            f"update_parameters(backprop_from={backprop_from!r}) but the function returned "
            f"{got}; return a dict holding {backprop_from!r}, or fix backprop_from"
        )
    return CodeBlockError(
        f"the output {backprop_from!r} is not a tensor computed with autograd, so it "
        "cannot be backpropagated; compute it from the parameters (not under no_grad)"
    )
