"""The ExtensionsManager: runs extensions on their triggers around a training loop."""

from __future__ import annotations

import itertools
import os
import time
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from ppe_core._record import record
from ppe_core._version import __version__
from ppe_core.distributed import device_of
from ppe_core.errors import (
    ExtensionErrorHandlerWarning,
    IgniteNotInstalledError,
    IgnoredArgumentWarning,
    ManagerStateError,
    MissingExtensionStateWarning,
    ModelStateUnavailableError,
    StateDictKeyError,
    StateDictMismatchError,
    StateVersionWarning,
)
from ppe_core.reporting import Observation, Reporter
from ppe_core.training._epoch_length import PROVISIONAL_EPOCH_LENGTH, check_triggers, due_checks
from ppe_core.training._extension import Extension, ExtensionEntry, ExtensionLike
from ppe_core.training._handler_failures import call_each
from ppe_core.training._manager_checks import (
    check_iters_per_epoch,
    check_priority,
    check_state_object,
    check_step_optimizers,
    check_writer,
    finalized_error,
    missing_attribute_error,
    model_unavailable_error,
    not_a_model_error,
    unknown_extension_error,
    warn_ignored_arguments,
    warn_missing_extension_states,
    warn_missing_stop_trigger_state,
)
from ppe_core.training._protocols import StateObjectProtocol, WriterProtocol
from ppe_core.training._ranks import agree_on_collectives
from ppe_core.training._resume import (
    ELAPSED_TIME_KEY,
    STOP_TRIGGER_KEY,
    VERSION_KEY,
    EpochLength,
    ResumeStates,
)
from ppe_core.training._run_lock import ManagerRunLock
from ppe_core.training._state import PPE_CORE_STATE_KEY
from ppe_core.training._state_mismatch import (
    check_loadable,
    load_model_state,
    load_optimizer_state,
    warn_other_version,
)
from ppe_core.training._stop_reason import StopCondition, StopReason, max_epochs_trigger
from ppe_core.training.triggers import NEVER, Trigger, TriggerLike, get_trigger, next_due
from ppe_core.writing._extension_files import check_output_files

if TYPE_CHECKING:
    from ppe_core.training._protocols import IterationDriver, ManagerView
    from ppe_core.training._resume import ResumeStateHost

__all__ = [
    "PPE_CORE_STATE_KEY",
    "ExtensionErrorHandlerWarning",
    "ExtensionsManager",
    "IgniteNotInstalledError",
    "IgnoredArgumentWarning",
    "ManagerStateError",
    "MissingExtensionStateWarning",
    "ModelStateUnavailableError",
    "StateDictKeyError",
    "StateDictMismatchError",
    "StateVersionWarning",
    "StopReason",
    "TransformModel",
    "default_transform_model",
    "identity_transform_model",
]


#: ``transform_model(name, model)`` returns the module whose state is saved and observed.
TransformModel = Callable[[str, torch.nn.Module], torch.nn.Module]

#: The PPE release whose state format ppe-core writes, saved as ``state['ppe_version']``: PPE
#: warns on load unless that field equals its own version, so ppe-core's version goes under
#: ``state['_ppe_core']['version']`` (``_resume.VERSION_KEY``) instead.
PPE_FORMAT_VERSION = "0.9.0"


def named_models(
    models: torch.nn.Module | Mapping[str, torch.nn.Module], argument: str = "models"
) -> dict[str, torch.nn.Module]:
    """``models`` as a dict of names to modules (a single module is ``"main"``), checked.

    The one validator of the models arguments, shared by the manager, the Trainer, the
    Evaluator, the ``create_*`` factories and the extension Evaluator (whose ``argument`` is
    ``"target"``), so each says the same thing.

    Raises:
        ArgumentTypeError: An entry is not a ``torch.nn.Module`` instance (a ``ValueError``
            and a ``TypeError``).
    """
    named: dict[str, Any] = dict(models) if isinstance(models, Mapping) else {"main": models}
    for name, model in named.items():
        if not isinstance(model, torch.nn.Module):
            raise not_a_model_error(argument, name, model)
    return named


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
    return model.module if isinstance(model, parallel) else model


