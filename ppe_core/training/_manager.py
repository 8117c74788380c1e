"""The ExtensionsManager: runs extensions on their triggers around a training loop."""

from __future__ import annotations

import difflib
import importlib
import time
import types
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from ppe_core._reporting import _local as _reporter_local
from ppe_core.errors import ArgumentTypeError, ConfigurationError, PPEError, PPEWarning
from ppe_core.reporting import Observation, Reporter
from ppe_core.training._extension import (
    PRIORITY_SNAPSHOT,
    Extension,
    ExtensionEntry,
    ExtensionLike,
    ExtensionNameError,
    check_priority,
)
from ppe_core.training._protocols import StateObjectProtocol
from ppe_core.training.triggers import NEVER, Trigger, TriggerLike, get_trigger

__all__ = [
    "ExtensionErrorHandlerWarning",
    "ExtensionsManager",
    "IgniteExtensionsManager",
    "IgniteNotInstalledError",
    "IgnoredArgumentWarning",
    "ManagerStateError",
    "MissingExtensionStateWarning",
    "ModelStateUnavailableError",
    "StateDictKeyError",
    "StateDictMismatchError",
    "StateVersionWarning",
    "TransformModel",
    "default_transform_model",
    "identity_transform_model",
]

#: ``transform_model(name, model)`` returns the module whose state is saved and observed.
TransformModel = Callable[[str, torch.nn.Module], torch.nn.Module]

# A due iteration no count reaches: the trigger will not fire again.
_NEVER_DUE = NEVER


class ManagerStateError(PPEError, RuntimeError):
    """The manager was used in a state that does not allow it (finalized, nested iteration)."""


class ModelStateUnavailableError(PPEError, RuntimeError):
    """An extension read ``manager.models`` in an iteration where model state is not current.

    Only extensions declaring ``needs_model_state = True`` may read models while extensions run,
    because runtimes that defer work only make the model state current for them.
    """


class StateDictKeyError(PPEError, KeyError):
    """A state dictionary passed to ``load_state_dict`` lacks a required entry."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StateDictMismatchError(ConfigurationError, RuntimeError):
    """A loaded model or optimizer state does not fit the registered model or optimizer.

    Subclasses ``RuntimeError`` (what ``Module.load_state_dict`` raises) and ``ValueError``
    (through :class:`ConfigurationError`, what ``Optimizer.load_state_dict`` raises).
    """


class MissingExtensionStateWarning(PPEWarning):
    """A loaded state holds nothing for a registered extension, which keeps its current state."""


class ExtensionErrorHandlerWarning(PPEWarning):
    """An ``on_error`` or ``finalize`` handler raised while training was failing.

    The handler's exception is reported by this warning so that the original training error,
    which is re-raised, is not masked.
    """


class IgnoredArgumentWarning(PPEWarning):
    """A keyword argument PPE accepts for compatibility was passed and has no effect."""


class IgniteNotInstalledError(PPEError, ImportError):
    """``IgniteExtensionsManager`` was created without pytorch-ignite installed."""


class StateVersionWarning(PPEWarning):
    """A loaded state was written by another (or an unknown) version.

    A ``UserWarning`` mentioning "version", as PPE's. States written by ppe-core itself and by
    the PPE release ppe-core is compatible with load without it.
    """


#: The key under which ppe-core keeps its own resume data in a state dictionary. PPE's
#: ``load_state_dict`` ignores unknown top-level keys, so such states still load into PPE.
PPE_CORE_STATE_KEY = "_ppe_core"
# PPE releases whose states load without a StateVersionWarning (the format is the same).
_COMPATIBLE_PPE_VERSIONS = ("0.9.",)


class _Writer(Protocol):
    """What the manager needs of a writer (``ppe_core.writing.Writer`` satisfies it)."""

    def initialize(self, out_dir: str) -> None: ...

    def finalize(self) -> None: ...


def identity_transform_model(name: str, model: torch.nn.Module) -> torch.nn.Module:
    """Returns ``model`` unchanged: PPE's ``ExtensionsManager`` default."""
    return model


def default_transform_model(name: str, model: torch.nn.Module) -> torch.nn.Module:
    """Unwraps ``DataParallel``/``DistributedDataParallel`` so state keys lack ``module.``.

    Args:
        name: The model's name in the manager (unused).
        model: The registered module.

    Returns:
        The wrapped module for a data-parallel wrapper, ``model`` otherwise.
    """
    parallel = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    if isinstance(model, parallel):
        inner = model.module
        assert isinstance(inner, torch.nn.Module)
        return inner
    return model


def _make_default_writer(out_dir: str) -> _Writer | None:
    # Imported by name: the writing module loads only when a manager is created without a writer.
    try:
        writing = importlib.import_module("ppe_core.writing")
    except ModuleNotFoundError as exc:
        if exc.name != "ppe_core.writing":
            raise
        return None
    writer: _Writer = writing.SimpleWriter(out_dir=out_dir)
    return writer


class _Scheduled:
    """An entry with the first iteration at which its trigger may fire (the schedule cache)."""

    __slots__ = ("due", "entry", "every", "name", "needs_state")

    def __init__(self, name: str, entry: ExtensionEntry) -> None:
        self.name = name
        self.entry = entry
        self.due = -1
        self.needs_state = entry.needs_model_state
        self.every = False  # called directly every step (see ExtensionsManager._every)


class _IterationContext:
    """What ``run_iteration()`` returns: a reusable, allocation-free context manager."""

    __slots__ = ("_manager", "_step_optimizers")

    def __init__(self, manager: ExtensionsManager, step_optimizers: tuple[str, ...]) -> None:
        self._manager = manager
        self._step_optimizers = step_optimizers

    def __enter__(self) -> None:
        self._manager._begin_iteration(self._step_optimizers)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        # Returning None lets the block's exception (if any) propagate unchanged.
        if exc is None:
            self._manager._end_iteration(self._step_optimizers)
        else:
            self._manager._abort_iteration(exc)


