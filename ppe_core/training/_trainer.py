"""The Trainer: the training loop, readable top to bottom, on top of an ExtensionsManager."""

from __future__ import annotations

import contextlib
import functools
import inspect
import queue
import time
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core._plugins import get_plugin_host
from ppe_core._record import record
from ppe_core.distributed import timeout_error
from ppe_core.errors import (
    AmbiguousEvaluatorError,
    ArgumentTypeError,
    ConfigurationError,
    ManagerStateError,
    NotProvidedError,
    UnknownOptimizerError,
    ValLoaderIgnoredWarning,
)
from ppe_core.handler._handler import step_function
from ppe_core.training._epoch_length import (
    PROVISIONAL_EPOCH_LENGTH,
    check_epoch_end,
    optional_length,
    run_first_epoch,
)
from ppe_core.training._evaluator import Evaluator
from ppe_core.training._extension import PRIORITY_WRITER, Extension, ExtensionEntry
from ppe_core.training._interrupt import (
    FAILED_LINE,
    Interrupt,
    InterruptAgreement,
    check_every,
    distributed,
    interrupted_exit,
    save_interrupted,
    saved_line,
)
from ppe_core.training._manager import ExtensionsManager, named_models
from ppe_core.training._manager_checks import (
    check_manager_kwargs,
    missing_max_epochs_error,
    unknown_optimizer_error,
)
from ppe_core.training._resume import TrainerState, attach_resume_state
from ppe_core.training.triggers import get_trigger

if TYPE_CHECKING:
    from ppe_core.handler import BaseHandler
    from ppe_core.training._stop_reason import StopReason

__all__ = [
    "AmbiguousEvaluatorError",
    "Trainer",
    "UnknownOptimizerError",
    "ValLoaderIgnoredWarning",
]


EvaluatorSpec = Evaluator | tuple[Evaluator, Any] | Mapping[str, Evaluator | tuple[Evaluator, Any]]
#: A train step: ``step(trainer, batch_idx, batch)``.
_Step = Callable[[Any, int, Any], Any]


class _EvaluatorExtension(Extension):
    """Runs an evaluator on its trigger, before every other extension of that iteration."""

    priority = PRIORITY_WRITER + 1  # LogReport (a writer) must already see val/* keys
    needs_model_state = True

    def __init__(self, trainer: Trainer, evaluator: Evaluator) -> None:
        self._trainer = trainer
        self._evaluator = evaluator

    def __call__(self, manager: Any) -> None:
        trainer, evaluator, loader = self._trainer, self._evaluator, self._trainer._val_loader
        if loader is None:  # run() checks this; the extension may also be called by hand
            raise ConfigurationError("the evaluator extension needs run(train_loader, val_loader)")
        handler: Any = evaluator.handler
        handler.train_validation_begin(trainer, evaluator)
        try:
            # The evaluator reports its means into the manager's observation (the current
            # reporter while extensions run).
            evaluator.run(loader, eval_len=trainer._eval_len)
        finally:
            handler.train_validation_end(trainer, evaluator)


def _normalize_evaluators(spec: EvaluatorSpec | None) -> dict[str, tuple[Evaluator, Any]]:
    if spec is None:
        return {}
    # A single evaluator (not in a dict) is named as its extension is named in PPE.
    items = dict(spec) if isinstance(spec, Mapping) else {"Evaluator": spec}
    result: dict[str, tuple[Evaluator, Any]] = {}
    for name, value in items.items():
        evaluator, trigger = value if isinstance(value, tuple) else (value, (1, "epoch"))
        if not isinstance(evaluator, Evaluator):
            raise not_an_evaluator_error(name, evaluator)
        result[name] = (evaluator, get_trigger(trigger))
    return result


def manager_arguments() -> list[str]:
    """The ExtensionsManager arguments a Trainer forwards (all but models, iters_per_epoch)."""
    skip = {"models", "iters_per_epoch"}
    return [k for k in inspect.signature(ExtensionsManager).parameters if k not in skip]


