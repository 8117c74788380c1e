"""``ppe.compile``: a module (and optionally its optimizer step) through ``torch.compile``."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError

__all__ = ["compile"]


def compile(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    backend: Callable[..., Any] | None = None,
    *,
    generate_backward: bool = True,
    decompositions: builtins.dict[Any, Callable[..., Any]] | None = None,
) -> Callable[..., Any]:
    """Compile ``module`` as one graph; with ``optimizer``, each call is a whole training step.

    The module is captured with ``torch.compile(fullgraph=True)`` and lowered by AOT autograd
    to ATen graphs (forward and backward). ``backend`` compiles those graphs; without one they
    run as traced.

    Calling the result with an optimizer zeroes the gradients, runs forward, backpropagates
    from every output that requires grad (each seeded with ones, as if their sum were the
    loss), steps the optimizer and returns the outputs. Without an optimizer it is the compiled
    forward; call ``backward()`` on its outputs as usual.

    Args:
        module: The module to compile.
        optimizer: The module's optimizer, stepped inside each call.
        backend: ``fn(graph_module, example_inputs) -> callable``, a ``torch.compile`` custom
            backend; it receives the ATen forward and backward graphs.
        generate_backward: ``False`` compiles the forward pass only: the outputs do not
            require grad, so it cannot be combined with ``optimizer``.
        decompositions: ATen decompositions applied while tracing (default:
            ``torch._decomp.core_aten_decompositions()``).

    Returns:
        A callable taking the module's arguments.

    Raises:
        ArgumentTypeError: ``module`` is not a module, or ``optimizer`` not an optimizer.
        ConfigurationError: ``optimizer`` with ``generate_backward=False``.
        torch._dynamo.exc.Unsupported: on the first call, when the module's forward cannot be
            captured as a single graph (e.g. data-dependent control flow).
    """
    if not isinstance(module, torch.nn.Module):
        raise ArgumentTypeError(
            f"ppe.compile compiles a torch.nn.Module, got {type(module).__name__}; pass the "
            "model, e.g. ppe.compile(model, optimizer)"
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ArgumentTypeError(
            f"ppe.compile optimizer must be a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}; pass the model's optimizer or None"
        )
    if optimizer is not None and not generate_backward:
        raise ConfigurationError(
            "ppe.compile got an optimizer with generate_backward=False: a training step needs "
            "the backward pass. Drop generate_backward=False, or pass optimizer=None to "
            "compile inference only."
        )
    # Heavy: dynamo and AOT autograd load only when something is compiled.
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import (  # type: ignore[attr-defined]
        make_boxed_func,
    )

    if decompositions is None:
        decompositions = core_aten_decompositions()

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        compiled = gm if backend is None else backend(gm, example_inputs)
        return make_boxed_func(compiled)

    lowered = aot_autograd(
        fw_compiler=compile_graph, bw_compiler=compile_graph, decompositions=decompositions
    )
    compiled_module: Callable[..., Any] = torch.compile(module, fullgraph=True, backend=lowered)
    if not generate_backward:
        return _ForwardOnly(compiled_module)
    if optimizer is None:
        return compiled_module
    return _TrainStep(compiled_module, optimizer)


class _ForwardOnly:
    """Calls the compiled module with autograd off: no backward graph is traced."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self._compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return self._compiled(*args, **kwargs)


class _TrainStep:
    """zero_grad, compiled forward + backward, optimizer step; returns the outputs."""

    def __init__(self, compiled: Callable[..., Any], optimizer: torch.optim.Optimizer) -> None:
        self._compiled = compiled
        self._optimizer = optimizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch.utils._pytree as pytree

        self._optimizer.zero_grad()
        outputs = self._compiled(*args, **kwargs)
        tensors = [
            t
            for t in pytree.tree_leaves(outputs)
            if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        if not tensors:
            raise ConfigurationError(
                "ppe.compile with an optimizer: no output of the module requires grad, so "
                "there is nothing to backpropagate; return the loss computed from the "
                "parameters"
            )
        torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])
        self._optimizer.step()
        return outputs
