"""Logics: the math of one training/evaluation step (zero_grad, forward, backward, step)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ppe_core.errors import ConfigurationError, PPEError
from ppe_core.runtime import device_type_of, get_runtime

__all__ = ["BaseLogic", "BatchMismatchError", "Logic", "ModelOutputError"]


class ModelOutputError(PPEError, TypeError):
    """The model's output cannot be used for backward or reporting."""


class BatchMismatchError(PPEError, TypeError):
    """A batch from the loader does not fit the model's ``forward`` signature."""


class BaseLogic:
    """The step callbacks the Handler calls; subclass it for custom flows (GANs, RL, ...).

    Each method receives the trainer's ``models`` and ``optimizers`` dicts, so a subclass can
    drive several models and optimizers per step.
    """

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.consume_options(dict(options or {}))

    def consume_options(self, options: dict[str, Any]) -> None:
        """Pop the options this logic understands from ``options`` (leftovers are errors)."""

    def train_epoch_begin(
        self, models: Mapping[str, torch.nn.Module], epoch: int, loader: Iterable[Any]
    ) -> None:
        """Called at the start of each epoch (default: put every model in train mode)."""
        for model in models.values():
            model.train()

    def train_epoch_end(self, models: Mapping[str, torch.nn.Module], epoch: int) -> None:
        """Called at the end of each epoch."""

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        """Compute one step's outputs and gradients; return the outputs."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_step")

    def train_step_optimizers(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
    ) -> None:
        """Apply the gradients (default: step every optimizer)."""
        for optimizer in optimizers.values():
            optimizer.step()

    def train_validation_begin(self, models: Mapping[str, torch.nn.Module]) -> None:
        """Called before a validation pass during training (default: eval mode)."""
        for model in models.values():
            model.eval()

    def train_validation_end(self, models: Mapping[str, torch.nn.Module]) -> None:
        """Called after a validation pass during training (default: back to train mode)."""
        for model in models.values():
            model.train()

    def eval_step(self, models: Mapping[str, torch.nn.Module], batch_idx: int, batch: Any) -> Any:
        """Compute one evaluation step's outputs (called under ``torch.no_grad``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement eval_step")