class ExtensionsManager:
    """Keeps the training state and runs extensions when their triggers fire.

    Use it around your own loop; each ``with manager.run_iteration():`` block is one iteration.
    On leaving the block the iteration count grows by one, the named optimizers step, and every
    extension whose trigger fires runs (descending priority, ties in registration order)::

        manager = ExtensionsManager(model, optimizer, 10, iters_per_epoch=len(loader))
        while not manager.stop_trigger:
            for x, t in loader:
                with manager.run_iteration(step_optimizers=["main"]):
                    loss = F.mse_loss(model(x), t)
                    ppe_core.reporting.report({"loss": loss}, model)  # -> "main/loss"
                    loss.backward()

    A step at which no extension is due costs one integer comparison: each trigger tells (via
    ``next_check``) the next iteration at which it could fire, and the manager only consults
    triggers at those iterations.

    Args:
        models: A module (named ``"main"``) or a mapping of names to modules.
        optimizers: An optimizer (named ``"main"``) or a mapping of names to optimizers.
        max_epochs: Length of training; ignored when ``stop_trigger`` is given.
        iters_per_epoch: Iterations in one epoch (an integer >= 1).
        extensions: Extensions to register right away.
        out_dir: Output directory, used when ``writer`` is None.
        stop_trigger: When training ends; ``(max_epochs, 'epoch')`` by default.
        writer: Writer that extensions write files through; a ``SimpleWriter`` on ``out_dir``
            by default.
        transform_model: ``(name, module) -> module`` applied to each model for
            :attr:`models`, observation names and state dictionaries; identity by default
            (pass :func:`default_transform_model` to unwrap data-parallel wrappers).
        enable_profile: Whether to wrap each extension call in a profiler ``record_function``.
        enable_trace: Accepted for PPE compatibility (its tracer); extension calls are
            recorded for ``torch.profiler`` when this or ``enable_profile`` is set.
        state_objects: Further objects with ``state_dict``/``load_state_dict`` (a GradScaler,
            a sampler, ...) saved under ``'state_objects'`` in :meth:`state_dict`, by name.

    An exception raised inside ``run_iteration()`` (by the block or an extension) runs every
    extension's ``on_error`` and propagates; as in PPE the manager stays usable, so a loop may
    catch it and continue. Interrupts (``KeyboardInterrupt``, ``SystemExit``) also finalize
    the extensions and the writer.

    Raises:
        ConfigurationError: A model is not a module, or ``iters_per_epoch`` is not >= 1.
    """

    def __init__(
        self,
        models: torch.nn.Module | Mapping[str, torch.nn.Module],
        optimizers: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        max_epochs: int,
        *,
        iters_per_epoch: int,
        extensions: Sequence[ExtensionLike | Extension | ExtensionEntry] | None = None,
        out_dir: str = "result",
        stop_trigger: TriggerLike = None,
        writer: _Writer | None = None,
        transform_model: TransformModel | None = identity_transform_model,
        enable_profile: bool = False,
        enable_trace: bool = False,
        state_objects: Mapping[str, StateObjectProtocol] | None = None,
    ) -> None:
        if transform_model is None:
            transform_model = identity_transform_model
        if isinstance(iters_per_epoch, bool) or not isinstance(iters_per_epoch, int):
            raise ConfigurationError(
                f"iters_per_epoch must be an integer >= 1, got {iters_per_epoch!r}"
            )
        if iters_per_epoch < 1:
            raise ConfigurationError(
                f"iters_per_epoch must be >= 1, got {iters_per_epoch}; pass the number of "
                "iterations per epoch, usually len(loader) (an empty loader gives 0)"
            )
        self._models = self._as_named_models(models)
        self._optimizers: dict[str, torch.optim.Optimizer] = (
            dict(optimizers) if isinstance(optimizers, Mapping) else {"main": optimizers}
        )
        self._transform_model = transform_model
        self._transformed = {name: transform_model(name, m) for name, m in self._models.items()}
        self._models_view: Mapping[str, torch.nn.Module] = types.MappingProxyType(self._transformed)
        self._raw_models_view: Mapping[str, torch.nn.Module] = types.MappingProxyType(self._models)
        self._optimizers_view: Mapping[str, torch.optim.Optimizer] = types.MappingProxyType(
            self._optimizers
        )
        self.max_epochs = max_epochs
        self._iters_per_epoch = iters_per_epoch
        self._enable_profile = enable_profile or enable_trace
        self._state_objects: dict[str, StateObjectProtocol] = dict(state_objects or {})
        for name, obj in self._state_objects.items():
            if not (
                callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))
            ):
                raise ArgumentTypeError(
                    f"state object {name!r} must have state_dict() and load_state_dict(), got "
                    f"{type(obj).__name__}"
                )
        # ppe-core's own resume data (the Trainer's RNG/loader state, the handler's state):
        # saved under PPE_CORE_STATE_KEY, which PPE's load_state_dict ignores.
        self._internal_states: dict[str, Any] = {}
        # State objects a state may lack (added by ppe-core for PPE's layout, not by the user).
        self._optional_state_objects: set[str] = set()

        self.observation: Observation = {}
        self.reporter = Reporter()
        for name, model in self._transformed.items():
            self.reporter.add_observer(name, model)
            self.reporter.add_observers(name, model.named_modules())
        for name, optimizer in self._optimizers.items():
            self.reporter.add_observer(name, optimizer)

        self._stop_trigger: Trigger = get_trigger(
            (max_epochs, "epoch") if stop_trigger is None else stop_trigger
        )
        # One stop condition: the trigger is consulted at most once per iteration, by whichever
        # comes first (the step's own check or a read of ``stop_trigger``), and both share the
        # answer (see _consult_stop_trigger). Stateful triggers (early stopping) need that.

        self._iteration = 0
        #: Iterations run by this process since the (possibly restored) start; PPE's name.
        self.execution = 0
        self._start_iteration = 0
        self._start_execution = 0
        self._start_time: float | None = None
        self._started = False
        self._finalized = False
        # True once started and until finalized: the one check on the hot path.
        self._ready = False
        # The exception whose on_error handlers ran (each error is handled once).
        self._handled_error: BaseException | None = None
        self._model_available = True
        # While an iteration is open: the reporter's observation before it (restored after).
        self._scope: Observation | None = None
        self._every: list[Callable[[Any], object]] = []

        self._entries: dict[str, ExtensionEntry] = {}
        self._schedule: list[_Scheduled] = []
        # Schedule cache: -1 forces the next step through the slow path, which rebuilds it.
        self._dirty = True
        self._next_due = -1
        self._state_due = -1
        self._stop_due = -1
        self._stop_reached = False
        self._stop_checked_at = -1
        self._stop_value = False

        self._plain_context = _IterationContext(self, ())
        self._contexts: dict[tuple[str, ...], _IterationContext] = {}

        self._out = out_dir
        if writer is None:
            writer = _make_default_writer(out_dir)
        elif not all(callable(getattr(writer, m, None)) for m in ("initialize", "finalize")):
            raise ArgumentTypeError(
                f"writer must be a ppe_core.writing writer (with initialize() and finalize()), "
                f"got {type(writer).__name__}; pass e.g. ppe.writing.SimpleWriter(out_dir=...), "
                "or leave it out to write to out_dir"
            )
        self.writer: _Writer | None = writer
        if self.writer is not None:
            self.writer.initialize(self.out)

        for extension in extensions or ():
            self.extend(extension)

    @staticmethod
    def _as_named_models(
        models: torch.nn.Module | Mapping[str, torch.nn.Module],
    ) -> dict[str, torch.nn.Module]:
        named = dict(models) if isinstance(models, Mapping) else {"main": models}
        for name, model in named.items():
            if not isinstance(model, torch.nn.Module):
                raise ConfigurationError(
                    f"model {name!r} must be a torch.nn.Module, got {type(model).__name__}; pass "
                    "a module or a mapping of names to modules"
                )
        return named

    # ----------------------------------------------------------------- state (ManagerView)

    @property
    def iteration(self) -> int:
        """Completed iterations; already incremented while extensions run.

        Reading it starts the extensions first (as in PPE) so that an extension restoring a
        snapshot in ``initialize`` has run.
        """
        if not self._started:
            self.start_extensions()
        return self._iteration

    @iteration.setter
    def iteration(self, value: int) -> None:
        self._iteration = value
        self._invalidate_schedule()

    @property
    def epoch(self) -> int:
        """Completed epochs."""
        return self.iteration // self._iters_per_epoch

    @property
    def epoch_detail(self) -> float:
        """Completed epochs as a fraction, e.g. 1.5 halfway through the second epoch."""
        return self.iteration / self._iters_per_epoch

    @property
    def iters_per_epoch(self) -> int:
        """Iterations in one epoch."""
        return self._iters_per_epoch

    @property
    def is_before_training(self) -> bool:
        """Whether no iteration has completed yet."""
        return self.iteration == 0

    @property
    def elapsed_time(self) -> float:
        """Seconds since the extensions started (0.0 before that)."""
        start = self._start_time
        return 0.0 if start is None else time.perf_counter() - start

    @property
    def models(self) -> Mapping[str, torch.nn.Module]:
        """The models after ``transform_model``, by name (read-only mapping).

        Raises:
            ModelStateUnavailableError: Read by an extension that did not declare
                ``needs_model_state`` in an iteration where no such extension runs.
        """
        if not self._model_available:
            self._raise_model_unavailable()
        return self._models_view

    @property
    def raw_models(self) -> Mapping[str, torch.nn.Module]:
        """The models as registered, without ``transform_model`` (read-only mapping)."""
        if not self._model_available:
            self._raise_model_unavailable()
        return self._raw_models_view

    @property
    def optimizers(self) -> Mapping[str, torch.optim.Optimizer]:
        """The optimizers by name (read-only mapping)."""
        return self._optimizers_view

    @property
    def out(self) -> str:
        """The output directory: the writer's when it has one, else ``out_dir``."""
        out_dir = getattr(self.writer, "out_dir", None)
        return out_dir if isinstance(out_dir, str) and out_dir else self._out

    @property
    def stop_trigger(self) -> bool:
        """Whether training should stop now (the stop trigger fires at this iteration).

        Repeated reads at the same iteration agree; the trigger itself is only consulted at
        the iterations its ``next_check`` announces.
        """
        if not self._started:
            self.start_extensions()
        if self._stop_reached:
            return True
        iteration = self._iteration
        if iteration < self._stop_due and iteration != self._stop_checked_at:
            return False  # not due, and not consulted at this iteration
        return self._consult_stop_trigger(iteration)

    def _consult_stop_trigger(self, iteration: int) -> bool:
        """Calls the stop trigger once for ``iteration`` and records the answer for both users."""
        if iteration == self._stop_checked_at:
            return self._stop_value
        value = bool(self._stop_trigger(self))
        self._stop_due = self._due_after(self._stop_trigger, iteration)
        self._stop_checked_at = iteration
        self._stop_value = value
        return value

    def _raise_model_unavailable(self) -> None:
        raise ModelStateUnavailableError(
            f"models cannot be read by extensions at iteration {self._iteration}: no extension "
            "declaring needs_model_state runs in this iteration. Set `needs_model_state = True` "
            "on the extension (or make_extension(needs_model_state=True)) that reads them."
        )

    # ----------------------------------------------------------------- registration

    def extend(
        self,
        extension: ExtensionLike | Extension | ExtensionEntry,
        name: str | None = None,
        trigger: TriggerLike = None,
        priority: int | None = None,
        *,
        call_before_training: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Registers an extension.

        Options left as None come from the extension's attributes (see :class:`Extension`).
        Names are unique: an extension registered under a taken name (explicit or not) is
        renamed ``<name>_1``, ``<name>_2``, ... (the first free ordinal, as PPE does); the
        name it got is ``extension.name`` (and ``entry.name``).

        An extension added after the extensions started is initialized right away.

        Args:
            extension: An :class:`Extension`, a callable taking the manager, or an
                :class:`ExtensionEntry`.
            name: Name to register under (explicit).
            trigger: When to run; anything ``get_trigger`` accepts.
            priority: Invocation priority; higher runs first within an iteration.
            call_before_training: Also run once when the extensions start.
            **kwargs: Accepted for PPE compatibility; ignored with a warning.

        Raises:
            ExtensionNameError: The name is empty or reserved (``"training"``).
        """
        if kwargs:
            warnings.warn(
                IgnoredArgumentWarning(
                    f"extend() ignores the keyword arguments {sorted(kwargs)} (accepted for PPE "
                    "compatibility only)"
                ),
                stacklevel=2,
            )
        entry = extension if isinstance(extension, ExtensionEntry) else ExtensionEntry(extension)
        if trigger is not None:
            entry._update_trigger(trigger)
        if priority is not None:
            entry.priority = check_priority(priority)
        if call_before_training is not None:
            entry.call_before_training = bool(call_before_training)

        base = name if name is not None else entry.name
        unique = base
        ordinal = 0
        while unique in self._entries:
            ordinal += 1
            unique = f"{base}_{ordinal}"
        entry._update_name(unique)
        self._entries[unique] = entry
        slot = _Scheduled(unique, entry)
        # sorted() is stable: equal priorities keep registration order.
        self._schedule = sorted([*self._schedule, slot], key=lambda s: -s.entry.priority)
        self._invalidate_schedule()
        if self._started and not getattr(entry.trigger, "finished", False):
            entry.extension.initialize(self)

    def get_extension(self, name: str) -> Extension:
        """Returns the extension registered under ``name``.

        Raises:
            ExtensionNameError: No extension has that name (a ``ValueError``, as in PPE).
        """
        entry = self._entries.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, list(self._entries), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ExtensionNameError(
                f"no extension named {name!r} is registered (registered: "
                f"{sorted(self._entries) or 'none'}); {hint}register it first with "
                f"extend(..., name={name!r}) or ask for one of the registered names"
            )
        return entry.extension

    @property
    def extensions(self) -> list[tuple[str, ExtensionEntry]]:
        """``(name, entry)`` pairs in invocation order (descending priority)."""
        return [(slot.name, slot.entry) for slot in self._schedule]

    # ----------------------------------------------------------------- lifecycle

    def start_extensions(self) -> None:
        """Initializes every extension, then runs those registered ``call_before_training``.

        Called implicitly by the first iteration (and by reading ``iteration`` or
        ``stop_trigger``); later calls do nothing. Extensions whose trigger reports
        ``finished`` are not initialized.
        """
        if self._started:
            return
        self._started = True
        if self._start_time is None:
            self._start_time = time.perf_counter()
        for slot in list(self._schedule):
            if not getattr(slot.entry.trigger, "finished", False):
                slot.entry.extension.initialize(self)
        self.observation = {}
        with self.reporter.scope(self.observation):
            for slot in list(self._schedule):
                if slot.entry.call_before_training:
                    self._call_extension(slot)
        self._invalidate_schedule()

    def run_iteration(
        self, *, step_optimizers: Sequence[str] | None = None
    ) -> AbstractContextManager[None]:
        """Returns the context manager that runs one iteration of the user's loop.

        On entry the named optimizers' gradients are zeroed and a fresh observation becomes the
        reporter's target; on normal exit the optimizers step, the iteration count grows, and
        due extensions run. If the block or an extension raises, every extension's
        ``on_error`` runs once and the original exception propagates unchanged; the manager
        stays usable (as in PPE), so a loop may catch the error and go on. An interrupt
        (``KeyboardInterrupt``, ...) also finalizes the extensions and the writer. The returned
        object is cached and reusable.

        Args:
            step_optimizers: Names of optimizers to ``zero_grad`` before and ``step`` after
                the block.

        Raises:
            ConfigurationError: A name in ``step_optimizers`` is not a registered optimizer.
        """
        if step_optimizers is None:
            return self._plain_context
        names = (step_optimizers,) if isinstance(step_optimizers, str) else tuple(step_optimizers)
        context = self._contexts.get(names)
        if context is None:
            unknown = [name for name in names if name not in self._optimizers]
            if unknown:
                raise ConfigurationError(
                    f"step_optimizers names unknown optimizers {unknown}; registered: "
                    f"{sorted(self._optimizers)}"
                )
            context = self._contexts[names] = _IterationContext(self, names)
        return context

    def _begin_iteration(self, step_optimizers: Sequence[str] = ()) -> None:
        """Opens an iteration: the fast-path entry point for trainers (no context manager).

        Starts the extensions on first use, points the reporter at a fresh observation and
        zeroes the named optimizers' gradients. Pair with :meth:`_end_iteration` on success
        or :meth:`_abort_iteration` on an exception.
        """
        if not self._ready:
            self._prepare_first_iteration()
        if self._scope is not None:
            raise ManagerStateError("iterations cannot be nested: the previous one is still open")
        # The reporter becomes current with a fresh observation: done inline, without a scope
        # object, because this runs every step.
        observation: Observation = {}
        self.observation = observation
        reporter = self.reporter
        self._scope = reporter.observation
        reporter.observation = observation
        _reporter_local.reporters.append(reporter)
        if step_optimizers:
            try:
                for name in step_optimizers:
                    self._optimizers[name].zero_grad()
            except BaseException as exc:
                self._abort_iteration(exc)
                raise

    def _end_iteration(self, step_optimizers: Sequence[str] = ()) -> None:
        """Closes an iteration that succeeded: the fast-path exit point for trainers.

        Steps the named optimizers, increments the iteration, runs the extensions that are due
        (a single comparison when none is) and finalizes when the stop trigger fired. On an
        exception it runs the error handling of :meth:`_abort_iteration` and re-raises.
        """
        try:
            for name in step_optimizers:
                self._optimizers[name].step()
            iteration = self._iteration = self._iteration + 1
            self.execution += 1
            if iteration >= self._next_due:
                self._run_due_extensions(iteration)
            elif self._every:
                self._run_every(iteration)
        except BaseException as exc:
            self._abort_iteration(exc)
            raise
        previous = self._scope  # _close_scope(), inline: this runs every step
        if previous is not None:
            self._scope = None
            _reporter_local.reporters.pop()
            self.reporter.observation = previous
        if self._stop_reached:
            self.finalize()

    def _abort_iteration(self, exc: BaseException) -> None:
        """Handles an exception raised inside an iteration; the caller re-raises ``exc``.

        Runs every extension's ``on_error`` (once per exception) and closes the reporter
        scope. As in PPE an ``Exception`` leaves the manager usable, so the user's loop may
        catch it and run further iterations; an interrupt (``KeyboardInterrupt``,
        ``SystemExit``, ...) also finalizes the extensions and the writer. Failures of those
        handlers are reported as :class:`ExtensionErrorHandlerWarning` so they never mask
        ``exc``.
        """
        self._model_available = True
        try:
            self._run_on_error(exc)
        finally:
            self._close_scope()
            if not isinstance(exc, Exception):
                self._finalize(exc)

    def _on_error(self, exc: BaseException) -> None:
        """Handles an error that ends training (a trainer's ``except`` clause calls it).

        Like :meth:`_abort_iteration` (``on_error`` is not run twice for one exception),
        then finalizes the extensions and the writer: a trainer is not reused after an error.
        """
        self._model_available = True
        try:
            self._run_on_error(exc)
        finally:
            self._close_scope()
            self._finalize(exc)

    def _run_every(self, iteration: int) -> None:
        """Call the every-step extensions when nothing else is due (the common step)."""
        self._model_available = iteration >= self._state_due
        try:
            for extension in self._every:
                extension(self)
        finally:
            self._model_available = True

    def _close_scope(self) -> None:
        """Undo :meth:`_begin_iteration`'s reporter switch (no-op outside an iteration)."""
        previous = self._scope
        if previous is not None:
            self._scope = None
            _reporter_local.reporters.pop()
            self.reporter.observation = previous

    def finalize(self) -> None:
        """Finalizes the extensions (if started) and the writer; later calls do nothing.

        Every finalizer runs even if one raises; the first exception is re-raised afterwards.
        Called automatically when the stop trigger fires.
        """
        self._finalize(None)

    def run_extensions(self) -> None:
        """Runs the extensions due at the current iteration (what leaving an iteration does).

        For loops that advance ``iteration`` themselves (as :class:`IgniteExtensionsManager`
        does); ``run_iteration()`` calls it for you.
        """
        iteration = self.iteration
        if iteration >= self._next_due:
            self._run_due_extensions(iteration)
        elif self._every:
            self._run_every(iteration)

    def needs_state_this_iteration(self) -> bool:
        """Whether an extension declaring ``needs_model_state`` may run in the next iteration."""
        return self.needs_model_state(self.execution + 1)

    @property
    def updater(self) -> ExtensionsManager:
        """Deprecated alias of the manager itself (PPE keeps it for Chainer-era code)."""
        warnings.warn(
            "manager.updater is deprecated: use manager.iteration, manager.epoch and "
            "manager.epoch_detail directly (and '{.iteration}' rather than "
            "'{.updater.iteration}' in snapshot filenames)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self

    def _prepare_for_training(
        self, start_iteration: int, start_execution: int, iters_per_epoch: int
    ) -> None:
        """Sets the counts and the epoch length (PPE's hook for loops that own them)."""
        self._iteration = start_iteration
        self.execution = start_execution
        self._iters_per_epoch = iters_per_epoch
        self._invalidate_schedule()

    def _prepare_first_iteration(self) -> None:
        if self._finalized:
            raise ManagerStateError(
                "cannot run a finalized manager: the manager is finalized when training ends "
                "(or a trainer fails); create a new manager (and load_state_dict) to train further"
            )
        self.start_extensions()
        self._ready = True

    def _run_on_error(self, exc: BaseException) -> None:
        if exc is self._handled_error:
            return
        self._handled_error = exc
        tb = exc.__traceback__
        for slot in list(self._schedule):
            try:
                slot.entry.extension.on_error(self, exc, tb)
            except Exception as handler_exc:
                self._warn_handler_failure("on_error", slot.name, handler_exc, exc)

    def _finalize(self, original: BaseException | None) -> None:
        if self._finalized:
            return
        self._finalized = True
        self._ready = False
        failures: list[tuple[str, Exception]] = []
        if self._started:
            for slot in list(self._schedule):
                try:
                    slot.entry.extension.finalize(self)
                except Exception as failure:
                    failures.append((slot.name, failure))
        if self.writer is not None:
            try:
                self.writer.finalize()
            except Exception as failure:
                failures.append(("<writer>", failure))
        if not failures:
            return
        if original is None:
            raise failures[0][1]
        for name, error in failures:
            self._warn_handler_failure("finalize", name, error, original)

    @staticmethod
    def _warn_handler_failure(
        kind: str, name: str, handler_exc: Exception, original: BaseException | None
    ) -> None:
        during = "" if original is None else f" while handling {type(original).__name__}"
        warnings.warn(
            ExtensionErrorHandlerWarning(
                f"{kind} of {name!r} raised {type(handler_exc).__name__}: {handler_exc}{during}"
            ),
            stacklevel=4,
        )

    # ----------------------------------------------------------------- scheduling

    def _invalidate_schedule(self) -> None:
        """Forces the next step through the slow path, which recomputes every due iteration."""
        self._dirty = True
        self._next_due = -1
        self._state_due = -1
        self._stop_due = -1
        self._stop_checked_at = -1

    def _due_after(self, trigger: Trigger, iteration: int) -> int:
        """The first iteration after ``iteration`` at which ``trigger`` may fire."""
        next_check = getattr(trigger, "next_check", None)
        if next_check is None:
            return iteration + 1
        due = next_check(iteration, self._iters_per_epoch)
        if due is None:
            return iteration + 1
        # A due at or before ``iteration`` breaks the contract; checking next step stays safe.
        return min(int(due), _NEVER_DUE) if due > iteration else iteration + 1

    def _rebuild_schedule(self, iteration: int) -> None:
        state_due = _NEVER_DUE
        next_due = _NEVER_DUE
        every: list[Callable[[Any], object]] = []
        for slot in self._schedule:
            slot.needs_state = slot.entry.needs_model_state
            due = slot.due = self._due_after(slot.entry.trigger, iteration)
            # Extensions that run every step (LogReport accumulating, ...) are called
            # directly on steps where nothing else is due: no trigger call, no bookkeeping.
            slot.every = (
                getattr(slot.entry.trigger, "fires_every_iteration", False) is True
                and not slot.needs_state
                and slot.entry.priority != PRIORITY_SNAPSHOT  # those run after the others
                and not self._enable_profile
            )
            if slot.every:
                every.append(slot.entry.extension)
                continue
            next_due = min(next_due, due)
            if slot.needs_state:
                state_due = min(state_due, due)
        self._every = every
        self._stop_due = self._due_after(self._stop_trigger, iteration)
        self._state_due = state_due
        self._next_due = min(next_due, self._stop_due)
        self._dirty = False

    def _run_due_extensions(self, iteration: int) -> None:
        if self._dirty:
            self._rebuild_schedule(iteration - 1)
            if iteration < self._next_due:
                self._run_every(iteration)
                return
        self._model_available = iteration >= self._state_due
        next_due = _NEVER_DUE
        state_due = _NEVER_DUE
        deferred: list[_Scheduled] = []
        try:
            for slot in self._schedule:
                due = slot.due
                if due <= iteration:
                    trigger = slot.entry.trigger
                    if trigger(self):
                        # Snapshots run after every trigger of this iteration was evaluated,
                        # so the trigger states they save already account for this iteration.
                        if slot.entry.priority == PRIORITY_SNAPSHOT:
                            deferred.append(slot)
                        else:
                            self._call_extension(slot)
                    due = slot.due = self._due_after(trigger, iteration)
                if slot.every:
                    continue
                if due < next_due:
                    next_due = due
                if slot.needs_state and due < state_due:
                    state_due = due
            for slot in deferred:
                self._call_extension(slot)
        finally:
            self._model_available = True
        if self._stop_due <= iteration and self._consult_stop_trigger(iteration):
            self._stop_reached = True
        if self._dirty:
            # An extension changed the registrations or the state: rebuild on the next step.
            self._next_due = -1
        else:
            self._state_due = state_due
            self._next_due = min(next_due, self._stop_due)

    def _call_extension(self, slot: _Scheduled) -> None:
        if self._enable_profile:
            with torch.profiler.record_function(f"ppe_core.ExtensionsManager:{slot.name}"):
                slot.entry.extension(self)
        else:
            slot.entry.extension(self)

    def needs_model_state(self, iteration: int | None = None) -> bool:
        """Whether an extension declaring ``needs_model_state`` may run at ``iteration``.

        Runtimes that defer work use it to make model state current only when needed.

        Args:
            iteration: Completed-iteration count to ask about; the next one by default.
        """
        current = self._iteration
        if iteration is None:
            iteration = current + 1
        if not self._dirty and iteration == current + 1:
            return iteration >= self._state_due
        return any(
            entry.needs_model_state and self._due_after(entry.trigger, iteration - 1) <= iteration
            for entry in self._entries.values()
        )

    # ----------------------------------------------------------------- state dict

    def state_dict(self, *, transform_models: TransformModel | None = None) -> dict[str, Any]:
        """Returns the training state in PPE's layout.

        The layout is PPE's: ``{'_start_iteration': int, '_start_execution': int, 'models':
        {name: state}, 'optimizers': {name: state}, 'state_objects': {name: state},
        'extensions': {name: {'extension': ..., 'trigger': ...}}, 'ppe_version': str}``, so
        PPE's ``load_state_dict`` reads it. ppe-core's own resume data (a Trainer's RNG and
        loader states, its handler's state) is added under ``'_ppe_core'``, a key PPE ignores.
        With the standard extensions it holds only tensors, numbers, strings and containers, so
        ``torch.load(..., weights_only=True)`` reads it.

        Args:
            transform_models: ``(name, module) -> module`` whose result's state is saved;
                the manager's ``transform_model`` by default.
        """
        from ppe_core._version import __version__

        transform = self._transform_model if transform_models is None else transform_models
        state: dict[str, Any] = {
            "_start_iteration": self._iteration,
            "_start_execution": self.execution,
            "models": {name: transform(name, m).state_dict() for name, m in self._models.items()},
            "optimizers": {name: opt.state_dict() for name, opt in self._optimizers.items()},
            "state_objects": {name: obj.state_dict() for name, obj in self._state_objects.items()},
            "extensions": {name: entry.state_dict() for name, entry in self._entries.items()},
            "ppe_version": __version__,
        }
        internal = {name: obj.state_dict() for name, obj in self._internal_states.items()}
        internal = {name: value for name, value in internal.items() if value}
        if internal:
            state[PPE_CORE_STATE_KEY] = internal
        return state

    def load_state_dict(
        self, to_load: Mapping[str, Any], *, transform_models: TransformModel | None = None
    ) -> None:
        """Restores a state from :meth:`state_dict`; works before the extensions start.

        States written by PPE's ``ExtensionsManager.state_dict()`` (and PPE snapshot files)
        load too; ppe-core's own resume data is then absent, so a Trainer resumes at the saved
        iteration with the saved weights, but not bit-exactly. A state from another version
        loads with a :class:`StateVersionWarning`. A registered extension the state has
        nothing for keeps its state and is reported by a :class:`MissingExtensionStateWarning`;
        states of unregistered extensions are ignored.

        Args:
            to_load: A dictionary produced by :meth:`state_dict` (or by PPE's manager).
            transform_models: ``(name, module) -> module`` whose result loads the state; the
                manager's ``transform_model`` by default.

        Raises:
            StateDictKeyError: The state lacks the iteration or a registered model, optimizer
                or state object.
            StateDictMismatchError: A model's or optimizer's state does not fit it (names the
                missing and unexpected keys).
        """
        transform = self._transform_model if transform_models is None else transform_models
        model_states = self._require(to_load, "models", self._models)
        optimizer_states = self._require(to_load, "optimizers", self._optimizers)
        if "_start_iteration" not in to_load:
            raise StateDictKeyError(
                "the state has no '_start_iteration' entry; pass what trainer.state_dict() or "
                "manager.state_dict() returned (or a snapshot file loaded with torch.load)"
            )
        _check_version(to_load.get("ppe_version"))
        object_states: Mapping[str, Any] | None = None
        if "state_objects" in to_load and self._state_objects:
            required = [n for n in self._state_objects if n not in self._optional_state_objects]
            object_states = self._require(to_load, "state_objects", required)
        for name, model in self._models.items():
            _load_model_state(name, transform(name, model), model_states[name])
        for name, optimizer in self._optimizers.items():
            _load_optimizer_state(name, optimizer, optimizer_states[name])
        if object_states is not None:
            for name, obj in self._state_objects.items():
                if name in object_states:
                    obj.load_state_dict(object_states[name])
        extension_states: Mapping[str, Any] = to_load.get("extensions") or {}
        internal_states: Mapping[str, Any] = to_load.get(PPE_CORE_STATE_KEY) or {}
        missing = []
        for name, entry in self._entries.items():
            if name in extension_states:
                entry.load_state_dict(extension_states[name])
            else:
                missing.append(name)
        for name, obj in self._internal_states.items():
            # Before the '_ppe_core' key, ppe-core kept the trainer state among the extensions.
            legacy = extension_states.get(f"_{name}", {}).get("extension")
            saved = internal_states.get(name, legacy)
            if saved is not None:
                obj.load_state_dict(saved)
        self._start_iteration = self._iteration = int(to_load["_start_iteration"])
        self._start_execution = self.execution = int(
            to_load.get("_start_execution", self._iteration)
        )
        self._invalidate_schedule()
        if missing:
            warnings.warn(
                MissingExtensionStateWarning(
                    f"the loaded state has no entry for the extensions {missing}; they keep their "
                    "current state (the state was saved without them, or under other names)"
                ),
                stacklevel=2,
            )

    @staticmethod
    def _require(
        to_load: Mapping[str, Any], key: str, registered: Iterable[str]
    ) -> Mapping[str, Any]:
        states = to_load.get(key)
        if not isinstance(states, Mapping):
            raise StateDictKeyError(
                f"the state has no {key!r} mapping (its keys: {sorted(map(str, to_load))}); pass "
                "what trainer.state_dict() or manager.state_dict() returned, not a model's own "
                "state_dict (load that with model.load_state_dict)"
            )
        missing = [name for name in registered if name not in states]
        if missing:
            raise StateDictKeyError(
                f"the state's {key!r} lacks {missing} (it holds {sorted(states)}); register "
                f"the {key} under the names they were saved with"
            )
        return states


class IgniteExtensionsManager(ExtensionsManager):
    """Runs ppe-core extensions inside a pytorch-ignite ``Engine``'s training loop.

    The manager registers handlers on ``engine``: each iteration gets a fresh observation
    (``report`` works inside the engine's process function), and after the engine's own
    ``ITERATION_COMPLETED`` handlers the due extensions run. When the engine starts, the
    extensions are initialized (so ``snapshot(autoload=True)`` restores the engine's
    iteration and epoch), and they are finalized when it completes. The epoch length is the
    engine's ``len(dataloader)``.

    Args:
        engine: The ``ignite.engine.Engine`` that trains.
        models: A module (named ``"main"``) or a mapping of names to modules.
        optimizers: An optimizer (named ``"main"``) or a mapping of names to optimizers.
        max_epochs: Length of training (the engine's ``run(max_epochs=...)`` decides).
        extensions: Extensions to register right away.
        out_dir: Output directory, used when ``writer`` is None.
        writer: Writer that extensions write files through.
        enable_profile: Whether to wrap each extension call in a profiler ``record_function``.
        enable_trace: Accepted for PPE compatibility (see :class:`ExtensionsManager`).
        state_objects: Further objects whose state is saved, by name.

    Raises:
        ArgumentTypeError: ``engine`` is not an ignite ``Engine``.
        IgniteNotInstalledError: pytorch-ignite is not installed (an ``ImportError``).
    """

    def __init__(
        self,
        engine: Any,
        models: torch.nn.Module | Mapping[str, torch.nn.Module],
        optimizers: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        max_epochs: int,
        *,
        extensions: Sequence[ExtensionLike | Extension | ExtensionEntry] | None = None,
        out_dir: str = "result",
        writer: _Writer | None = None,
        enable_profile: bool = False,
        enable_trace: bool = False,
        state_objects: Mapping[str, StateObjectProtocol] | None = None,
    ) -> None:
        try:
            import ignite.engine
        except ModuleNotFoundError as exc:
            raise IgniteNotInstalledError(
                "IgniteExtensionsManager needs pytorch-ignite: pip install pytorch-ignite "
                "(or use ExtensionsManager with your own loop)"
            ) from exc
        if not isinstance(engine, ignite.engine.Engine):
            raise ArgumentTypeError(
                f"engine must be an ignite.engine.Engine, got {type(engine).__name__}; pass "
                "e.g. ignite.engine.create_supervised_trainer(model, optimizer, loss_fn)"
            )
        # The epoch length is only known when the engine starts (len of its data).
        super().__init__(
            models,
            optimizers,
            max_epochs,
            iters_per_epoch=1,
            extensions=extensions,
            out_dir=out_dir,
            writer=writer,
            enable_profile=enable_profile,
            enable_trace=enable_trace,
            state_objects=state_objects,
        )
        self.engine = engine
        self._start_epoch = 0
        self._loop_handlers_added = False
        self.set_ignite_handlers()

    def set_ignite_handlers(self) -> None:
        """Registers the manager's handlers on the engine (done by the constructor)."""
        from ignite.engine import Events

        self.engine.add_event_handler(Events.STARTED, self._on_engine_started)
        self.engine.add_event_handler(Events.ITERATION_STARTED, self._on_iteration_started)
        self.engine.add_event_handler(Events.COMPLETED, self._on_engine_completed)

    def _on_engine_started(self, engine: Any) -> None:
        from ignite.engine import Events

        iters_per_epoch = len(engine.state.dataloader)
        self._prepare_for_training(0, 0, iters_per_epoch)
        self.start_extensions()  # an autoloading snapshot sets _start_iteration here
        start = self._start_iteration
        engine.state.iteration = start
        engine.state.epoch = self._start_epoch
        self._start_time = time.perf_counter()
        self._prepare_for_training(start, start, iters_per_epoch)
        if not self._loop_handlers_added:
            # Added now so that they run after the handlers the user registered.
            self._loop_handlers_added = True
            engine.add_event_handler(Events.ITERATION_COMPLETED, self._on_iteration_completed)

    def _on_iteration_started(self, engine: Any) -> None:
        self._close_scope()  # left open when the previous iteration raised
        self._begin_iteration(())

    def _on_iteration_completed(self, engine: Any) -> None:
        try:
            self._iteration = int(engine.state.iteration)
            self.execution += 1
            self.run_extensions()
        except Exception as exc:
            self._abort_iteration(exc)
            raise
        self._close_scope()

    def _on_engine_completed(self, engine: Any) -> None:
        self._finalize_extensions()

    def _finalize_extensions(self) -> None:
        for slot in list(self._schedule):
            slot.entry.extension.finalize(self)

    def state_dict(self, *, transform_models: TransformModel | None = None) -> dict[str, Any]:
        """The state of :meth:`ExtensionsManager.state_dict`, with the engine's epoch length."""
        state = super().state_dict(transform_models=transform_models)
        state["_epoch_length"] = self.engine.state.epoch_length
        state["_start_iteration"] = self.engine.state.iteration
        return state

    def load_state_dict(
        self, to_load: Mapping[str, Any], *, transform_models: TransformModel | None = None
    ) -> None:
        """Restores a state; the engine resumes from it when it (re)starts."""
        super().load_state_dict(to_load, transform_models=transform_models)
        epoch_length = to_load.get("_epoch_length") or self._iters_per_epoch
        self._start_epoch = self._start_iteration // int(epoch_length)


_MAX_KEYS = 8  # keys listed in a mismatch message; the rest are counted


def _check_version(saved: object) -> None:
    """Warns (as PPE does) when a state was written by another or an unknown version."""
    from ppe_core._version import __version__

    if saved == __version__ or (
        isinstance(saved, str) and saved.startswith(_COMPATIBLE_PPE_VERSIONS)
    ):
        return
    written = "an unknown version" if saved is None else f"version {saved}"
    warnings.warn(
        StateVersionWarning(
            f"the loaded state was written by {written} (ppe-core is {__version__}, compatible "
            "with PPE 0.9); it loads, but states from other versions may differ"
        ),
        stacklevel=3,
    )


def _key_list(keys: Sequence[str]) -> str:
    listed = ", ".join(repr(k) for k in keys[:_MAX_KEYS])
    more = len(keys) - _MAX_KEYS
    return f"[{listed}{f', ... {more} more' if more > 0 else ''}]"


def _load_model_state(name: str, module: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """``module.load_state_dict(state)``, explaining a mismatch by model name and keys."""
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        expected = list(module.state_dict())
        known = set(expected)
        missing = [k for k in expected if k not in state]
        unexpected = [k for k in state if k not in known]
        lines = [f"the loaded state of model {name!r} does not fit {type(module).__name__}:"]
        if missing:
            lines.append(f"  missing keys (in the model, not in the state): {_key_list(missing)}")
        if unexpected:
            lines.append(
                f"  unexpected keys (in the state, not in the model): {_key_list(unexpected)}"
            )
        lines.extend(
            f"  {line.strip()}" for line in str(exc).splitlines() if "size mismatch" in line
        )
        if not missing and not unexpected and len(lines) == 1:
            lines.append(f"  {exc}")
        prefix = "module."
        if unexpected and all(k.startswith(prefix) for k in unexpected):
            lines.append(
                "The state's keys start with 'module.': it was saved from a DataParallel/"
                "DistributedDataParallel wrapper. Pass transform_model="
                "ppe.training.manager.default_transform_model when saving, or strip the prefix."
            )
        elif missing and all(k.startswith(prefix) for k in missing):
            lines.append(
                "The model's keys start with 'module.': unwrap it when loading with "
                "transform_model=ppe.training.manager.default_transform_model."
            )
        lines.append(
            f"Load a snapshot saved from the same architecture under the name {name!r}, or load "
            f"the weights yourself with model.load_state_dict(state['models'][{name!r}], "
            "strict=False) to keep the matching part."
        )
        raise StateDictMismatchError("\n".join(lines)) from exc


def _load_optimizer_state(name: str, optimizer: Any, state: Mapping[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, explaining a mismatch by optimizer name."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        # Anything with load_state_dict (PPE does not type-check optimizers either).
        optimizer.load_state_dict(state)
        return
    fix = (
        f"Create optimizer {name!r} as when the snapshot was saved (same type, the same "
        "parameters in the same groups), or restore only the weights with "
        "model.load_state_dict(state['models'][<name>])."
    )
    # Hyperparameters each group has now; a state from another optimizer type lacks some.
    before = [set(group) - {"params", "param_names"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(dict(state))
    except (ValueError, KeyError) as exc:
        raise StateDictMismatchError(
            f"the loaded state of optimizer {name!r} ({type(optimizer).__name__}) does not fit "
            f"it: {exc}. {fix}"
        ) from exc
    for index, (keys, group) in enumerate(zip(before, optimizer.param_groups, strict=False)):
        lacking = sorted(keys - set(group))
        if lacking:
            raise StateDictMismatchError(
                f"the loaded state of optimizer {name!r} ({type(optimizer).__name__}) lacks the "
                f"hyperparameters {lacking} in param group {index}: it was saved from a "
                f"different optimizer type. {fix}"
            )
