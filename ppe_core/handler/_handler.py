"""The Handler: finds each tagged module's runtime and drives runtimes and the Logic."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ppe_core._reporting import report
from ppe_core.errors import ConfigurationError, PPEError
from ppe_core.handler._logic import BaseLogic
from ppe_core.runtime import BaseRuntime, iter_runtime_modules

__all__ = ["BaseHandler", "Handler", "NoRuntimeError"]


class NoRuntimeError(PPEError, RuntimeError):
    """No model was passed through ``ppe.to``, so no runtime can execute it."""


class BaseHandler:
    """Base of handlers; a handler consumes its options at construction.

    Args:
        logic: The step logic.
        options: Handler options; the handler pops what it understands.
    """

    def __init__(self, logic: BaseLogic, options: dict[str, Any]) -> None:
        self._logic = logic
        self.consume_options(options)

    @property
    def logic(self) -> BaseLogic:
        return self._logic

    def consume_options(self, options: dict[str, Any]) -> None:
        """Pop the options this handler understands from ``options``."""


def _report_keys(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError(
            f"option {name!r} must be a list of output keys, got {value!r}; e.g. "
            f"options={{{name!r}: ['loss']}}"
        )
    return list(value)


class Handler(BaseHandler):
    """Drives the runtimes of every module tagged by ``ppe.to`` and the Logic.

    Options:
        train_report_keys: Output keys reported as ``train/<key>`` each step (default: every
            scalar tensor or number the model returns). Reporting keeps tensors on the
            device: no host sync per step.
        eval_report_keys: Output keys reported as ``val/<key>`` (same default).

    Args:
        logic: The step logic.
        entry_runtime: The runtime that converts batches (that of the first model).
        options: Handler options.
    """

    def __init__(
        self, logic: BaseLogic, entry_runtime: BaseRuntime, options: dict[str, Any]
    ) -> None:
        super().__init__(logic, options)
        self._entry_runtime = entry_runtime
        self._runtimes: list[tuple[torch.nn.Module, BaseRuntime]] = []
        # Per-step callbacks, only of runtimes that override them (the rest are no-ops).
        self._train_pre: list[tuple[torch.nn.Module, BaseRuntime]] = []
        self._train_post: list[tuple[torch.nn.Module, BaseRuntime]] = []
        self._eval_pre: list[tuple[torch.nn.Module, BaseRuntime]] = []
        self._eval_post: list[tuple[torch.nn.Module, BaseRuntime]] = []

    def consume_options(self, options: dict[str, Any]) -> None:
        self._train_report_keys = _report_keys(
            options.pop("train_report_keys", None), "train_report_keys"
        )
        self._eval_report_keys = _report_keys(
            options.pop("eval_report_keys", None), "eval_report_keys"
        )

    @property
    def runtimes(self) -> list[BaseRuntime]:
        """The distinct runtimes found for the models (after setup)."""
        unique: list[BaseRuntime] = []
        for _, runtime in self._runtimes:
            if all(runtime is not seen for seen in unique):
                unique.append(runtime)
        return unique

    # Runtime discovery ----------------------------------------------------------------------
    def _setup_runtimes(self, models: Mapping[str, torch.nn.Module]) -> None:
        found: list[tuple[torch.nn.Module, BaseRuntime]] = []
        for model in models.values():
            found.extend((module, runtime) for _, module, runtime in iter_runtime_modules(model))
        if not found:
            names = ", ".join(models)
            raise NoRuntimeError(
                f"none of the models ({names}) was moved with ppe.to, so ppe-core does not know "
                "which device runtime executes them. Call ppe.to(model, device) before running, "
                "e.g. ppe.to(model, 'cpu')."
            )
        self._runtimes = found
        self._train_pre = _overriding(found, "train_pre_step")
        self._train_post = _overriding(found, "train_post_step")
        self._eval_pre = _overriding(found, "eval_pre_step")
        self._eval_post = _overriding(found, "eval_post_step")

    # Trainer --------------------------------------------------------------------------------
    def train_setup(self, trainer: Any, loader: Iterable[Any]) -> None:
        """Find runtimes and let each initialise its module before the first step."""
        self._setup_runtimes(trainer.models)
        for module, runtime in self._runtimes:
            runtime.initialize_module(module, loader)

    def train_epoch_begin(self, trainer: Any, loader: Iterable[Any]) -> None:
        sampler = getattr(loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(trainer.epoch)
        batch_sampler = getattr(loader, "batch_sampler", None)
        inner = getattr(batch_sampler, "sampler", None)
        if inner is not None and inner is not sampler and hasattr(inner, "set_epoch"):
            inner.set_epoch(trainer.epoch)
        self._logic.train_epoch_begin(trainer.models, trainer.epoch, loader)
        for module, runtime in self._runtimes:
            runtime.train_epoch_begin(module)

    def train_epoch_end(self, trainer: Any) -> None:
        self._logic.train_epoch_end(trainer.models, trainer.epoch)
        for module, runtime in self._runtimes:
            runtime.train_epoch_end(module)

    def train_validation_begin(self, trainer: Any, evaluator: Any) -> None:
        self._logic.train_validation_begin(trainer.models)
        for module, runtime in self._runtimes:
            runtime.train_validation_begin(module)

    def train_validation_end(self, trainer: Any, evaluator: Any) -> None:
        self._logic.train_validation_end(trainer.models)
        for module, runtime in self._runtimes:
            runtime.train_validation_end(module)

    def train_step(
        self,
        trainer: Any,
        batch_idx: int,
        batch: Any,
        callback: Callable[[int, Any], None] | None = None,
    ) -> Any:
        """One training step in PPE's order; returns the model outputs."""
        for module, runtime in self._train_pre:
            runtime.train_pre_step(trainer, module, batch_idx, batch)
        batch = self._entry_runtime.convert_batch(batch)
        models, optimizers, logic = trainer.models, trainer.optimizers, self._logic
        outputs = logic.train_step(models, optimizers, batch_idx, batch)
        logic.train_step_optimizers(models, optimizers, batch_idx)
        for module, runtime in self._train_post:
            runtime.train_post_step(trainer, module, batch_idx, batch, outputs)
        _report_outputs(outputs, "train/", self._train_report_keys)
        if callback is not None:
            callback(batch_idx, outputs)
        return outputs

    def train_cleanup(self, trainer: Any) -> None:
        for module, runtime in self._runtimes:
            runtime.train_cleanup(module)

    # Evaluator ------------------------------------------------------------------------------
    def eval_setup(self, evaluator: Any, loader: Iterable[Any]) -> None:
        """Find runtimes (the evaluator may run standalone)."""
        self._setup_runtimes(evaluator.models)

    def eval_loop_begin(self, evaluator: Any) -> None:
        for model in evaluator.models.values():
            model.eval()

    def eval_loop_end(self, evaluator: Any) -> None:
        pass

    def eval_step(
        self,
        evaluator: Any,
        batch_idx: int,
        batch: Any,
        callback: Callable[[int, Any], None] | None = None,
    ) -> Any:
        """One evaluation step (the evaluator holds ``torch.no_grad``)."""
        for module, runtime in self._eval_pre:
            runtime.eval_pre_step(evaluator, module, batch_idx, batch)
        batch = self._entry_runtime.convert_batch(batch)
        outputs = self._logic.eval_step(evaluator.models, batch_idx, batch)
        for module, runtime in self._eval_post:
            runtime.eval_post_step(evaluator, module, batch_idx, batch, outputs)
        _report_outputs(outputs, "val/", self._eval_report_keys)
        if callback is not None:
            callback(batch_idx, outputs)
        return outputs


def _overriding(
    found: list[tuple[torch.nn.Module, BaseRuntime]], method: str
) -> list[tuple[torch.nn.Module, BaseRuntime]]:
    base = getattr(BaseRuntime, method)
    return [(m, rt) for m, rt in found if getattr(type(rt), method) is not base]


def _report_outputs(outputs: Any, prefix: str, keys: list[str] | None) -> None:
    """Report model outputs under ``prefix`` (the reporter detaches; nothing syncs)."""
    if not isinstance(outputs, Mapping):
        if keys is None and isinstance(outputs, torch.Tensor) and outputs.ndim == 0:
            report({prefix + "loss": outputs})
        return
    if keys is None:
        # Scalars only: a batch of logits has no meaningful running mean. (Inline: per step.)
        values = {
            prefix + k: v
            for k, v in outputs.items()
            if (v.ndim == 0 if isinstance(v, torch.Tensor) else _is_number(v))
        }
    else:
        missing = [k for k in keys if k not in outputs]
        if missing:
            raise ConfigurationError(
                f"report keys {missing} are not in the model's outputs {sorted(outputs)}; "
                "fix train_report_keys/eval_report_keys or the model's output dict."
            )
        values = {prefix + k: outputs[k] for k in keys}
    if values:
        report(values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