def _wrapped_by_extensions(manager: ExtensionsManager, train_step: _Step) -> _Step:
    """``train_step`` wrapped by the extensions that watch the steps (Throughput counts
    samples), once per run; none registered, it is unchanged."""
    for _, entry in manager.extensions:
        wrap = getattr(entry.extension, "wrap_train_step", None)
        if wrap is not None:
            train_step = wrap(train_step)
    return train_step


class Trainer:
    """Trains models over a loader for a number of epochs, running extensions on triggers.

    Usually created with :func:`ppe_core.engine.create_trainer`. The manager is built when
    ``run`` learns the epoch length; ``extend`` and ``load_state_dict`` may be called before
    that.

    Args:
        handler: Drives the runtimes and the logic; every handler runs through
            :func:`ppe_core.handler.step_function`, so a PPE-style handler's ``train_step`` gets
            a ``complete_fn`` that runs its ``train_post_step``.
        evaluator: An evaluator, ``(evaluator, trigger)`` or a dict of names to either; each
            runs once per epoch by default, as an extension named like its key
            (``"Evaluator"`` for a single one).
        models: A module (named ``"main"``) or a dict of modules.
        profile: A ``torch.profiler.profile``, entered around the loop and stepped after every
            iteration.
        **kwargs: :class:`~ppe_core.training.ExtensionsManager` arguments (``optimizers``,
            ``max_epochs``, ``extensions``, ``out_dir``, ``writer``, ``stop_trigger``,
            ``transform_model``, ``enable_profile``, ``enable_trace``, ``state_objects``).
            ``enable_profile`` also records each step for ``torch.profiler`` and
            ``enable_trace`` for ``ppe.profiler``'s tracer.
    """

    def __init__(
        self,
        handler: BaseHandler,
        *,
        evaluator: EvaluatorSpec | None = None,
        models: torch.nn.Module | Mapping[str, torch.nn.Module],
        profile: Any = None,
        **kwargs: Any,
    ) -> None:
        self.handler = handler
        #: The models by name, as registered (a plain attribute: the handler reads it every
        #: step). PPE's ``trainer.models`` is the manager's ``raw_models``: the same modules.
        self.models: dict[str, torch.nn.Module] = named_models(models)
        optimizers = kwargs.pop("optimizers", None) or {}
        #: The optimizers by name.
        self.optimizers: dict[str, torch.optim.Optimizer] = (
            dict(optimizers) if isinstance(optimizers, Mapping) else {"main": optimizers}
        )
        extensions = kwargs.pop("extensions", None)
        check_manager_kwargs(kwargs, manager_arguments())
        self._kwargs = kwargs
        self._out_dir: str = kwargs.get("out_dir", "result")
        if kwargs.get("stop_trigger") is not None:  # checked now, not when run() starts
            kwargs["stop_trigger"] = get_trigger(kwargs["stop_trigger"])
        self._enable_profile = bool(kwargs.get("enable_profile", profile is not None))
        self._enable_trace = bool(kwargs.get("enable_trace", False))
        self._evaluators = _normalize_evaluators(evaluator)
        self._extension_specs: list[tuple[Any, dict[str, Any]]] = []
        self._profile = profile
        self._manager: ExtensionsManager | None = None
        self._state = TrainerState(lambda: getattr(self.handler, "runtimes", []))
        self._pending_state: dict[str, Any] | None = None
        # The validation data of the current run(), for the evaluators' extensions.
        self._val_loader: Iterable[Any] | None = None
        self._eval_len: int | None = None
        self._train_len: int | None = None
        for extension in extensions or []:
            self.extend(extension)

    # Properties -------------------------------------------------------------------------------
    @property
    def manager(self) -> ExtensionsManager:
        """The :class:`~ppe_core.training.ExtensionsManager` (once ``run`` has started)."""
        if self._manager is None:
            raise ManagerStateError(
                "the trainer is not started yet: its manager is created when run() starts (it "
                "needs the epoch length); call run() first, or use trainer.models / "
                "trainer.optimizers before"
            )
        return self._manager

    @property
    def evaluator(self) -> Evaluator | None:
        """The evaluator, None without one; with several, use :attr:`evaluators`.

        Raises:
            AmbiguousEvaluatorError: Several evaluators are registered (a ``ValueError``).
        """
        if not self._evaluators:
            return None
        if len(self._evaluators) > 1:
            raise AmbiguousEvaluatorError(
                f"trainer.evaluator is ambiguous: {len(self._evaluators)} evaluators are "
                f"registered ({', '.join(map(repr, self._evaluators))}); use "
                "trainer.evaluators[name]"
            )
        return next(iter(self._evaluators.values()))[0]

    @property
    def evaluators(self) -> Mapping[str, Evaluator]:
        """The evaluators by name (``"Evaluator"`` for a single one passed without a dict)."""
        return types.MappingProxyType({name: e for name, (e, _) in self._evaluators.items()})

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
    def stop_reason(self) -> StopReason | None:
        """Why training ended: which stop trigger fired (and when), or the error; else None.

        E.g. ``trainer.stop_reason.kind`` is ``"max_epochs"`` after a full run,
        ``"stop_trigger"`` when a ``stop_trigger`` such as ``EarlyStoppingTrigger`` ended it
        (``.trigger`` is that trigger, ``.iteration`` when), and ``"error"`` after an
        exception.
        """
        return self._manager.stop_reason if self._manager is not None else None

    @property
    def is_before_training(self) -> bool:
        return self._manager is None or self._manager.iteration == 0

    @property
    def out(self) -> str:
        return self._manager.out if self._manager is not None else self._out_dir

    def get_optimizer(self, name: str) -> torch.optim.Optimizer:
        """The optimizer registered as ``name``."""
        try:
            return self.optimizers[name]
        except KeyError:
            raise unknown_optimizer_error(name, self.optimizers) from None

    def set_optimizer(self, name: str, optimizer: torch.optim.Optimizer) -> None:
        """Replace (or add) the optimizer ``name``, also in a running manager."""
        self.optimizers[name] = optimizer
        if self._manager is not None:
            self._manager.set_optimizer(name, optimizer)

    def is_epoch_last_iter(self, idx: int) -> bool:
        """Whether batch index ``idx`` (0-based within the epoch) is the epoch's last."""
        return idx + 1 == self.manager.iters_per_epoch

    # Configuration ----------------------------------------------------------------------------
    def extend(
        self,
        extension: Any,
        name: str | None = None,
        trigger: Any = None,
        priority: int | None = None,
        *,
        call_before_training: bool = False,
        **kwargs: Any,
    ) -> None:
        """Add an extension (arguments as ``ExtensionsManager.extend``), before ``run()``.

        Raises:
            ManagerStateError: The trainer already started (a ``RuntimeError``, as in PPE).
        """
        if self._manager is not None:
            raise ManagerStateError(
                "cannot extend after starting the trainer: its extensions were set up when "
                "run() started; call trainer.extend(...) before trainer.run(...)"
            )
        given = {"name": name, "trigger": trigger, "priority": priority}
        entry_args: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if call_before_training:
            entry_args["call_before_training"] = True
        if not isinstance(extension, ExtensionEntry) and not kwargs:
            # Validate now (bad trigger, priority or name), not when run() starts.
            extension, entry_args = ExtensionEntry(extension, **entry_args), {}
        self._extension_specs.append((extension, {**entry_args, **kwargs}))

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

    def _setup_manager(self, iters_per_epoch: int | None) -> ExtensionsManager:
        if "max_epochs" not in self._kwargs:
            raise missing_max_epochs_error()
        manager = ExtensionsManager(
            self.models,
            self.optimizers,
            iters_per_epoch=iters_per_epoch or PROVISIONAL_EPOCH_LENGTH,
            **self._kwargs,
        )
        # PPE's trainer also reports each step's duration as ``elapsed_time``; ppe-core leaves
        # it out (docs/migration.md): LogReport/PrintReport overwrite the key with the run's
        # elapsed time anyway, and it would cost clock reads and a summary entry per step.
        for name, (evaluator, trigger) in self._evaluators.items():
            manager.extend(_EvaluatorExtension(self, evaluator), name=name, trigger=trigger)
        for extension, extension_kwargs in self._extension_specs:
            manager.extend(extension, **extension_kwargs)
        if iters_per_epoch is None:
            manager.set_epoch_length(None)  # learnt when the first epoch's loader runs out
        attach_resume_state(manager, self._state, self.handler)
        # SIGTERM/SIGINT stop after an iteration; ranks agree on it every few iterations.
        self._interrupt = Interrupt(distributed())
        if self._interrupt.distributed:
            manager.extend(
                InterruptAgreement(self._interrupt),
                name="InterruptAgreement",
                trigger=(check_every(), "iteration"),
            )
        if self._pending_state is not None:
            manager.load_state_dict(self._pending_state)
            self._pending_state = None
        self._manager = manager
        return manager

    # PPE 0.9's protected members, for subclasses written against PPE -----------------------
    @property
    def _models(self) -> dict[str, torch.nn.Module]:
        return self.models

    @property
    def _manager_state(self) -> dict[str, Any] | None:
        """A state given to ``load_state_dict`` before ``run()``, applied when it starts."""
        return self._pending_state

    @property
    def _extensions(self) -> Any:
        raise NotProvidedError(
            "Trainer._extensions (PPE's list of pending extend() arguments) is not provided: "
            "add extensions with trainer.extend(...); once run() started, read them from "
            "trainer.manager.extensions"
        )

    def _complete_step(self, idx: int, outs: Any) -> None:
        """PPE's step completion, used only when a subclass overrides it.

        Then each step's index, batch, start time and PPE's profiler records (``None`` here)
        are queued (``_idxs``, ``_inputs``, ``_times``, ``_profile_records``) and the
        handler's ``train_step`` gets this method as ``complete_fn``. It takes them from the
        queues and runs the handler's ``train_post_step`` with the loader's batch; like the
        rest of ppe-core it does not report ``elapsed_time`` (docs/migration.md).
        """
        expected = self._idxs.get()
        if expected != idx:
            raise ManagerStateError(
                f"training step {idx} completed while step {expected} was expected: a handler "
                "must complete its steps in order"
            )
        batch = self._inputs.get()
        self._times.get()
        self._profile_records.get()
        self.handler.train_post_step(self, idx, batch, outs)

    def _ppe_step_function(self) -> _Step:
        """The train step of PPE's protocol (see :meth:`_complete_step`), chosen once per run
        for a subclass that overrides it; other trainers never queue anything."""
        self._idxs: queue.Queue[int] = queue.Queue()
        self._inputs: queue.Queue[Any] = queue.Queue()
        self._times: queue.Queue[float] = queue.Queue()
        self._profile_records: queue.Queue[list[Any]] = queue.Queue()
        handler_step: Any = self.handler.train_step
        complete = self._complete_step

        def ppe_step(trainer: Any, batch_idx: int, batch: Any) -> Any:
            self._idxs.put(batch_idx)
            self._inputs.put(batch)
            self._times.put(time.time())
            self._profile_records.put([None, None, None])
            return handler_step(trainer, batch_idx, batch, complete)

        return ppe_step

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
            train_loader: Batches for training. Without ``len()`` (an ``IterableDataset``, a
                generator) and without ``train_len``, the first epoch ends when it runs out,
                and every later epoch must have as many batches (docs/training.md).
            val_loader: Batches for the evaluator(s); required when one is configured.
            train_len: Batches per epoch (default ``len(train_loader)``, or the number the
                first epoch yields).
            eval_len: Batches per evaluation (default ``len(val_loader)``).

        Warns:
            ValLoaderIgnoredWarning: ``val_loader`` was given but there is no evaluator.
        """
        if self._evaluators and val_loader is None:
            raise ConfigurationError(
                "the trainer has an evaluator but run() got no val_loader; pass "
                "trainer.run(train_loader, val_loader) or create the trainer without evaluator"
            )
        ignored_val_loader = val_loader is not None and not self._evaluators
        if ignored_val_loader:
            val_loader = None
        iters_per_epoch = optional_length(train_loader, train_len, "train_len")
        sized = iters_per_epoch is not None
        if val_loader is not None:
            eval_len = optional_length(val_loader, eval_len, "eval_len")
        self._val_loader, self._eval_len = val_loader, eval_len
        self._train_len = iters_per_epoch
        manager = self._manager or self._setup_manager(iters_per_epoch)
        handler: Any = self.handler
        host = get_plugin_host()

        handler.train_setup(self, train_loader)
        if ignored_val_loader:  # after train_setup, as PPE: a setup error comes first
            warnings.warn(
                "run() got a val_loader but the trainer has no evaluator to use it, so it is "
                "ignored; pass evaluator=ppe.engine.create_evaluator(model, ...) to "
                "create_trainer to validate",
                ValLoaderIgnoredWarning,
                stacklevel=2,
            )
        for evaluator, _ in self._evaluators.values():
            evaluator.setup(val_loader)  # type: ignore[arg-type]  # checked above
        # One whole step per call, post-step included, whatever the handler (chosen once).
        begin, end = manager.begin_iteration, manager.end_iteration
        if type(self)._complete_step is Trainer._complete_step:
            train_step = step_function(handler, "train")
        else:  # a subclass overriding PPE's _complete_step: PPE's step protocol
            train_step = self._ppe_step_function()
        # With enable_profile/enable_trace: PPE's sections around each step (the iteration,
        # the data fetch, run_iteration, train_step); nothing is added to the loop otherwise.
        scopes = None
        if self._enable_profile or self._enable_trace:
            scopes = _StepScopes(self._enable_profile, self._enable_trace)
            begin, end, train_step = scopes.wrap(begin, end, train_step)
        train_step = _wrapped_by_extensions(manager, train_step)
        profile = self._profile
        manager.start_extensions()
        host.trainer_setup(self)
        error: BaseException | None = None
        interrupted, saved = False, None
        interrupt = self._interrupt
        interrupt.install(train_loader)  # the signal handlers, until run() returns
        try:
            with profile if profile is not None else contextlib.nullcontext():
                while not manager.stop_trigger:
                    iters_per_epoch = manager.iters_per_epoch  # provisional while unknown
                    first = manager.iteration
                    start = first % iters_per_epoch  # > 0 when resuming mid-epoch
                    handler.train_epoch_begin(self, train_loader)
                    # On resume: the interrupted epoch's order, consumed batches skipped, RNGs
                    # restored; otherwise a plain iter() with the epoch-start RNG states
                    # recorded.
                    batches = self._state.start_epoch(train_loader, start)
                    if scopes is not None:
                        batches = scopes.batches(batches)
                    if not manager.epoch_length_known:
                        run_first_epoch(
                            self, manager, self._state, batches, begin, end, train_step, profile
                        )
                    else:
                        for batch_idx, batch in zip(
                            range(start, iters_per_epoch), batches, strict=False
                        ):
                            begin()
                            train_step(self, batch_idx, batch)
                            stop = end()  # True once the stop condition fired
                            if profile is not None:
                                profile.step()
                            if stop or interrupt.stop:
                                break
                        else:
                            check_epoch_end(
                                manager, train_loader, batches, sized=sized, first=first
                            )
                    interrupted = interrupt.stop and not manager.stop_trigger
                    if interrupted:  # the epoch goes on when the run is resumed
                        break
                    handler.train_epoch_end(self)
                if profile is not None:
                    # As PPE: leaving the profiler must not emit one more (partial) trace.
                    profile.on_trace_ready = None
            if interrupted:
                saved = save_interrupted(manager)
        except BaseException as exc:
            if interrupt.signum and not isinstance(exc, SystemExit):
                # After a signal, a failure (a peer rank gone: torchrun stops the others)
                # ends the run at once, without a snapshot.
                manager.handle_training_error(exc)
                traceback.print_exception(exc)  # SystemExit prints nothing of its cause
                raise interrupted_exit(interrupt.signum, manager.iteration, FAILED_LINE) from exc
            # A collective's timeout (DDP's gradient all-reduce, an extension's barrier) says
            # which rank and what to do, not only the backend's "Timed out waiting 600000ms".
            error = timeout_error(exc, f"training (iteration {manager.iteration})") or exc
            manager.handle_training_error(error)
            if error is exc:
                raise
            raise error from exc
        finally:
            if scopes is not None:
                scopes.close()
            handler.train_cleanup(self)
            host.trainer_teardown(self, error)
            interrupt.uninstall()
        manager.finalize()
        if interrupted:
            raise interrupted_exit(interrupt.signum, manager.iteration, saved_line(saved))


class _StepScopes(contextlib.ExitStack):
    """PPE's trainer sections around each step, for ``enable_profile``/``enable_trace``.

    As PPE records them: ``ppe.training.Trainer:iteration`` around the whole step, inside it
    ``ppe.training.Trainer:get_data`` around fetching the batch and
    ``ppe.training.Trainer:run_iteration`` around the manager's iteration (the train step,
    itself in ``ppe.training.Trainer:train_step``, and the extensions). The loop's own steps
    stay as they are: the batch iterator, the manager's begin/end calls and the step function
    are wrapped; the open sections are this stack's, and those an error (or an early stop)
    left open are closed, innermost first, by :meth:`close`.
    """

    def __init__(self, time: bool, trace: bool) -> None:
        super().__init__()
        self._record = functools.partial(record, enable=time, trace=trace)

    def batches(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Yields the batches, each fetched inside its iteration's ``get_data`` section."""
        iterator = iter(batches)
        while True:
            self.enter_context(self._record("ppe.training.Trainer:iteration"))
            try:
                with self._record("ppe.training.Trainer:get_data"):
                    batch = next(iterator)
            except StopIteration:
                self.close()  # the iteration: the previous iteration closed its own
                return
            yield batch

    def wrap(
        self, begin: Callable[..., Any], end: Callable[..., bool], step: _Step
    ) -> tuple[Callable[..., Any], Callable[..., bool], _Step]:
        """``begin``/``end`` of the manager's iteration inside ``run_iteration``, and the
        step function inside ``train_step``."""

        def begin_section(*args: Any) -> Any:
            self.enter_context(self._record("ppe.training.Trainer:run_iteration"))
            return begin(*args)

        def step_section(trainer: Any, batch_idx: int, batch: Any) -> Any:
            with self._record("ppe.training.Trainer:train_step"):
                return step(trainer, batch_idx, batch)

        def end_section(*args: Any) -> bool:
            stop = end(*args)
            self.close()  # run_iteration, then iteration
            return stop

        return begin_section, end_section, step_section


def not_an_evaluator_error(name: str, evaluator: object) -> ArgumentTypeError:
    """What a Trainer given ``evaluator`` (not an engine Evaluator) under ``name`` raises."""
    return ArgumentTypeError(
        f"evaluator {name!r} must be created with ppe.engine.create_evaluator, "
        f"got {type(evaluator).__name__}"
    )


# For PPE code that imports the old private name.
_Trainer = Trainer
