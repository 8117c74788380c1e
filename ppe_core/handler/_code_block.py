"""Building code blocks (``forward``, ``update_parameters``) and the Logic that runs them.

A code block names a function, the optimizers that learn from it and whether to backpropagate;
the runtime of the module it belongs to (``ppe.to``) executes it with ``runtime.execute``, so a
device that compiles or stages work sees the whole step at once. The :class:`CodeBlock` type
is part of the runtime contract (``ppe_core.runtime._execute``) and re-exported here at PPE's
path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ppe_core.errors import ArgumentTypeError, CodeBlockError, ConfigurationError, NoRuntimeError
from ppe_core.handler._logic import ModelLogic
from ppe_core.handler._optimizer_targets import code_block_optimizers, pop_optimizer_names
from ppe_core.runtime import get_runtime
from ppe_core.runtime._execute import CodeBlock

__all__ = ["CodeBlock", "CodeBlockError", "CodeBlockLogic", "forward", "update_parameters"]


def forward(block: Callable[..., Any]) -> CodeBlock:
    """A :class:`CodeBlock` that runs ``block``'s forward pass on its module's runtime.

    Args:
        block: A module moved with ``ppe.to``, a bound method of one, or a code block.

    Raises:
        NoRuntimeError: the module was not moved with ``ppe.to`` (also a ``RuntimeError``).
        ArgumentTypeError: ``block`` is not callable.
    """
    if isinstance(block, CodeBlock):
        return CodeBlock(block.func, [], False, None, None, block.state, block.runtime)
    if not callable(block):
        raise ArgumentTypeError(
            f"code blocks wrap a module or a bound method of one, got {type(block).__name__}; "
            "e.g. ppe.handler.forward(model) or ppe.handler.forward(model.predict)"
        )
    owner = block if isinstance(block, torch.nn.Module) else getattr(block, "__self__", None)
    runtime = get_runtime(owner)
    if runtime is None:
        what = (
            type(owner).__name__
            if owner is not None
            else getattr(block, "__qualname__", type(block).__name__)
        )
        raise NoRuntimeError(
            f"cannot build a code block from {what}: it is not a module moved with ppe.to (nor "
            "a bound method of one), so no runtime can execute it. Call ppe.to(model, device) "
            "first and pass the module or one of its methods."
        )
    return CodeBlock(block, [], False, None, None, {}, runtime)


def update_parameters(
    block: Callable[..., Any],
    optimizers: Iterable[torch.optim.Optimizer] | torch.optim.Optimizer,
    backprop_from: str | None = None,
    backprop_to: set[str] | None = None,
) -> CodeBlock:
    """A :class:`CodeBlock` that runs forward and backward and steps ``optimizers``.

    Args:
        block: A module moved with ``ppe.to``, a bound method of one, or a forward code block.
        optimizers: The optimizers to step (zeroed before the forward pass).
        backprop_from: The output key to backpropagate (default: every scalar float output
            computed with autograd, in one backward pass).
        backprop_to: Names where backpropagation stops, for runtimes that support it.

    Raises:
        CodeBlockError: ``block`` already updates parameters (also a ``ValueError``).
    """
    if isinstance(block, CodeBlock) and block.backprop:
        raise CodeBlockError(
            "update_parameters got a code block that already updates parameters; pass the "
            "module (or ppe.handler.forward(module)) instead of nesting update_parameters"
        )
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    base = forward(block)
    return CodeBlock(
        base.func, list(optimizers), True, backprop_from, backprop_to, base.state, base.runtime
    )


class CodeBlockLogic(ModelLogic):
    """A Logic that runs each step as a code block, so the runtime executes the whole step.

    A training step is ``update_parameters(model, its optimizers, backward_outputs)(batch)``:
    zero_grad, forward, backward and the optimizers' steps happen inside ``runtime.execute``
    (``train_step_optimizers`` has nothing left to do: BaseLogic's does nothing); an evaluation
    step is ``forward(model)(batch)``.

    The optimizers stepped are those holding parameters of the model named ``model_name``
    (PPE steps every optimizer of the trainer, which is the same set when each optimizer
    holds parameters of the model; with several models, PPE #700, the others' optimizers
    stay out), or those the ``optimizers`` option names.

    Options:
        backward_outputs: The output key to backpropagate (a str, or a list of one key;
            default: every scalar float output computed with autograd).
        optimizers: A list of the trainer's optimizer names to step (each must hold
            parameters of the model).

    Args:
        model_name: The key of the model this logic trains.
        options: The options above.
    """

    #: The ``optimizers`` option; None: those holding the model's parameters.
    _optimizer_names: tuple[str, ...] | None = None

    def consume_options(self, options: dict[str, Any]) -> None:
        super().consume_options(options)
        key = options.pop("backward_outputs", None)
        if isinstance(key, (list, tuple)) and len(key) == 1:
            key = key[0]
        if key is not None and not isinstance(key, str):
            raise ConfigurationError(
                f"CodeBlockLogic option 'backward_outputs' must name one output key, got "
                f"{key!r}; e.g. options={{'backward_outputs': 'loss'}} (several losses: return "
                "them all and leave the option out, they are backpropagated together)"
            )
        self.backward_outputs: str | None = key
        self._optimizer_names = pop_optimizer_names(options, self._optimizer_names)
        # (model, optimizers' items) -> the optimizers to step: chosen once per pair.
        self._targeted: tuple[Any, list[torch.optim.Optimizer]] | None = None

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        model = self._lookup(models, "model")
        key = (model, tuple(optimizers.items()))
        if self._targeted is None or self._targeted[0] != key:
            names = self._optimizer_names
            self._targeted = (key, code_block_optimizers(model, optimizers, names, self.model_name))
        return update_parameters(model, self._targeted[1], self.backward_outputs)(batch)

    def eval_step(self, models: Mapping[str, torch.nn.Module], batch_idx: int, batch: Any) -> Any:
        return forward(self._lookup(models, "model"))(batch)