class _ElapsedTimeState:
    """The manager's elapsed time, ``state['_ppe_core']['elapsed_time']`` (PPE saves none).

    A resumed run's ``elapsed_time`` goes on from the saved value, so logs and a
    ``TimeTrigger`` (whose next firing time is saved) continue; a state without it (PPE's)
    starts at 0.0, as in PPE.
    """

    def __init__(self, manager: ExtensionsManager) -> None:
        self._manager = manager

    def state_dict(self) -> dict[str, Any]:
        return {"seconds": float(self._manager.elapsed_time)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        manager = self._manager
        start = manager._start_time
        # elapsed_time reads the saved value from now on (this run's loading time not counted).
        manager._elapsed_before = float(state["seconds"])
        if start is not None:
            manager._start_time = time.perf_counter()


class _IterationContext:
    """What ``run_iteration()`` returns: a reusable, allocation-free context manager."""

    __slots__ = ("_manager", "_step_optimizers")

    def __init__(self, manager: ExtensionsManager, step_optimizers: tuple[str, ...]) -> None:
        self._manager = manager
        self._step_optimizers = step_optimizers

    def __enter__(self) -> None:
        self._manager.begin_iteration(self._step_optimizers)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        # Returning None lets the block's exception (if any) propagate unchanged.
        if exc is None:
            self._manager.end_iteration(self._step_optimizers)
        else:
            self._manager.abort_iteration(exc)


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

    The manager keeps the schedule of due extensions and the epoch length, given or learnt
    from a loader without ``len()`` (:meth:`set_epoch_length`); it owns the one stop condition
    (``_stop_reason.StopCondition``, which also says why training ended: :attr:`stop_reason`),
    and saves and loads the state dictionary in PPE's layout. Trainers drive it through
    :meth:`begin_iteration`, :meth:`end_iteration` and :meth:`handle_training_error` (the
    :class:`~ppe_core.training._protocols.IterationDriver` protocol).

    Args:
        models: A module (named ``"main"``) or a mapping of names to modules.
        optimizers: An optimizer (named ``"main"``) or a mapping of names to optimizers.
        max_epochs: Length of training; ignored when ``stop_trigger`` is given. 0 (as in PPE,
            for a manager built only to load a state) means training is over at once.
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
        out_dir: str | os.PathLike[str] = "result",
        stop_trigger: TriggerLike = None,
        writer: WriterProtocol | None = None,
        transform_model: TransformModel | None = identity_transform_model,
        enable_profile: bool = False,
        enable_trace: bool = False,
        state_objects: Mapping[str, StateObjectProtocol] | None = None,
    ) -> None:
        check_iters_per_epoch(iters_per_epoch)
        self._models = named_models(models)
        self._optimizers: dict[str, torch.optim.Optimizer] = (
            dict(optimizers) if isinstance(optimizers, Mapping) else {"main": optimizers}
        )
        self._transform_model = transform = transform_model or identity_transform_model
        transformed = {name: transform(name, m) for name, m in self._models.items()}
        self._models_view: Mapping[str, torch.nn.Module] = types.MappingProxyType(transformed)
        self.max_epochs = max_epochs
        self._iters_per_epoch = iters_per_epoch
        self._objects: dict[str, StateObjectProtocol] = {}
        # State objects a state may lack (added by ppe-core for PPE's layout, not by the user).
        self._optional: set[str] = set()
        # ppe-core's own resume data, saved under PPE_CORE_STATE_KEY.
        self._resume_states = ResumeStates()
        for name, obj in (state_objects or {}).items():
            self.add_state_object(name, obj)
        # Saved with the state so that a resume with another epoch length warns.
        self._epoch_length = EpochLength(lambda: self._iters_per_epoch)
        self._resume_states.add("manager", self._epoch_length)

        self.observation: Observation = {}
        self.reporter = Reporter()
        for name, model in transformed.items():
            # named_modules() starts with the model itself (``""``), which gets ``name``.
            self.reporter.add_observers(name, model.named_modules())
        for name, optimizer in self._optimizers.items():
            self.reporter.add_observer(name, optimizer)

        # The stop condition, consulted at most once per iteration, saved with its state.
        self._stop = StopCondition(
            max_epochs_trigger(max_epochs) if stop_trigger is None else get_trigger(stop_trigger),
            "max_epochs" if stop_trigger is None else "stop_trigger",
        )
        self._resume_states.add(STOP_TRIGGER_KEY, self._stop, builtin=True)
        self._resume_states.add(ELAPSED_TIME_KEY, _ElapsedTimeState(self), builtin=True)

        # The schedule: each entry keeps the first iteration at which its trigger may fire
        # (ExtensionEntry._due), so a step consults triggers only at those iterations.
        self._enable_profile = enable_profile
        self._enable_trace = enable_trace
        #: The entries by name, in registration order.
        self._entries: dict[str, ExtensionEntry] = {}
        #: The entries in invocation order (descending priority, ties in registration order).
        self._slots: list[ExtensionEntry] = []
        # Extensions called directly on steps where nothing else is due (LogReport
        # accumulating, ...): those whose trigger fires every iteration (not when profiling).
        self._every: list[Callable[[Any], object]] = []
        # False while extensions run in an iteration where no needs_model_state one is due:
        # the models then refuse reads.
        self._model_available = True
        # _next_due: the first iteration at which the schedule or the stop trigger is due;
        # _state_due: the first at which an extension declaring needs_model_state is due. -1
        # (as the stop condition's due): the schedule must be rebuilt, which the next step's
        # slow path does.
        self._invalidate_schedule()

        self._iteration = 0
        #: Iterations run by this process since the (possibly restored) start; PPE's name.
        self.execution = 0
        self._start_iteration = 0
        # When the extensions started (None: not yet).
        self._start_time: float | None = None
        # The elapsed time of the run this one resumed, when its state was saved (0.0: none).
        self._elapsed_before = 0.0
        self._finalized = False
        # True once started and until finalized: the one check on the hot path.
        self._ready = False
        # The exception whose on_error handlers ran (each error is handled once).
        self._handled_error: BaseException | None = None
        # While an iteration is open: the reporter's observation before it (restored after).
        self._scope: Observation | None = None
        # Agreed between ranks when the extensions start (see ranks_lacking).
        self._ranks_lacking: dict[str, tuple[int, ...]] | None = None

        # The output directory's run lock while this manager runs (see _take_run_lock).
        self._run_lock = ManagerRunLock()

        # run_iteration()'s context managers, by the optimizers they step.
        self._contexts: dict[tuple[str, ...], _IterationContext] = {(): _IterationContext(self, ())}

        self._out = os.fspath(out_dir)  # a pathlib.Path is accepted, as PPE 0.9 does
        if writer is None:
            # Imported here: the writing module loads only for a manager without a writer.
            from ppe_core.writing import SimpleWriter

            writer = SimpleWriter(out_dir=out_dir)
        else:
            check_writer(writer)
        self.writer: WriterProtocol | None = writer
        writer.initialize(self.out)

        for extension in extensions or ():
            self.extend(extension)

    # ----------------------------------------------------------------- state (ManagerView)

    @property
    def iteration(self) -> int:
        """Completed iterations; already incremented while extensions run.

        Reading it starts the extensions first (as in PPE) so that an extension restoring a
        snapshot in ``initialize`` has run.
        """
        if self._start_time is None:
            self.start_extensions()
        return self._iteration

    @iteration.setter
    def iteration(self, value: int) -> None:
        self._iteration = value
        self._stop.checked_at = -1  # the counter moved: earlier answers no longer apply
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
        """Iterations in one epoch (a provisional, huge count while unknown)."""
        return self._iters_per_epoch

    @property
    def epoch_length_known(self) -> bool:
        """False while the first epoch over a loader without ``len()`` has not run out."""
        return self._epoch_length.known

    def set_epoch_length(self, iters_per_epoch: int | None) -> None:
        """Sets the epoch length; None: unknown until the loader runs out (no ``len()``).

        While unknown the manager counts with a provisional length beyond any run, so no
        epoch-based trigger is due; the trainer sets the real length when the first epoch's
        loader runs out, before that epoch's last iteration ends, so the end-of-epoch
        extensions and ``max_epochs`` fire in that iteration as they would with a known length.

        Raises:
            ConfigurationError: A registered trigger needs the length inside the first epoch
                (``(0.5, 'epoch')``), which an unknown length cannot give.
        """
        if iters_per_epoch is None:
            named: list[tuple[str, Any, object]] = [
                (e.name, e.extension, e.trigger) for e in self._slots
            ]
            named.append(("the stop trigger", None, self._stop.trigger))
            check_triggers(named, self._iteration)
            self._iters_per_epoch = PROVISIONAL_EPOCH_LENGTH
            self._epoch_length.known = False
            self._epoch_length.learns = True
        else:
            self._iters_per_epoch = iters_per_epoch
            self._epoch_length.known = True
            # Extensions that schedule an inner trigger (LogReport's) computed its next due
            # iteration with the provisional length.
            for due in due_checks(e.extension for e in self._slots):
                due.reset()
        self._invalidate_schedule()

    @property
    def is_before_training(self) -> bool:
        """Whether no iteration has completed yet."""
        return self.iteration == 0

    @property
    def elapsed_time(self) -> float:
        """Seconds of training: since the extensions started, plus, after a resume, the
        resumed run's elapsed time when it was saved (PPE restarts it at 0.0)."""
        start = self._start_time
        now = 0.0 if start is None else time.perf_counter() - start
        return self._elapsed_before + now

    @property
    def models(self) -> Mapping[str, torch.nn.Module]:
        """The models after ``transform_model``, by name (read-only mapping).

        Raises:
            ModelStateUnavailableError: Read by an extension that did not declare
                ``needs_model_state`` in an iteration where no such extension runs.
        """
        if not self._model_available:
            raise model_unavailable_error(self._iteration)
        return self._models_view

    @property
    def raw_models(self) -> Mapping[str, torch.nn.Module]:
        """The models as registered, without ``transform_model`` (read-only mapping)."""
        if not self._model_available:
            raise model_unavailable_error(self._iteration)
        return types.MappingProxyType(self._models)

    @property
    def optimizers(self) -> Mapping[str, torch.optim.Optimizer]:
        """The optimizers by name (read-only mapping)."""
        return types.MappingProxyType(self._optimizers)

    def set_optimizer(self, name: str, optimizer: torch.optim.Optimizer) -> None:
        """Registers (or replaces) the optimizer ``name``; it is saved and observed from now on.

        Args:
            name: The optimizer's name (its key in :attr:`optimizers` and state dictionaries).
            optimizer: The optimizer.
        """
        self._optimizers[name] = optimizer
        self.reporter.add_observer(name, optimizer)

    @property
    def out(self) -> str:
        """The output directory: the writer's when it has one, else ``out_dir``."""
        out_dir = getattr(self.writer, "out_dir", None)
        return out_dir if isinstance(out_dir, str) and out_dir else self._out

    @property
    def stop_trigger(self) -> bool:
        """Whether training should stop now (the stop trigger fires at this iteration).

        Repeated reads at the same iteration agree, also with the manager's own check after
        the iteration; the trigger itself is only consulted at the iterations its
        ``next_check`` announces.
        """
        iteration = self.iteration  # starts the extensions first, as PPE's stop_trigger does
        stop = self._stop
        if stop.stopped:
            return True
        if iteration < stop.due and iteration != stop.checked_at:
            return False
        return stop.consult(self, iteration, self._iters_per_epoch)

    @property
    def stop_reason(self) -> StopReason | None:
        """Why training ended (which stop trigger fired, or the error); None while it goes on."""
        return self._stop.reason

    @property
    def _stop_trigger(self) -> Trigger:
        """The stop trigger (PPE's protected attribute; ``stop_trigger`` asks it)."""
        return self._stop.trigger

    @_stop_trigger.setter
    def _stop_trigger(self, trigger: Trigger) -> None:
        self._stop.trigger = trigger

    @property
    def training_length(self) -> tuple[float, str] | None:
        """``(amount, unit)`` the stop trigger announces, e.g. ``(10, 'epoch')``; None if unknown.

        ProgressBar reads it for its total; triggers that cannot tell (early stopping, a
        function) give None.
        """
        get_length = getattr(self._stop.trigger, "get_training_length", None)
        length: tuple[float, str] | None = None if get_length is None else get_length()
        return length

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
        Names are unique, and given as PPE gives them: an extension registered under a taken
        name is renamed ``<name>_1``, ``<name>_2``, ... (the first free ordinal), where
        ``<name>`` is the ``name`` argument, so ``None_1``, ``None_2``, ... when it was left
        out. The name it got is ``extension.name`` (and ``entry.name``).

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
        warn_ignored_arguments(kwargs)
        entry = extension if isinstance(extension, ExtensionEntry) else ExtensionEntry(extension)
        if trigger is not None:
            entry.set_trigger(trigger)
        if priority is not None:
            entry.priority = check_priority(priority)
        if call_before_training is not None:
            entry.call_before_training = bool(call_before_training)

        # As in PPE, a taken name gets the first free ``<name>_N`` built from the ``name``
        # argument itself, so an unnamed duplicate becomes ``None_1``: snapshots keep extension
        # states by name, and these names make them load in PPE and back.
        names = (f"{name}_{n}" for n in itertools.count(1))
        first = entry.name if name is None else name
        unique = next(n for n in itertools.chain([first], names) if n not in self._entries)
        entry.set_name(unique)
        self._entries[unique] = entry
        # sorted() is stable: equal priorities keep registration order.
        self._slots = sorted([*self._slots, entry], key=lambda e: -e.priority)
        self._invalidate_schedule()
        if self._start_time is not None and not getattr(entry.trigger, "finished", False):
            entry.extension.initialize(self)

    def get_extension(self, name: str) -> Extension:
        """Returns the extension registered under ``name``.

        Raises:
            ExtensionNameError: No extension has that name (a ``ValueError``, as in PPE).
        """
        entry = self._entries.get(name)
        if entry is None:
            raise unknown_extension_error(name, self._entries)
        return entry.extension

    if not TYPE_CHECKING:  # type checkers keep flagging misspelt attributes of the manager

        def __getattr__(self, name: str) -> Any:
            # Only reached for attributes the manager lacks: no cost on the ones it has.
            raise missing_attribute_error(type(self).__name__, name)

    @property
    def extensions(self) -> list[tuple[str, ExtensionEntry]]:
        """``(name, entry)`` pairs in invocation order (descending priority)."""
        return [(entry.name, entry) for entry in self._slots]

    # ----------------------------------------------------------------- lifecycle

    def start_extensions(self) -> None:
        """Initializes every extension, then runs those registered ``call_before_training``.

        Called implicitly by the first iteration (and by reading ``iteration`` or
        ``stop_trigger``); later calls do nothing. Extensions whose trigger reports
        ``finished`` are not initialized. First, a manager with extensions locks its output
        directory for this process until it is finalized (one run per directory).

        Raises:
            ConfigurationError: Two extensions would write one file (see
                ``ppe_core.writing._extension_files.check_output_files``).
            OutputDirectoryInUseError: Another live process trains into the same directory.
        """
        if self._start_time is not None:
            return
        check_output_files(self, ((entry.name, entry.extension) for entry in self._slots))
        self._take_run_lock()  # before any initialize: autoload reads the directory
        self._start_time = time.perf_counter()
        with self._run_lock.released_on_error():
            # Before any extension initializes: extensions that issue collectives ask the result.
            self._ranks_lacking = agree_on_collectives(
                self._slots, self._iters_per_epoch, device_of(self._models.values())
            )
            for entry in list(self._slots):  # a copy: extensions may register others
                if not getattr(entry.trigger, "finished", False):
                    entry.extension.initialize(self)
        self.observation = {}
        with self.reporter.scope(self.observation):
            for entry in list(self._slots):
                if entry.call_before_training:
                    self._call(entry)
        self._invalidate_schedule()

    def ranks_lacking(self, name: str) -> tuple[int, ...] | None:
        """The ranks without the collective-using extension ``name``, as agreed at start.

        Under a process group of several ranks, the managers of all ranks exchange once, when
        the extensions start, which extensions declaring ``collectives`` they have (and with
        which trigger and epoch length). An extension may issue a collective only when every
        rank has it: otherwise the ranks that have it would wait forever for the others.
        Every rank that trains must therefore have a manager (extensions may differ).

        Returns:
            The ranks lacking it (or running it on another trigger or epoch length); ``()``
            when every rank has it; None without a process group of several ranks, or for an
            extension registered after the start or declaring no ``collectives``.
        """
        lacking = self._ranks_lacking
        return None if lacking is None else lacking.get(name)

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
            return self._contexts[()]
        names = (step_optimizers,) if isinstance(step_optimizers, str) else tuple(step_optimizers)
        context = self._contexts.get(names)
        if context is None:
            check_step_optimizers(names, self._optimizers)
            context = self._contexts[names] = _IterationContext(self, names)
        return context

    def begin_iteration(self, step_optimizers: Sequence[str] = ()) -> None:
        """Opens an iteration: what ``run_iteration()`` does on entry, without a context manager.

        For trainers (the fast path): starts the extensions on first use, points the reporter
        at a fresh observation and zeroes the named optimizers' gradients. Pair it with
        :meth:`end_iteration` when the step succeeded, or :meth:`abort_iteration` when it
        raised.

        Raises:
            ManagerStateError: The manager is finalized, or an iteration is already open.
        """
        if not self._ready:
            if self._finalized:
                raise finalized_error()
            self.start_extensions()
            self._ready = True
        if self._scope is not None:
            raise ManagerStateError("iterations cannot be nested: the previous one is still open")
        # The reporter becomes current with a fresh observation (push: no scope object per step).
        observation: Observation = {}
        self.observation = observation
        self._scope = self.reporter.push(observation)
        if step_optimizers:
            try:
                for name in step_optimizers:
                    self._optimizers[name].zero_grad()
            except BaseException as exc:
                self.abort_iteration(exc)
                raise

    def end_iteration(self, step_optimizers: Sequence[str] = ()) -> bool:
        """Closes an iteration that succeeded; returns whether training is over.

        Steps the named optimizers, increments the iteration, runs the extensions that are due
        (a single comparison when none is) and, when the stop condition fired, finalizes the
        manager and returns True. On an exception it runs :meth:`abort_iteration`'s error
        handling and re-raises.
        """
        try:
            for name in step_optimizers:
                self._optimizers[name].step()
            iteration = self._iteration = self._iteration + 1
            self.execution += 1
            stop = False
            if iteration >= self._next_due:
                stop = self._run_due_extensions(iteration)
            elif self._every:
                self._run_every()
        except BaseException as exc:
            self.abort_iteration(exc)
            raise
        previous = self._scope  # _close_scope(), inline: this runs every step
        if previous is not None:
            self._scope = None
            self.reporter.pop(previous)
        if stop:
            self.finalize()
        return stop

    def abort_iteration(self, exc: BaseException) -> None:
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
            if exc is not self._handled_error:  # on_error runs once per exception
                self._handled_error = exc
                tb = exc.__traceback__
                calls = [
                    (e.name, partial(e.extension.on_error, self, exc, tb)) for e in self._slots
                ]
                call_each("on_error", calls, exc)
        finally:
            self._close_scope()
            if not isinstance(exc, Exception):
                self._stop.record("error", self._iteration, self._iters_per_epoch, error=exc)
                self._finalize(exc)

    def handle_training_error(self, exc: BaseException) -> None:
        """Handles an error that ends training (a trainer's ``except`` clause calls it).

        Like :meth:`abort_iteration` (``on_error`` is not run twice for one exception),
        then records the error as the :attr:`stop_reason` and finalizes the extensions and
        the writer: a trainer is not reused after an error.
        """
        try:
            self.abort_iteration(exc)
        finally:
            self._stop.record("error", self._iteration, self._iters_per_epoch, error=exc)
            self._finalize(exc)

    def _close_scope(self) -> None:
        """Undo :meth:`begin_iteration`'s reporter switch (no-op outside an iteration)."""
        previous = self._scope
        if previous is not None:
            self._scope = None
            self.reporter.pop(previous)

    def finalize(self) -> None:
        """Finalizes the extensions (if started) and the writer; later calls do nothing.

        Every finalizer runs even if one raises; the first exception is re-raised afterwards.
        Then the output directory's run lock is released. Called automatically when the stop
        trigger fires.
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
            self._run_every()

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

    def _finalize(self, original: BaseException | None) -> None:
        if self._finalized:
            return
        self._finalized = True
        self._ready = False
        slots = self._slots if self._start_time is not None else []
        calls: list[tuple[str, Callable[[], object]]] = [
            (e.name, partial(e.extension.finalize, self)) for e in slots
        ]
        if self.writer is not None:
            calls.append(("<writer>", self.writer.finalize))
        with self._run_lock.released_after():  # after the writer: its saves are on disk
            call_each("finalize", calls, original)

    def _take_run_lock(self) -> None:
        """Locks the output directory for this run when the run writes there (see
        ``_run_lock``: only the extensions write, so a manager without any takes no lock).

        Raises:
            OutputDirectoryInUseError: Another live process trains into the same directory.
        """
        self._run_lock.take(self.out, self.writer is not None and bool(self._entries))

    # ----------------------------------------------------------------- scheduling

    def _invalidate_schedule(self) -> None:
        """Forces the next step through the slow path, which recomputes every due iteration.

        The stop trigger's answer for the iteration it last consulted stays: asked again at
        that iteration, the manager repeats it rather than calling the trigger twice.
        """
        self._next_due = self._state_due = self._stop.due = -1

    def _call(self, entry: ExtensionEntry) -> None:
        """Runs one extension; with ``enable_profile``/``enable_trace`` as PPE's section
        ``ppe.training.ExtensionsManager.run_extensions:<name>`` (a ``torch.profiler`` range,
        timed into the TimeSummary with ``enable_profile``, traced with ``enable_trace``)."""
        if self._enable_profile or self._enable_trace:
            tag = f"ppe.training.ExtensionsManager.run_extensions:{entry.name}"
            with record(tag, enable=self._enable_profile, trace=self._enable_trace):
                entry.extension(self)
        else:
            entry.extension(self)

    def _run_every(self) -> None:
        """Calls the every-iteration extensions: the step where nothing else is due.

        No ``needs_model_state`` extension is due then (``_state_due >= _next_due``), so the
        models refuse reads.
        """
        self._model_available = False
        try:
            for extension in self._every:
                extension(self)
        finally:
            self._model_available = True

    def _run_due_extensions(self, iteration: int) -> bool:
        """The slow path of a step: runs the due extensions, then consults the stop condition.

        Extensions with ``runs_last`` run after every other due trigger of the iteration was
        consulted, so the trigger states they save already account for it.

        Returns:
            Whether the stop condition fired (training is over).
        """
        iters_per_epoch, stop = self._iters_per_epoch, self._stop
        if self._next_due == -1:
            self._rebuild(iteration - 1)
            if iteration < self._next_due:
                self._run_every()
                return False
        self._model_available = iteration >= self._state_due
        earliest = state_due = NEVER
        deferred: list[ExtensionEntry] = []
        try:
            for entry in self._slots:
                due = entry._due
                if due <= iteration:
                    trigger = entry.trigger
                    if trigger(self):
                        if entry.runs_last:
                            deferred.append(entry)
                        else:
                            self._call(entry)
                    due = entry._due = next_due(trigger, iteration, iters_per_epoch)
                if entry._every:
                    continue
                if due < earliest:
                    earliest = due
                if due < state_due and entry.needs_model_state:
                    state_due = due
            if deferred and stop.due <= iteration:
                # The stop trigger too is consulted first: a snapshot saves its state with it.
                stop.consult(self, iteration, self._iters_per_epoch)
            for entry in deferred:
                self._call(entry)
        finally:
            self._model_available = True
        # An extension may have read stop_trigger at this iteration already, moving stop.due
        # past it: its answer (repeated by consult) still counts.
        if stop.due <= iteration or iteration == stop.checked_at:
            stop.stopped = stop.consult(self, iteration, self._iters_per_epoch) or stop.stopped
        # An extension that changed the registrations or the state invalidated the schedule:
        # the next step rebuilds it.
        if self._next_due != -1:
            self._state_due = state_due
            self._next_due = min(earliest, stop.due)
        return stop.stopped

    def _rebuild(self, iteration: int) -> None:
        """Recomputes every due iteration after ``iteration``, and :attr:`_every`."""
        iters_per_epoch = self._iters_per_epoch
        profiling = self._enable_profile or self._enable_trace
        for entry in self._slots:
            entry._due = next_due(entry.trigger, iteration, iters_per_epoch)
            entry._every = getattr(entry.trigger, "fires_every_iteration", False) is True and not (
                entry.needs_model_state or entry.runs_last or profiling
            )
        self._every[:] = [entry.extension for entry in self._slots if entry._every]
        timed = [entry for entry in self._slots if not entry._every]
        earliest = min((entry._due for entry in timed), default=NEVER)
        self._state_due = min((e._due for e in timed if e.needs_model_state), default=NEVER)
        self._stop.due = next_due(self._stop.trigger, iteration, iters_per_epoch)
        self._next_due = min(earliest, self._stop.due)

    def needs_model_state(self, iteration: int | None = None) -> bool:
        """Whether an extension declaring ``needs_model_state`` may run at ``iteration``.

        Runtimes that defer work use it to make model state current only when needed.

        Args:
            iteration: Completed-iteration count to ask about; the next one by default.
        """
        current = self._iteration
        if iteration is None:
            iteration = current + 1
        if self._next_due != -1 and iteration == current + 1:
            return iteration >= self._state_due  # the cached answer covers the next iteration
        return any(
            entry.needs_model_state
            and next_due(entry.trigger, iteration - 1, self._iters_per_epoch) <= iteration
            for entry in self._entries.values()
        )

    # ----------------------------------------------------------------- state dict

    def add_state_object(
        self, name: str, obj: StateObjectProtocol, *, optional: bool = False
    ) -> None:
        """Saves ``obj`` under ``state_dict()['state_objects'][name]`` from now on.

        Like the ``state_objects=`` argument; for parts (a trainer, a handler) that join later.

        Args:
            name: Its key in ``'state_objects'``.
            obj: Anything with ``state_dict()`` and ``load_state_dict(state)``.
            optional: Whether a loaded state may lack it (it then keeps its state).

        Raises:
            ArgumentTypeError: ``obj`` lacks ``state_dict`` or ``load_state_dict``.
        """
        check_state_object(name, obj)
        self._objects[name] = obj
        if optional:
            self._optional.add(name)
        else:
            self._optional.discard(name)

    def add_resume_state(self, name: str, obj: StateObjectProtocol) -> None:
        """Saves ``obj`` under ``state_dict()['_ppe_core'][name]``, a key PPE ignores.

        For ppe-core's own resume data (a Trainer's RNG and loader states, its handler's
        state): PPE's ``load_state_dict`` still reads the state. An empty
        ``obj.state_dict()`` is left out; a loaded state without the entry leaves ``obj`` as
        it is.

        Raises:
            ConfigurationError: ``name`` is a key ppe-core writes there itself (``version``,
                ``world_size``, ``ranks``, ``stop_trigger``, ``elapsed_time``).
        """
        self._resume_states.add(name, obj)

    def resume_state_dict(self) -> dict[str, Any]:
        """This process's own resume data: what :meth:`state_dict` keeps under ``'_ppe_core'``.

        Empty states are left out. Under torch.distributed it differs between ranks (each
        rank's RNG and loader states); a snapshot gathers it from every rank so that each rank
        resumes with its own.
        """
        return self._resume_states.state_dict()

    def state_dict(self, *, transform_models: TransformModel | None = None) -> dict[str, Any]:
        """Returns the training state in PPE's layout, so PPE's ``load_state_dict`` reads it.

        The layout: ``{'_start_iteration': int, '_start_execution': int, 'models': {name:
        state}, 'optimizers': {name: state}, 'state_objects': {name: state}, 'extensions':
        {name: {'extension': ..., 'trigger': ...}}, 'ppe_version': str}``; ``ppe_version`` is
        :data:`PPE_FORMAT_VERSION`. ppe-core's own version and resume
        data (a Trainer's RNG and loader states, its handler's state, a stateful stop
        trigger's state, which PPE does not save) go under
        :data:`PPE_CORE_STATE_KEY`, which PPE ignores. With the standard extensions it holds
        only tensors, numbers, strings and containers, so ``torch.load(...,
        weights_only=True)`` reads it.

        Args:
            transform_models: ``(name, module) -> module`` whose result's state is saved;
                the manager's ``transform_model`` by default.
        """
        transform = self._transform_model if transform_models is None else transform_models
        return {
            "_start_iteration": self._iteration,
            "_start_execution": self.execution,
            "models": {name: transform(name, m).state_dict() for name, m in self._models.items()},
            "optimizers": {name: opt.state_dict() for name, opt in self._optimizers.items()},
            "state_objects": {name: obj.state_dict() for name, obj in self._objects.items()},
            "extensions": {name: e.state_dict() for name, e in self._entries.items()},
            "ppe_version": PPE_FORMAT_VERSION,
            PPE_CORE_STATE_KEY: {VERSION_KEY: __version__, **self.resume_state_dict()},
        }

    def load_state_dict(
        self, to_load: Mapping[str, Any], *, transform_models: TransformModel | None = None
    ) -> None:
        """Restores a state from :meth:`state_dict`; works before the extensions start.

        Everything required is checked before anything is loaded. States written by PPE's
        ``ExtensionsManager.state_dict()`` (and PPE snapshot files) load too; ppe-core's own
        resume data is then absent, so a Trainer resumes at the saved iteration with the saved
        weights, but not bit-exactly, and a stateful stop trigger starts afresh (with a
        :class:`MissingExtensionStateWarning`). A state from another PPE format version or a
        newer ppe-core loads with a :class:`StateVersionWarning`. A registered extension the
        state has nothing for keeps its state and is reported by a
        :class:`MissingExtensionStateWarning`; states of unregistered extensions are ignored.

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
        check_loadable(to_load, self._models, self._optimizers, self._objects, self._optional)
        warn_other_version(to_load)
        for name, model in self._models.items():
            load_model_state(name, transform(name, model), to_load["models"][name])
        for name, optimizer in self._optimizers.items():
            load_optimizer_state(name, optimizer, to_load["optimizers"][name])
        object_states: Mapping[str, Any] = to_load.get("state_objects", {})
        for name, obj in self._objects.items():
            if name in object_states:
                obj.load_state_dict(object_states[name])
        extension_states: Mapping[str, Any] = to_load.get("extensions") or {}
        for name, entry in self._entries.items():
            if name in extension_states:
                entry.load_state_dict(extension_states[name])
        # ppe-core's own, under PPE_CORE_STATE_KEY; the stop trigger's answer is the state's.
        self._stop.checked_at, self._stop.loaded = -1, False
        self._resume_states.load_from(to_load)
        iteration = self._start_iteration = self._iteration = int(to_load["_start_iteration"])
        self.execution = int(to_load.get("_start_execution", iteration))
        self._invalidate_schedule()
        # An extension that keeps no state (Extension's own state_dict) loses nothing.
        stateful = [
            name
            for name, entry in self._entries.items()
            if type(entry.extension).state_dict is not Extension.state_dict
        ]
        warn_missing_extension_states(stateful, extension_states)
        if not self._stop.loaded and self._stop.trigger.state_dict():
            warn_missing_stop_trigger_state(self._stop.trigger)
        learnt = self._epoch_length.after_load(to_load, self._iteration, stacklevel=3)
        if learnt is not None:  # the saved run had learnt the length this run learns
            self.set_epoch_length(learnt)


if TYPE_CHECKING:

    def _implements(
        manager: ExtensionsManager,
    ) -> tuple[IterationDriver, ResumeStateHost, ManagerView]:
        """Checked by mypy: the manager implements the protocols its users rely on."""
        return manager, manager, manager
