"""The Handler: finds each tagged module's runtime and drives runtimes and the Logic."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import torch

from ppe_core._reporting import current_observation
from ppe_core.errors import NoRuntimeError
from ppe_core.handler._diagnostics import (
    check_optimizers_hold_models,
    missing_report_keys,
    pop_async_option,
    pop_report_keys,
)
from ppe_core.handler._grad_scalers import (
    load_scaler_states,
    offer_runtime_scaler,
    runtime_scaler,
    scaler_states,
)
from ppe_core.handler._logic import BaseLogic, Logic, set_sampler_epoch, switch_mode
from ppe_core.reporting import report
from ppe_core.runtime import BaseRuntime, autocast_device_type_of, iter_runtime_modules

__all__ = ["BaseHandler", "Handler", "NoRuntimeError", "step_function"]

CompleteFn = Callable[[int, Any], None]
PostStep = Callable[[Any, int, Any, Any], None]
StepFunction = Callable[[Any, int, Any], Any]


class BaseHandler:
    """Base of handlers: the callbacks the Trainer and the Evaluator call, all no-ops here.

    Args:
        logic: The step logic.
        options: Handler options; the handler pops what it understands.
    """

    def __init__(
        self, logic: BaseLogic, options: dict[str, Any] | None, *args: Any, **kwargs: Any
    ) -> None:
        self._logic = logic
        self.consume_options(options if options is not None else {})

    @property
    def logic(self) -> BaseLogic:
        return self._logic

    def consume_options(self, options: dict[str, Any]) -> None:
        """Pop the options this handler understands from ``options``."""

    # Trainer --------------------------------------------------------------------------------
    def train_setup(self, trainer: Any, loader: Iterable[Any]) -> None:
        """Called once when a training run starts."""

    def train_epoch_begin(self, trainer: Any, loader: Iterable[Any]) -> None:
        """Called at the start of every epoch."""

    def train_epoch_end(self, trainer: Any) -> None:
        """Called at the end of every epoch."""

    def train_cleanup(self, trainer: Any) -> None:
        """Called once when a training run ends, successfully or not."""

    def train_validation_begin(self, trainer: Any, evaluator: Any) -> None:
        """Called before the trainer runs an evaluator."""

    def train_validation_end(self, trainer: Any, evaluator: Any) -> None:
        """Called after the trainer ran an evaluator."""

    def train_step(
        self, trainer: Any, batch_idx: int, batch: Any, complete_fn: CompleteFn | None = None
    ) -> Any:
        """One training step; ``complete_fn(batch_idx, outputs)`` is called when it is done."""

    def train_post_step(self, trainer: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        """Called after every training step with the loader's batch and the outputs."""

    # Evaluator ------------------------------------------------------------------------------
    def eval_setup(self, evaluator: Any, loader: Iterable[Any]) -> None:
        """Called when an evaluation run starts."""

    def eval_loop_begin(self, evaluator: Any) -> None:
        """Called before the first evaluation step of a run."""

    def eval_step(
        self, evaluator: Any, batch_idx: int, batch: Any, complete_fn: CompleteFn | None = None
    ) -> Any:
        """One evaluation step; ``complete_fn(batch_idx, outputs)`` is called when it is done."""

    def eval_loop_end(self, evaluator: Any) -> None:
        """Called after the last evaluation step of a run."""

    def eval_post_step(self, evaluator: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        """Called after every evaluation step with the loader's batch and the outputs."""

    # Snapshots ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """State to save with the trainer (none here)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class Handler(BaseHandler):
    """Drives the runtimes of every module tagged by ``ppe.to`` and the Logic.

    A subclass may override any callback; ``train_post_step`` / ``eval_post_step`` overrides
    are called after every step with PPE's arguments (the loader's batch, unconverted).

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
        self, logic: BaseLogic, entry_runtime: BaseRuntime, options: dict[str, Any] | None
    ) -> None:
        super().__init__(logic, options)
        self._entry_runtime = entry_runtime
        # Found by _discover, with the per-step callback lists, at setup or at first use.
        self._modules: list[tuple[str, torch.nn.Module, BaseRuntime]] = []
        self._eval_initialized = False

    def consume_options(self, options: dict[str, Any]) -> None:
        self._train_report_keys = pop_report_keys(options, "train_report_keys")
        self._eval_report_keys = pop_report_keys(options, "eval_report_keys")
        # PPE accepts it for backward compatibility; it has no effect (the caller of
        # Handler(...): BaseHandler.__init__, then Handler.__init__, then theirs).
        pop_async_option(options, stacklevel=4)

    @property
    def entry_runtime(self) -> BaseRuntime:
        """The runtime that converts batches (``create_trainer``'s ``device``), e.g. to move
        values that must travel on the models' device."""
        return self._entry_runtime

    @property
    def runtimes(self) -> list[BaseRuntime]:
        """The distinct runtimes found for the models (after setup)."""
        return list({id(runtime): runtime for _, _, runtime in self._modules}.values())

    # Runtime discovery ----------------------------------------------------------------------
    def _discover(self, models: Mapping[str, torch.nn.Module]) -> None:
        self._modules = [
            triple for name, model in models.items() for triple in iter_runtime_modules(model, name)
        ]
        # Per-step callbacks, only of runtimes that override them (the rest are no-ops).
        self._train_pre = _overriding(self._modules, "train_pre_step")
        self._train_post = _overriding(self._modules, "train_post_step")
        self._eval_pre = _overriding(self._modules, "eval_pre_step")
        self._eval_post = _overriding(self._modules, "eval_post_step")

    def _runtime_iterator(
        self, models: Mapping[str, torch.nn.Module]
    ) -> Iterator[tuple[str, torch.nn.Module, BaseRuntime]]:
        """PPE's iterator over ``(name, module, runtime)`` of every tagged module, for handler
        subclasses; the modules are found in ``models`` on first use, then reused."""
        if not self._modules:
            self._discover(models)
        return iter(self._modules)

    @property
    def _ppe_modules(self) -> list[tuple[str, torch.nn.Module, BaseRuntime]]:
        """PPE's name for the ``(name, module, runtime)`` triples found so far."""
        return self._modules

    def _each_runtime(self, models: Mapping[str, torch.nn.Module], method: str) -> None:
        """Calls ``runtime.<method>(module)`` for every tagged module (callbacks called outside
        a run, or before setup, find the runtimes on first use)."""
        if not self._modules:
            self._discover(models)
        for _, module, runtime in self._modules:
            getattr(runtime, method)(module)

    def _setup(
        self,
        models: Mapping[str, torch.nn.Module],
        loader: Any,
        optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
        *,
        initialize: bool = True,
    ) -> None:
        """Finds the runtimes (a run without any is refused) and binds the logic to them; with
        ``initialize``, each runtime initialises its module (with the optimizer keyed like it,
        or the only one; none without ``optimizers``), as PPE's ``_setup``."""
        self._discover(models)
        if not self._modules:
            raise NoRuntimeError(
                f"none of the models ({', '.join(models)}) was moved with ppe.to, so ppe-core "
                "does not know which device runtime executes them. Call ppe.to(model, device) "
                "before running, e.g. ppe.to(model, 'cpu')."
            )
        self._bind_logic(models)
        if not initialize:
            return
        optimizers = optimizers or {}
        sole = next(iter(optimizers.values())) if len(optimizers) == 1 else None
        for name, module, runtime in self._modules:
            load = loader.get(name) if isinstance(loader, dict) else loader
            runtime.initialize_module(module, load, optimizers.get(name, sole))

    def _bind_logic(self, models: Mapping[str, torch.nn.Module]) -> None:
        """Binds the logic to the device type of its model's runtime (the model named by its
        ``model_name``, else the first found) and offers it that runtime's grad scaler."""
        logic = self._logic
        model_name = getattr(logic, "model_name", None)
        model = models.get(model_name) if isinstance(model_name, str) else None
        runtime = next((rt for _, m, rt in self._modules if m is model), self._modules[0][2])
        logic.bind_device(autocast_device_type_of(runtime))
        offer_runtime_scaler(logic, (runtime, self._entry_runtime))

    # Trainer --------------------------------------------------------------------------------
    def train_setup(self, trainer: Any, loader: Iterable[Any]) -> None:
        """Find runtimes and let each initialise its module before the first step."""
        switch_mode(trainer.models.values(), True)
        optimizers = getattr(trainer, "optimizers", {})
        self._setup(trainer.models, loader, optimizers)
        check_optimizers_hold_models(trainer.models.values(), optimizers)

    def train_epoch_begin(self, trainer: Any, loader: Iterable[Any]) -> None:
        # Logic.train_epoch_begin sets the sampler's epoch (as PPE's does); for a logic that
        # replaces it, the handler does, so a custom logic need not remember to. Either way
        # once per epoch.
        if type(self._logic).train_epoch_begin is not Logic.train_epoch_begin:
            set_sampler_epoch(loader, trainer.epoch)
        self._logic.train_epoch_begin(trainer.models, trainer.epoch, loader)
        self._each_runtime(trainer.models, "train_epoch_begin")

    def train_epoch_end(self, trainer: Any) -> None:
        self._logic.train_epoch_end(trainer.models, trainer.epoch)
        self._each_runtime(trainer.models, "train_epoch_end")

    def train_validation_begin(self, trainer: Any, evaluator: Any) -> None:
        self._logic.train_validation_begin(evaluator.models)
        self._each_runtime(evaluator.models, "train_validation_begin")

    def train_validation_end(self, trainer: Any, evaluator: Any) -> None:
        self._logic.train_validation_end(evaluator.models)
        self._each_runtime(evaluator.models, "train_validation_end")

    def train_step(
        self, trainer: Any, batch_idx: int, batch: Any, complete_fn: CompleteFn | None = None
    ) -> Any:
        """One whole training step, post-step included; returns the model outputs.

        Runtimes' pre-step hooks, the batch conversion, the logic's step and optimizer step,
        then :meth:`train_post_step` (a subclass's override included) with the loader's batch.
        Given a ``complete_fn`` (PPE's protocol, see :func:`step_function`), it gets the
        outputs instead and the caller runs the post-step.
        """
        if not self._modules:
            self._discover(trainer.models)
        for module, runtime in self._train_pre:
            runtime.train_pre_step(trainer, module, batch_idx, batch)
        converted = self._entry_runtime.convert_batch(batch)
        models, optimizers, logic = trainer.models, trainer.optimizers, self._logic
        outputs = logic.train_step(models, optimizers, batch_idx, converted)
        logic.train_step_optimizers(models, optimizers, batch_idx)
        if complete_fn is None:
            self.train_post_step(trainer, batch_idx, batch, outputs)
        else:
            complete_fn(batch_idx, outputs)
        return outputs

    def train_post_step(self, trainer: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        """Every runtime's ``train_post_step``, then the outputs reported as ``train/<key>``."""
        if not self._modules:  # called by hand, outside a run
            self._discover(trainer.models)
        for module, runtime in self._train_post:
            runtime.train_post_step(trainer, module, batch_idx, batch, outputs)
        _report_outputs(outputs, "train/", self._train_report_keys, self._logic)

    def train_cleanup(self, trainer: Any) -> None:
        self._each_runtime(trainer.models, "train_cleanup")

    # Evaluator ------------------------------------------------------------------------------
    def eval_setup(self, evaluator: Any, loader: Iterable[Any]) -> None:
        """Find runtimes (the evaluator may run standalone); initialise modules once."""
        switch_mode(evaluator.models.values(), False)
        self._setup(evaluator.models, loader, initialize=not self._eval_initialized)
        self._eval_initialized = True

    def eval_loop_begin(self, evaluator: Any) -> None:
        """Every model in eval mode, at each run (``eval_setup`` runs once)."""
        switch_mode(evaluator.models.values(), False)

    def eval_step(
        self, evaluator: Any, batch_idx: int, batch: Any, complete_fn: CompleteFn | None = None
    ) -> Any:
        """One whole evaluation step (the evaluator holds ``torch.no_grad``); returns the
        outputs. ``complete_fn`` works as in :meth:`train_step`, with :meth:`eval_post_step`."""
        if not self._modules:
            self._discover(evaluator.models)
        for module, runtime in self._eval_pre:
            runtime.eval_pre_step(evaluator, module, batch_idx, batch)
        converted = self._entry_runtime.convert_batch(batch)
        outputs = self._logic.eval_step(evaluator.models, batch_idx, converted)
        if complete_fn is None:
            self.eval_post_step(evaluator, batch_idx, batch, outputs)
        else:
            complete_fn(batch_idx, outputs)
        return outputs

    def eval_post_step(self, evaluator: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        """Every runtime's ``eval_post_step``, then the outputs reported as ``val/<key>``."""
        if not self._modules:  # called by hand, outside a run
            self._discover(evaluator.models)
        for module, runtime in self._eval_post:
            runtime.eval_post_step(evaluator, module, batch_idx, batch, outputs)
        _report_outputs(outputs, "val/", self._eval_report_keys, self._logic)

    # Snapshots ------------------------------------------------------------------------------
    def _grad_scaler(self) -> torch.amp.GradScaler | None:
        """The logic's grad scaler, else the one given in the runtime options."""
        return self._logic.get_grad_scaler() or runtime_scaler(self._entry_runtime)

    def state_dict(self) -> dict[str, Any]:
        """``{"grad_scaler": scaler.state_dict()}`` when training with a grad scaler (from
        the options or the runtime options), and ``"logic"``: the rest of the logic's
        ``state_dict()`` (each optimizer's own grad scaler, ...) when it has more; saved in
        trainer snapshots."""
        state = scaler_states({"grad_scaler": self._grad_scaler()})
        logic = {k: v for k, v in self._logic.state_dict().items() if k != "grad_scaler"}
        if logic:
            state["logic"] = logic
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the grad scaler's state (ignored without a grad scaler) and the logic's."""
        load_scaler_states({"grad_scaler": self._grad_scaler()}, state)
        logic = state.get("logic")
        if isinstance(logic, Mapping) and logic:
            self._logic.load_state_dict(logic)


def step_function(
    handler: BaseHandler, kind: Literal["train", "eval"], finish: PostStep | None = None
) -> StepFunction:
    """The callable that runs one whole step of ``handler``: ``step(owner, batch_idx, batch)``.

    The Trainer (``kind="train"``) and the Evaluator (``"eval"``) call this once at setup and
    then drive every handler through the result the same way. ppe-core's :class:`Handler` owns
    its whole step, so its bound ``train_step``/``eval_step`` is returned as is. A handler
    written for PPE's protocol (a :class:`BaseHandler` subclass, or a ``Handler`` subclass
    overriding the step) expects a ``complete_fn(batch_idx, outputs)`` that runs the post-step
    with the loader's batch; this adapter gives it one, so the other handlers pay nothing per
    step for that compatibility.

    Args:
        handler: The handler to drive.
        kind: Which step, ``"train"`` or ``"eval"``.
        finish: ``finish(owner, batch_idx, batch, outputs)`` run as the post-step instead of
            the handler's ``<kind>_post_step`` (the Evaluator's metrics, then that post-step).
    """
    step: Callable[..., Any] = getattr(handler, f"{kind}_step")
    owns_step = getattr(type(handler), f"{kind}_step") is getattr(Handler, f"{kind}_step")
    if owns_step and finish is None:
        return step
    post: PostStep = finish if finish is not None else getattr(handler, f"{kind}_post_step")

    def ppe_step(owner: Any, batch_idx: int, batch: Any) -> Any:
        return step(owner, batch_idx, batch, lambda i, outputs: post(owner, i, batch, outputs))

    return ppe_step


def _overriding(
    found: list[tuple[str, torch.nn.Module, BaseRuntime]], method: str
) -> list[tuple[torch.nn.Module, BaseRuntime]]:
    base = getattr(BaseRuntime, method)
    return [(m, rt) for _, m, rt in found if getattr(type(rt), method) is not base]


def _report_outputs(outputs: Any, prefix: str, keys: list[str] | None, logic: BaseLogic) -> None:
    """Report model outputs under ``prefix`` (the reporter detaches; nothing syncs).

    A plain dict (the common case, every step) skips the ABC ``isinstance`` check; other
    outputs are keyed by ``logic`` (which hands on the mapping its step built, so they are
    normalised once per step). By default (``keys`` None) a key the step already reported
    (a model's own ``report({"train/loss": loss.item()})``) keeps the model's value: each key
    is observed once per step. Named ``keys`` are reported as asked, replacing, as in PPE.
    """
    if type(outputs) is not dict and not isinstance(outputs, Mapping):
        if keys is None and not isinstance(outputs, (list, tuple)):
            if isinstance(outputs, torch.Tensor) and outputs.ndim == 0:
                observed = current_observation()
                if observed is not None and prefix + "loss" not in observed:
                    report({prefix + "loss": outputs})
            return
        outputs = logic.named_outputs(outputs)  # keys "0", "1", ... or namedtuple fields
    values = {}
    if keys is None:
        observed = current_observation()
        if observed is None:  # no reporter: nothing to report to
            return
        # Scalars only: a batch of logits has no meaningful running mean. A loop, not a
        # comprehension: no frame per step.
        for k, v in outputs.items():
            if (v.ndim == 0) if isinstance(v, torch.Tensor) else _is_number(v):
                key = prefix + k
                if key not in observed:
                    values[key] = v
    else:
        try:
            values = {prefix + k: outputs[k] for k in keys}
        except KeyError:  # PPE: the bare KeyError
            raise missing_report_keys(keys, outputs) from None
    if values:
        report(values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
