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
        if keys is not None and (
            isinstance(keys, str)
            or not isinstance(keys, Iterable)
            or not all(isinstance(k, str) for k in keys)
        ):
            raise ConfigurationError(
                f"option 'backward_outputs' must be a list of output keys, got {keys!r}; "
                "e.g. options={'backward_outputs': ['loss']}"
            )
        self.backward_outputs: list[str] | None = None if keys is None else list(keys)
        backward_fn = options.pop("backward_function", None)
        if backward_fn is not None and not callable(backward_fn):
            raise ConfigurationError(
                f"option 'backward_function' must be a callable fn(tensor), got "
                f"{type(backward_fn).__name__}; e.g. options={{'backward_function': "
                "lambda loss: loss.backward()}, or leave it out to call tensor.backward()"
            )
        self._backward_fn: Callable[[torch.Tensor], None] | None = backward_fn
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
                f"option 'grad_scaler' must be a torch.amp.GradScaler, got "
                f"{type(scaler).__name__}; e.g. options={{'grad_scaler': "
                "torch.amp.GradScaler('cuda')}"
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
    def _model(self, models: Mapping[str, torch.nn.Module]) -> torch.nn.Module:
        try:
            return models[self.model_name]
        except KeyError:
            raise self._unknown_name("model", sorted(models)) from None

    def _optimizer(self, optimizers: Mapping[str, torch.optim.Optimizer]) -> torch.optim.Optimizer:
        try:
            return optimizers[self.model_name]
        except KeyError:
            raise self._unknown_name("optimizer", sorted(optimizers)) from None

    def _unknown_name(self, kind: str, names: list[str]) -> ConfigurationError:
        # Only reached on the first step of a misconfigured run: the lookups above stay cheap.
        logic = ("ppe.handler." if type(self) is Logic else "") + type(self).__name__
        name = self.model_name
        if kind == "optimizer":
            fix = (
                f"Key the optimizer like its model: optimizers={{{name!r}: optimizer}} (a bare "
                "optimizer is named 'main')."
            )
        elif len(names) == 1:
            fix = (
                f"Key the model {name!r} (a bare module is named 'main'), or pass "
                f"logic={logic}(model_name={names[0]!r}); its optimizer takes the same key."
            )
        else:
            fix = (
                f"{logic} trains one model: pass logic={logic}(model_name=...) naming it, or "
                "subclass ppe.handler.BaseLogic to train several models per step."
            )
        return ConfigurationError(
            f"{logic} trains the {kind} named {name!r}, but the {kind}s passed are named "
            f"{names}. {fix}"
        )

    def _autocast(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if self._autocast_kwargs is None:
            return contextlib.nullcontext()
        runtime = get_runtime(model)
        device_type = device_type_of(runtime.device_spec) if runtime is not None else "cpu"
        return torch.autocast(device_type, **self._autocast_kwargs)

    def _forward(self, model: torch.nn.Module, batch: Any) -> Any:
        try:
            if type(batch) is dict or isinstance(batch, Mapping):
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
            return self._checked({"<the returned tensor>": outputs})
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
            return self._checked({k: outputs[k] for k in self.backward_outputs})
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

    def _checked(self, named: Mapping[str, Any]) -> list[torch.Tensor]:
        """The tensors to backpropagate, checked so misuse is named before torch fails.

        Without a ``backward_function`` each must be a scalar that requires grad, or
        ``backward()`` raises a torch error that names neither the output nor the fix.
        """
        tensors = []
        for key, value in named.items():
            if not isinstance(value, torch.Tensor):
                raise ModelOutputError(
                    f"the model output {key!r} is a {type(value).__name__}, not a tensor, so it "
                    "cannot be backpropagated; name the loss tensor in backward_outputs."
                )
            if self._backward_fn is None:
                if value.numel() != 1:
                    raise ModelOutputError(
                        f"the model output {key!r} has shape {tuple(value.shape)}, but backward "
                        "needs a scalar; reduce it in forward (e.g. loss.mean()), or pass "
                        "options={'backward_function': fn} to backpropagate it yourself."
                    )
                if not value.requires_grad:
                    raise ModelOutputError(
                        f"the model output {key!r} does not require grad, so there is nothing "
                        "to backpropagate; compute it from the parameters with autograd "
                        "enabled (not under torch.no_grad(), not .detach()ed or .item()ed)."
                    )
            tensors.append(value)
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
        self._model(models).train()
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
        model = self._model(models)
        optimizer = self._optimizer(optimizers)
        n = self.grad_accumulation_steps
        if n == 1:
            optimizer.zero_grad()
            return self._forward_backward(model, batch, 1)
        window, ends = self._window(batch_idx)
        if batch_idx % n == 0:
            optimizer.zero_grad()
        no_sync = getattr(model, "no_sync", None)
        if ends or no_sync is None:
            return self._forward_backward(model, batch, window)
        # DistributedDataParallel: no gradient all-reduce until the window's last batch.
        with no_sync():
            return self._forward_backward(model, batch, window)

    def _forward_backward(self, model: torch.nn.Module, batch: Any, window: int) -> Any:
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
        optimizer = self._optimizer(optimizers)
        if self._grad_scaler is None:
            optimizer.step()
        else:
            self._grad_scaler.step(optimizer)
            self._grad_scaler.update()

    def train_validation_begin(self, models: Mapping[str, torch.nn.Module]) -> None:
        self._model(models).eval()

    def train_validation_end(self, models: Mapping[str, torch.nn.Module]) -> None:
        self._model(models).train()

    def eval_step(self, models: Mapping[str, torch.nn.Module], batch_idx: int, batch: Any) -> Any:
        model = self._model(models)
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
        if isinstance(batch, Mapping):
            given = f"a dict with keys {sorted(batch)}"
            rule = "dict batches are passed as keyword arguments, so their keys must match"
        elif isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
            given = f"a {type(batch).__name__} of {len(batch)} items"
            rule = "list/tuple batches are passed as positional arguments, so their items match"
        else:
            given = f"a single {type(batch).__name__}"
            rule = "any other batch is passed as the single argument, so it must match"
        # Parameter names only: annotations make the message long and say nothing about the fix.
        empty = inspect.Parameter.empty
        names = signature.replace(
            parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
            return_annotation=empty,
        )
        raise BatchMismatchError(
            f"the batch does not fit {type(model).__name__}.forward{names}: {mismatch}. "
            f"The loader yielded {given}; {rule} forward's parameters. Change the loader's "
            "collate_fn or forward's signature so they agree."
        ) from exc