class Logic(BaseLogic):
    """The standard supervised step for one model: zero_grad, forward, backward, step.

    The batch is passed to ``forward`` as keyword arguments when it is a dict, as positional
    arguments when it is a list/tuple, else as the single argument.

    Options:
        backward_outputs: Output keys to backpropagate (default: every scalar tensor output
            that requires grad). All are backpropagated in one pass, gradients summed.
        backward_function: ``fn(tensor)`` used instead of ``tensor.backward()``.
        autocast: ``True`` or a dict of ``torch.autocast`` keyword arguments; the device type
            comes from the model's runtime, the default dtype from PyTorch for that device.
        grad_scaler: A ``torch.amp.GradScaler`` (any device) used to scale the loss.
        grad_accumulation_steps: Accumulate gradients over this many batches before an
            optimizer step; losses are divided by the window size so the update equals one
            step on the concatenated batch. Windows restart at each epoch.

    Args:
        model_name: The key of the model (and optimizer) this logic trains.
        options: The options above.
    """

    def __init__(self, model_name: str = "main", options: Mapping[str, Any] | None = None) -> None:
        self.model_name = model_name
        super().__init__(options)

    def consume_options(self, options: dict[str, Any]) -> None:
        super().consume_options(options)
        keys = options.pop("backward_outputs", None)
        self.backward_outputs: list[str] | None = None if keys is None else list(keys)
        self._backward_fn: Callable[[torch.Tensor], None] | None = options.pop(
            "backward_function", None
        )
        autocast = options.pop("autocast", False)
        if not isinstance(autocast, (bool, dict)):
            raise ConfigurationError(
                f"option 'autocast' must be a bool or a dict of torch.autocast arguments, "
                f"got {autocast!r}"
            )
        self._autocast_kwargs: dict[str, Any] | None = (
            (autocast if isinstance(autocast, dict) else {}) if autocast else None
        )
        scaler = options.pop("grad_scaler", None)
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise ConfigurationError(
                f"option 'grad_scaler' must be a torch.amp.GradScaler, got {type(scaler).__name__}"
            )
        self._grad_scaler: torch.amp.GradScaler | None = scaler
        steps = options.pop("grad_accumulation_steps", 1)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ConfigurationError(
                f"option 'grad_accumulation_steps' must be an int >= 1, got {steps!r}"
            )
        self.grad_accumulation_steps = steps
        self._epoch_length: int | None = None

    # Helpers --------------------------------------------------------------------------------
    def _autocast(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if self._autocast_kwargs is None:
            return contextlib.nullcontext()
        runtime = get_runtime(model)
        device_type = device_type_of(runtime.device_spec) if runtime is not None else "cpu"
        return torch.autocast(device_type, **self._autocast_kwargs)

    def _forward(self, model: torch.nn.Module, batch: Any) -> Any:
        try:
            if isinstance(batch, Mapping):
                return model(**batch)
            if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
                return model(*batch)
            return model(batch)
        except TypeError as exc:
            _explain_forward_mismatch(model, batch, exc)
            raise

    def _window(self, batch_idx: int) -> tuple[int, bool]:
        """(size of the accumulation window holding batch_idx, whether batch_idx ends it)."""
        n = self.grad_accumulation_steps
        start = batch_idx - batch_idx % n
        end = start + n
        if self._epoch_length is not None and end > self._epoch_length:
            end = self._epoch_length
        return end - start, batch_idx + 1 >= end

    def _to_backward(self, outputs: Any) -> list[torch.Tensor]:
        if isinstance(outputs, torch.Tensor):
            return [outputs]
        if not isinstance(outputs, Mapping):
            raise ModelOutputError(
                f"the model returned {type(outputs).__name__}; the Logic needs a dict such as "
                "{'loss': loss} (or a scalar tensor) to know what to backpropagate. Return a "
                "dict from forward, or subclass ppe_core.handler.Logic for other outputs."
            )
        if self.backward_outputs is not None:
            missing = [k for k in self.backward_outputs if k not in outputs]
            if missing:
                raise ModelOutputError(
                    f"backward_outputs names {missing} but the model returned the keys "
                    f"{sorted(outputs)}; fix the option or the model's output dict."
                )
            return [outputs[k] for k in self.backward_outputs]
        tensors = [
            v
            for v in outputs.values()
            if isinstance(v, torch.Tensor) and v.requires_grad and v.ndim == 0
        ]
        if not tensors:
            raise ModelOutputError(
                f"none of the model's outputs {sorted(outputs)} is a scalar tensor that requires "
                "grad, so there is nothing to backpropagate. Return the loss, e.g. "
                "{'loss': loss}, or name it with options={'backward_outputs': ['loss']}."
            )
        return tensors

    def _backward(self, outputs: Any, scale: int) -> None:
        tensors = self._to_backward(outputs)
        if scale != 1:
            tensors = [t / scale for t in tensors]
        if self._grad_scaler is not None:
            tensors = [self._grad_scaler.scale(t) for t in tensors]
        if self._backward_fn is not None:
            for t in tensors:
                self._backward_fn(t)
        elif len(tensors) == 1:
            tensors[0].backward()  # type: ignore[no-untyped-call]
        else:
            torch.autograd.backward(tensors)

    # Step callbacks -------------------------------------------------------------------------
    def train_epoch_begin(
        self, models: Mapping[str, torch.nn.Module], epoch: int, loader: Iterable[Any]
    ) -> None:
        models[self.model_name].train()
        try:
            self._epoch_length = len(loader)  # type: ignore[arg-type]
        except TypeError:
            self._epoch_length = None

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        model = models[self.model_name]
        if self.grad_accumulation_steps == 1:
            window = 1
            optimizers[self.model_name].zero_grad()
        else:
            window = self._window(batch_idx)[0]
            if batch_idx % self.grad_accumulation_steps == 0:
                optimizers[self.model_name].zero_grad()
        if self._autocast_kwargs is None:  # the common case: no context object per step
            outputs = self._forward(model, batch)
        else:
            with self._autocast(model):
                outputs = self._forward(model, batch)
        self._backward(outputs, window)
        return outputs

    def train_step_optimizers(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
    ) -> None:
        if self.grad_accumulation_steps > 1 and not self._window(batch_idx)[1]:
            return
        optimizer = optimizers[self.model_name]
        if self._grad_scaler is None:
            optimizer.step()
        else:
            self._grad_scaler.step(optimizer)
            self._grad_scaler.update()

    def train_validation_begin(self, models: Mapping[str, torch.nn.Module]) -> None:
        models[self.model_name].eval()

    def train_validation_end(self, models: Mapping[str, torch.nn.Module]) -> None:
        models[self.model_name].train()

    def eval_step(self, models: Mapping[str, torch.nn.Module], batch_idx: int, batch: Any) -> Any:
        model = models[self.model_name]
        if self._autocast_kwargs is None:
            return self._forward(model, batch)
        with self._autocast(model):
            return self._forward(model, batch)


def _explain_forward_mismatch(model: torch.nn.Module, batch: Any, exc: TypeError) -> None:
    """Raise a clearer error when the batch does not fit ``forward``'s signature."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        if isinstance(batch, Mapping):
            signature.bind(**batch)
        elif isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
            signature.bind(*batch)
        else:
            signature.bind(batch)
    except TypeError as mismatch:
        given = f"keys {sorted(batch)}" if isinstance(batch, Mapping) else type(batch).__name__
        raise BatchMismatchError(
            f"the batch does not fit {type(model).__name__}.forward{signature}: {mismatch}. "
            f"The loader yielded {given}; dict batches are passed as keyword arguments, so "
            "their keys must match forward's parameter names."
        ) from exc
