"""The Trainer: the training loop, readable top to bottom, on top of an ExtensionsManager."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.training._evaluator import Evaluator, loader_length
from ppe_core.training._extension import PRIORITY_WRITER, Extension, ExtensionEntry
from ppe_core.training._manager import ManagerStateError
from ppe_core.training._resume import TrainerState
from ppe_core.training.triggers import get_trigger

if TYPE_CHECKING:
    from ppe_core.handler import Handler
    from ppe_core.training._manager import ExtensionsManager

__all__ = ["Trainer"]

EvaluatorSpec = Evaluator | tuple[Evaluator, Any] | Mapping[str, Evaluator | tuple[Evaluator, Any]]


# extend() arguments ExtensionEntry takes; others go to the manager, which warns about them.
_ENTRY_ARGS = frozenset({"name", "trigger", "priority", "call_before_training"})


def _should_stop(manager: ExtensionsManager) -> bool:
    # A function, not an inline property read: the answer changes as iterations run, and
    # type checkers would otherwise narrow ``manager.stop_trigger`` across the loop.
    return manager.stop_trigger


class _EvaluatorExtension(Extension):
    """Runs an evaluator on its trigger, before every other extension of that iteration."""

    priority = PRIORITY_WRITER + 1  # LogReport (a writer) must already see val/* keys

    def __init__(self, trainer: Trainer, evaluator: Evaluator, prefix: str | None) -> None:
        self._trainer = trainer
        self._evaluator = evaluator
        self._prefix = prefix

    def __call__(self, manager: Any) -> None:
        trainer = self._trainer
        loader = trainer._val_loader
        if loader is None:  # run() checks this; the extension may also be called by hand
            raise ConfigurationError("the evaluator extension needs run(train_loader, val_loader)")
        trainer.handler.train_validation_begin(trainer, self._evaluator)
        try:
            means = self._evaluator.run(loader, eval_len=trainer._eval_len)
        finally:
            trainer.handler.train_validation_end(trainer, self._evaluator)
        if self._prefix is not None:
            means = {f"{self._prefix}/{k.removeprefix('val/')}": v for k, v in means.items()}
        manager.observation.update(means)


def _normalize_evaluators(spec: EvaluatorSpec | None) -> dict[str, tuple[Evaluator, Any]]:
    if spec is None:
        return {}
    items = dict(spec) if isinstance(spec, Mapping) else {"main": spec}
    result: dict[str, tuple[Evaluator, Any]] = {}
    for name, value in items.items():
        evaluator, trigger = value if isinstance(value, tuple) else (value, (1, "epoch"))
        if not isinstance(evaluator, Evaluator):
            raise ConfigurationError(
                f"evaluator {name!r} must be created with ppe.engine.create_evaluator, "
                f"got {type(evaluator).__name__}"
            )
        result[name] = (evaluator, get_trigger(trigger))
    return result


class Trainer:
    """Trains models over a loader for a number of epochs, running extensions on triggers.

    Create it with :func:`ppe_core.engine.create_trainer`. The manager is built when ``run``
    learns the epoch length; ``extend`` and ``load_state_dict`` may be called before that.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        evaluator: EvaluatorSpec | None,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        max_epochs: int,
        extensions: list[Any] | None,
        out_dir: str,
        writer: Any,
        stop_trigger: Any = None,
        transform_model: Callable[[str, torch.nn.Module], torch.nn.Module] | None = None,
        profile: Any = None,
    ) -> None:
        self.handler = handler
        #: The models by name (a plain attribute: the handler reads it every step).
        self.models: dict[str, torch.nn.Module] = dict(models)
        #: The optimizers by name.
        self.optimizers: dict[str, torch.optim.Optimizer] = dict(optimizers)
        self._max_epochs = max_epochs
        self._evaluators = _normalize_evaluators(evaluator)
        self._extensions: list[tuple[Any, dict[str, Any]]] = []
        self._out_dir = out_dir
        self._writer = writer
        self._stop_trigger = None if stop_trigger is None else get_trigger(stop_trigger)
        self._transform_model = transform_model
        self._profile = profile
        self._manager: ExtensionsManager | None = None
        self._state = TrainerState(lambda: self.handler.runtimes)
        self._pending_state: dict[str, Any] | None = None
        self._val_loader: Iterable[Any] | None = None
        self._eval_len: int | None = None
        for extension in extensions or []:
            self.extend(extension)

    # Properties -------------------------------------------------------------------------------
    @property
    def manager(self) -> ExtensionsManager:
        if self._manager is None:
            raise ManagerStateError(
                "the trainer's manager is created when run() starts (it needs the epoch "
                "length); call run() first, or use trainer.models / trainer.optimizers before"
            )
        return self._manager

    @property
    def evaluator(self) -> Evaluator | None:
        main = self._evaluators.get("main")
        return main[0] if main else None

    @property
    def epoch(self) -> int:
        return self._manager.epoch if self._manager is not None else 0

    @property
    def epoch_detail(self) -> float:
        return self._manager.epoch_detail if self._manager is not None else 0.0

    @property
    def iteration(self) -> int:
        return self._manager.iteration if self._manager is not None else 0

    @property
    def stop_trigger(self) -> bool:
        return self._manager.stop_trigger if self._manager is not None else False

    @property
    def is_before_training(self) -> bool:
        return self._manager is None or self._manager.iteration == 0

    @property
    def out(self) -> str:
        return self._out_dir

    # Configuration ----------------------------------------------------------------------------
    def extend(self, extension: Any, **kwargs: Any) -> None:
        """Add an extension (same arguments as ``ExtensionsManager.extend``)."""
        if self._manager is not None:
            self._manager.extend(extension, **kwargs)
        else:
            # Validate now (bad trigger, priority or name), not when run() starts.
            if not isinstance(extension, ExtensionEntry) and set(kwargs) <= _ENTRY_ARGS:
                extension, kwargs = ExtensionEntry(extension, **kwargs), {}
            self._extensions.append((extension, kwargs))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: models, optimizers, extensions, triggers, iteration."""
        if self._manager is None:
            if self._pending_state is not None:
                return self._pending_state
            raise ManagerStateError(
                "state_dict() is available once run() has started; before that, save "
                "trainer.models['main'].state_dict() and the optimizers' state_dict() directly"
            )
        return self._manager.state_dict()

    def load_state_dict(self, to_load: dict[str, Any]) -> None:
        """Load a ``state_dict``; before ``run()`` it is applied when the manager is built."""
        if self._manager is None:
            self._pending_state = to_load
        else:
            self._manager.load_state_dict(to_load)

    def _setup_manager(self, iters_per_epoch: int) -> ExtensionsManager:
        from ppe_core.training._manager import ExtensionsManager

        kwargs: dict[str, Any] = {}
        if self._transform_model is not None:
            kwargs["transform_model"] = self._transform_model
        manager = ExtensionsManager(
            self.models,
            self.optimizers,
            self._max_epochs,
            iters_per_epoch=iters_per_epoch,
            out_dir=self._out_dir,
            writer=self._writer,
            stop_trigger=self._stop_trigger,
            **kwargs,
        )
        for name, (evaluator, trigger) in self._evaluators.items():
            manager.extend(
                _EvaluatorExtension(self, evaluator, None if name == "main" else name),
                name="Evaluator" if name == "main" else f"Evaluator_{name}",
                trigger=trigger,
            )
        for extension, kwargs in self._extensions:
            manager.extend(extension, **kwargs)
        manager.extend(self._state, name="_trainer_state")
        if self._pending_state is not None:
            manager.load_state_dict(self._pending_state)
            self._pending_state = None
        self._manager = manager
        return manager

    # The loop -------------------------------------------------------------------------------
    def run(
        self,
        train_loader: Iterable[Any],
        val_loader: Iterable[Any] | None = None,
        *,
        train_len: int | None = None,
        eval_len: int | None = None,
    ) -> None:
        """Train until the stop trigger fires (``max_epochs`` by default).

        Args:
            train_loader: Batches for training; ``train_len`` is needed when it has no ``len``.
            val_loader: Batches for the evaluator(s); required exactly when one is configured.
            train_len: Batches per epoch (default ``len(train_loader)``).
            eval_len: Batches per evaluation (default ``len(val_loader)``).
        """
        from ppe_core._plugins import get_plugin_host

        if self._evaluators and val_loader is None:
            raise ConfigurationError(
                "the trainer has an evaluator but run() got no val_loader; pass "
                "trainer.run(train_loader, val_loader) or create the trainer without evaluator"
            )
        if val_loader is not None and not self._evaluators:
            raise ConfigurationError(
                "run() got a val_loader but the trainer has no evaluator to use it; pass "
                "evaluator=ppe.engine.create_evaluator(model, ...) to create_trainer"
            )
        iters_per_epoch = loader_length(train_loader, train_len, "train_len")
        if val_loader is not None:
            self._eval_len = loader_length(val_loader, eval_len, "eval_len")
        self._val_loader = val_loader
        if self._manager is None:
            self._setup_manager(iters_per_epoch)
        manager = self.manager
        handler = self.handler
        hook = get_plugin_host().pm.hook

        handler.train_setup(self, train_loader)
        begin, end, train_step = (
            manager._begin_iteration,
            manager._end_iteration,
            handler.train_step,
        )
        profile = self._profile
        manager.start_extensions()
        hook.ppe_trainer_setup(trainer=self)
        error: BaseException | None = None
        try:
            while not _should_stop(manager):
                start = manager.iteration % iters_per_epoch  # > 0 when resuming mid-epoch
                handler.train_epoch_begin(self, train_loader)
                # On resume: the interrupted epoch's order, consumed batches skipped, RNGs
                # restored; otherwise a plain iter() with the epoch-start RNG states recorded.
                batches = self._state.start_epoch(train_loader, start)
                for batch_idx, batch in zip(range(start, iters_per_epoch), batches, strict=False):
                    begin()
                    train_step(self, batch_idx, batch)
                    end()
                    if profile is not None:
                        profile.step()
                    if manager._stop_reached:  # set by _end_iteration when the stop trigger fired
                        break
                else:
                    if manager.iteration % iters_per_epoch != 0:
                        raise ConfigurationError(
                            f"the train loader ran out after {manager.iteration % iters_per_epoch}"
                            f" batches but the epoch length is {iters_per_epoch}; pass the real "
                            "train_len, or leave train_len out to use len(train_loader)"
                        )
                handler.train_epoch_end(self)
        except BaseException as exc:
            error = exc
            manager._on_error(exc)
            raise
        finally:
            handler.train_cleanup(self)
            hook.ppe_trainer_teardown(trainer=self, exception=error)
        manager.finalize()
