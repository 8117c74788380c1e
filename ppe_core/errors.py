"""Every exception and warning class ppe-core raises, importable from one place.

All errors subclass :class:`PPEError` and the built-in exception a PyTorch or PPE user would
catch in the same situation; all warnings subclass :class:`PPEWarning`. Write
``from ppe_core.errors import ManagerStateError``: no private module is needed to catch one.

Defined here (used across the framework):

* ``PPEError`` / ``PPEWarning``: the two base classes.
* ``ConfigurationError`` (``ValueError``): an argument or option the framework cannot use.
* ``ArgumentTypeError`` (``ConfigurationError``, ``TypeError``): an argument of the wrong type.
* ``DuplicateRegistrationError`` (``ValueError``): a name registered twice.
* ``RegistryLookupError`` (``KeyError``): a name no plugin registered.
* ``RuntimeNotFoundError`` (``RegistryLookupError``): no runtime serves a device type.
* ``PluginLoadError`` (``RuntimeError``) / ``PluginLoadWarning``: a plugin failed to load
  (an error only with ``PPE_STRICT_PLUGINS=1``).
* ``PluginAPIVersionError`` (``PluginLoadError``): a plugin declares a hook API version
  (``PPE_CORE_HOOK_API``) this ppe-core does not provide; reported like any load failure.
* ``TeardownHookWarning``: a teardown hook raised while the run was already failing.
* ``NotProvidedError`` (``AttributeError``) / ``NotProvidedModuleError``
  (``ModuleNotFoundError``): a PPE 0.9 name or module ppe-core leaves out on purpose, accessed
  as an attribute or imported; the message names the PPE module and what to use instead.
* ``PluginHookError`` (``RuntimeError``): a plugin's per-run hook (a setup or teardown) raised.
* ``PluginConflictWarning``: a plugin's registration of a name that a first-party plugin holds
  was skipped.
* ``RuntimeReplacedWarning``: user code registered a runtime over a device type's runtime.
* ``RuntimeOptionError`` (``ConfigurationError``, ``RuntimeError``): a runtime option value
  the runtime cannot use.
* ``DeviceUnavailableError`` (``RuntimeError``): the requested device is not usable on this
  machine; device plugins subclass it (``ppe_cuda.CUDAUnavailableError``).
* ``CodeBlockError`` (``ValueError``): a code block cannot be built or executed as asked.
* ``NoRuntimeError`` (``RuntimeError``): no model was moved with ``ppe.to``.
* ``ModelOutputError`` (``TypeError``, ``RuntimeError``): outputs unusable for backward.
* ``BatchMismatchError`` (``TypeError``): a batch does not fit ``forward``'s signature.
* ``BatchDtypeError`` (``BatchMismatchError``, ``RuntimeError``): a batch tensor's dtype is not
  the model's.
* ``NoGradientWarning`` / ``NoGradientError`` (``ModelOutputError``): the first training step
  backpropagated nothing (a warning, as PPE goes on); a whole epoch gave no parameter a
  gradient (the error, at the next epoch's start).
* ``OptimizerParametersError`` (``ConfigurationError``): an optimizer holds none of the
  models' parameters (built before a move that replaced them, or for another model).
* ``AMPOptionError`` (``ConfigurationError``, ``RuntimeError``): an AMP option cannot be used.
* ``BackwardOutputWarning``: an output named for backward is missing or has no graph.
* ``DistributedNotInitializedError`` (``RuntimeError``): a distributed evaluator without an
  initialised ``torch.distributed``.
* ``MissingObservationError`` (``ConfigurationError``, ``KeyError``): an extension needs a
  reported value that was not reported (accumulate extensions, ``ReduceLROnPlateau``).
* ``TensorCheckError`` (``ValueError``): ``ppe.nn.ensure``/``Ensure`` met a wrong shape or dtype.
* ``LazyStateError`` (``RuntimeError``): a lazy layer's state and the layer disagree on whether
  the first forward has run.
* ``ResetParametersWarning``: ``ExtendedSequential.repeat(mode="init")`` cannot re-initialize a
  module.

Raised by one part of the framework (each class's docstring says when):

* Training: ``AmbiguousEvaluatorError``, ``UnknownOptimizerError``,
  ``ValLoaderIgnoredWarning`` (the Trainer); ``ManagerStateError``,
  ``ModelStateUnavailableError``, ``StateDictKeyError``, ``StateDictMismatchError``,
  ``IgniteNotInstalledError``, ``MissingExtensionStateWarning``,
  ``ExtensionErrorHandlerWarning``, ``IgnoredArgumentWarning``, ``StateVersionWarning``,
  ``EpochLengthChangedWarning`` (the manager and its state); ``OutputDirectoryInUseError``,
  ``RunLockWarning`` (one run per output directory); ``ExtensionNameError``,
  ``DuplicateExtensionError`` (extension names); ``TriggerTypeError``,
  ``MissingObservationWarning`` (triggers); ``MetricInputError``, ``MetricKeyError`` (metrics).
* Extensions: ``SnapshotError``, ``UnsafeSnapshotError``, ``SnapshotStateError``,
  ``SnapshotVerificationWarning``, ``SnapshotRanksError``, ``SnapshotRanksWarning``,
  ``ShardedStateError`` (sharded tensors given to a snapshot mode that writes one whole state,
  or resumed at another world size),
  ``WorldSizeMismatchWarning`` (resuming another world size's snapshot),
  ``OptionalDependencyError``, ``NoBestValueError``, ``BestValueKeyError``,
  ``NonFiniteParameterError``, ``SlackTokenError``, ``SlackPostWarning``, ``TrackerWarning``,
  ``MissingEvalTargetError``, ``NoPlotDataWarning``, ``LogFileError`` (a log file damaged
  before its last entry).
* Reporting and writing: ``NoCurrentReporterError``, ``UnknownObserverError``,
  ``EmptySummaryError``, ``WriterError``, ``WriterFinalizedError``, ``DiskFullError``.
* Configuration (``ppe_core.config``): ``ConfigKeyError``, ``ConfigCycleError``.
* Runtimes and distributed: ``RuntimeOptionTypeError``, ``ProcessGroupNotInitializedError``,
  ``DistributedEnvironmentError``, ``CollectiveTimeoutError``; ``ConformanceError``
  (the runtime conformance kit of ``ppe-testing``); ``EmulatedDeviceError``
  (``DeviceUnavailableError``: ``ppe-testing``'s emulated device cannot be set up). Both
  stay here, where the one hierarchy is, so code can catch them without ppe-testing installed.

Every class is defined here and this module imports nothing of ppe_core: it is the bottom
layer, so any module can import its errors at import time without an import circle. The
modules that raise a class also re-export it at their old path
(``ppe_core.training.manager.ManagerStateError`` is this module's class).
"""

from __future__ import annotations

__all__ = [
    "AMPOptionError",
    "AmbiguousEvaluatorError",
    "ArgumentTypeError",
    "BackwardOutputWarning",
    "BatchDtypeError",
    "BatchMismatchError",
    "BestValueKeyError",
    "CodeBlockError",
    "CollectiveTimeoutError",
    "ConfigCycleError",
    "ConfigKeyError",
    "ConfigurationError",
    "ConformanceError",
    "DeviceUnavailableError",
    "DiskFullError",
    "DistributedEnvironmentError",
    "DistributedNotInitializedError",
    "DuplicateExtensionError",
    "DuplicateRegistrationError",
    "EmptySummaryError",
    "EmulatedDeviceError",
    "EpochLengthChangedWarning",
    "ExtensionErrorHandlerWarning",
    "ExtensionNameError",
    "IgniteNotInstalledError",
    "IgnoredArgumentWarning",
    "LazyStateError",
    "LogFileError",
    "ManagerStateError",
    "MetricInputError",
    "MetricKeyError",
    "MissingEvalTargetError",
    "MissingExtensionStateWarning",
    "MissingObservationError",
    "MissingObservationWarning",
    "ModelOutputError",
    "ModelStateUnavailableError",
    "NoBestValueError",
    "NoCurrentReporterError",
    "NoGradientError",
    "NoGradientWarning",
    "NoPlotDataWarning",
    "NoRuntimeError",
    "NonFiniteParameterError",
    "NotProvidedError",
    "NotProvidedModuleError",
    "OptimizerParametersError",
    "OptionalDependencyError",
    "OutputDirectoryInUseError",
    "PPEError",
    "PPEWarning",
    "PluginAPIVersionError",
    "PluginConflictWarning",
    "PluginHookError",
    "PluginLoadError",
    "PluginLoadWarning",
    "ProcessGroupNotInitializedError",
    "RegistryLookupError",
    "ResetParametersWarning",
    "RunLockWarning",
    "RuntimeNotFoundError",
    "RuntimeOptionError",
    "RuntimeOptionTypeError",
    "RuntimeReplacedWarning",
    "ShardedStateError",
    "SlackPostWarning",
    "SlackTokenError",
    "SnapshotError",
    "SnapshotRanksError",
    "SnapshotRanksWarning",
    "SnapshotStateError",
    "SnapshotVerificationWarning",
    "StateDictKeyError",
    "StateDictMismatchError",
    "StateVersionWarning",
    "TeardownHookWarning",
    "TensorCheckError",
    "TrackerWarning",
    "TriggerTypeError",
    "UnknownObserverError",
    "UnknownOptimizerError",
    "UnsafeSnapshotError",
    "ValLoaderIgnoredWarning",
    "WorldSizeMismatchWarning",
    "WriterError",
    "WriterFinalizedError",
]


# Bases ------------------------------------------------------------------------------------
class PPEError(Exception):
    """Base class of every error ppe-core raises on purpose."""


class PPEWarning(UserWarning):
    """Base class of every warning ppe-core emits."""


class ConfigurationError(PPEError, ValueError):
    """The user passed an argument or option the framework cannot use.

    Subclasses ``ValueError`` so code written against PyTorch-style APIs keeps catching it.
    """


class ArgumentTypeError(ConfigurationError, TypeError):
    """An argument has a type the framework cannot use.

    Subclasses both ``ValueError`` (through :class:`ConfigurationError`) and ``TypeError`` (what
    Python raises for a wrong type), so code catching either keeps working.
    """


# Registries and plugins -------------------------------------------------------------------
class DuplicateRegistrationError(PPEError, ValueError):
    """A name was registered twice without ``replace=True``."""


class RegistryLookupError(PPEError, KeyError):
    """A name was looked up in a registry that does not hold it."""

    def __str__(self) -> str:
        # KeyError quotes its argument; a multi-line message reads better unquoted.
        return str(self.args[0]) if self.args else ""


class RuntimeNotFoundError(RegistryLookupError):
    """No runtime is registered for the requested device type."""


class PluginLoadError(PPEError, RuntimeError):
    """A plugin failed to import or register (raised only in strict mode)."""


class PluginAPIVersionError(PluginLoadError):
    """A plugin was written for a hook API version (``PPE_CORE_HOOK_API``) this ppe-core lacks."""


class PluginLoadWarning(PPEWarning):
    """A plugin failed to import or register and was skipped."""


class TeardownHookWarning(PPEWarning):
    """A teardown hook raised while a run was already failing; the run's error is kept."""


class PluginHookError(PPEError, RuntimeError):
    """A plugin's per-run hook raised; the message names the plugin and how to disable it."""


class PluginConflictWarning(PPEWarning):
    """A plugin registered a name a first-party plugin holds; its registration was skipped."""


# PPE names ppe-core leaves out (ppe_core._not_provided) ------------------------------------
class NotProvidedError(PPEError, AttributeError):
    """A PPE 0.9 name ppe-core does not provide was accessed (``ppe.cuda``, ``ppe.get_xp``).

    An ``AttributeError``, so ``hasattr(ppe, "cuda")`` is False and feature detection works.
    """


class NotProvidedModuleError(PPEError, ModuleNotFoundError):
    """A PPE 0.9 module ppe-core does not provide was imported (``import ppe_core.cuda``).

    ``name`` is the PPE module that provides it (``pytorch_pfn_extras.cuda``).
    """


# Runtimes and code blocks -----------------------------------------------------------------
class RuntimeReplacedWarning(PPEWarning):
    """User code registered a runtime for a device type that already had one (PPE's way)."""


class RuntimeOptionError(ConfigurationError, RuntimeError):
    """A runtime option has a value the runtime cannot use (also a ``RuntimeError``, as in PPE)."""


class DeviceUnavailableError(PPEError, RuntimeError):
    """The requested device cannot be used on this machine (no driver, no hardware, ...).

    Device plugins raise a subclass naming their device, with what to install or which device
    to use instead.
    """


class CodeBlockError(PPEError, ValueError):
    """A code block cannot be built or executed as asked."""


# Handlers and logics ----------------------------------------------------------------------
class NoRuntimeError(PPEError, RuntimeError):
    """No model was passed through ``ppe.to``, so no runtime can execute it."""


class ModelOutputError(PPEError, TypeError, RuntimeError):
    """The model's output cannot be used for backward (a ``RuntimeError`` too, as in PyTorch)."""


class NoGradientError(ModelOutputError):
    """A whole epoch gave no parameter a gradient (after :class:`NoGradientWarning` at its
    first step), so the run would end with the weights it started with."""


class NoGradientWarning(PPEWarning):
    """The first training step backpropagated nothing, so the parameters were not updated; the
    step goes on as in PPE, and :class:`NoGradientError` follows if a whole epoch trains
    nothing."""


class BatchMismatchError(PPEError, TypeError):
    """A batch from the loader does not fit the model's ``forward`` signature."""


class BatchDtypeError(BatchMismatchError, RuntimeError):
    """A batch tensor's dtype differs from the model's (a ``RuntimeError`` too, as in PyTorch)."""


class OptimizerParametersError(ConfigurationError):
    """An optimizer holds none of the trained models' parameters, so its steps would change
    nothing the models use: usually built before a move that made new parameter objects."""


class AMPOptionError(ConfigurationError, RuntimeError):
    """An AMP option cannot be used as given (a ``RuntimeError`` too, as PPE raises)."""


class BackwardOutputWarning(PPEWarning):
    """An output named for backward is missing or has no graph, so it is skipped (as in PPE)."""


# Evaluation and extensions ----------------------------------------------------------------
class DistributedNotInitializedError(PPEError, RuntimeError):
    """Distributed evaluation was asked for before ``torch.distributed`` was initialised."""


class MissingObservationError(ConfigurationError, KeyError):
    """An extension needs a reported value that was not reported this period.

    A ``KeyError`` (a missing key, as the accumulate extensions raised) and a ``ValueError``
    (through :class:`ConfigurationError`, as ``LRScheduler``'s stepper raised).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # unquoted, unlike KeyError


# Neural-network helpers (ppe.nn) -----------------------------------------------------------
class TensorCheckError(PPEError, ValueError):
    """``ppe.nn.ensure`` or ``ppe.nn.Ensure`` met a tensor of the wrong shape or dtype (a
    ``ValueError``, as PPE raises)."""


class LazyStateError(PPEError, RuntimeError):
    """A lazy layer's state and the layer disagree on whether the first forward has run (a
    ``RuntimeError``, as PPE raises)."""


class ResetParametersWarning(PPEWarning):
    """``ExtendedSequential.repeat(mode="init")`` met a module with parameters or buffers but no
    ``reset_parameters``; its copies keep the original values (a ``UserWarning``, as in PPE)."""


# Runtimes and options ----------------------------------------------------------------------------
class RuntimeOptionTypeError(RuntimeOptionError, ArgumentTypeError):
    """A runtime option has the wrong type (a ``TypeError`` and a ``ValueError``)."""


# Distributed -------------------------------------------------------------------------------------
class DistributedEnvironmentError(ConfigurationError):
    """The launcher's environment variables cannot start a process group (a ``ValueError``)."""


class CollectiveTimeoutError(PPEError, RuntimeError):
    """A collective waited longer than the process group's timeout: a peer rank stopped
    responding (frozen, deadlocked, crashed without closing its connections, or far slower)."""


class ProcessGroupNotInitializedError(PPEError, RuntimeError):
    """``num_replicas``/``rank`` were left out but no ``torch.distributed`` group exists."""


# Configuration (ppe_core.config) -----------------------------------------------------------------
class ConfigKeyError(PPEError, KeyError, IndexError, TypeError):
    """A config key, list index, attribute or ``type`` name that does not resolve.

    Catchable as what PPE lets through for the same lookup: ``KeyError`` (a missing dict key or
    type name), ``IndexError`` (a list index out of range) or ``TypeError`` (indexing a value
    that has no items).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # unquoted, unlike KeyError


class ConfigCycleError(PPEError, RuntimeError):
    """Config keys that refer to each other in a circle, or files that import each other.

    A ``RuntimeError``, as PPE raises for both.
    """


# Reporting ---------------------------------------------------------------------------------------
class NoCurrentReporterError(PPEError, IndexError):
    """An operation needed the current reporter but no :class:`Reporter` is active.

    Subclasses ``IndexError`` because that is what PPE raises in the same situation.
    """


class UnknownObserverError(RegistryLookupError):
    """A value was reported with an observer that was never registered with the reporter."""


class EmptySummaryError(PPEError, ZeroDivisionError):
    """A mean was requested from a summary that has accumulated no weight yet."""


# Writing -----------------------------------------------------------------------------------------
class WriterError(PPEError, RuntimeError):
    """Saving a file failed in a writer's background thread or process."""


class WriterFinalizedError(PPEError, RuntimeError):
    """A writer was asked to save after :meth:`Writer.finalize` shut it down."""


class DiskFullError(PPEError, OSError):
    """A save failed because the file system holding the file is full (or over quota).

    An ``OSError`` with ``errno.ENOSPC`` whose message names the file, raised instead of the
    serializer's own error (torch's is an ``inline_container.cc`` message that does not say
    why the write failed).
    """


# Triggers ----------------------------------------------------------------------------------------
class TriggerTypeError(ArgumentTypeError):
    """A trigger or trigger argument has the wrong type.

    Subclasses both ``ValueError`` (through :class:`ConfigurationError`) and ``TypeError``, so
    code catching either keeps working.
    """


class MissingObservationWarning(PPEWarning):
    """A value trigger reached a check but the monitored key was not in the observation, or a
    key a ``PrintReport`` prints is in no log entry of the first epoch (an empty column)."""


# Extensions and their names ----------------------------------------------------------------------
class ExtensionNameError(ConfigurationError):
    """An extension name is invalid or no extension is registered under the requested name."""


class DuplicateExtensionError(ExtensionNameError, DuplicateRegistrationError):
    """An extension was registered under an explicit name that is already taken."""


# The manager, its state and resuming -------------------------------------------------------------
class ManagerStateError(PPEError, RuntimeError):
    """The manager was used in a state that does not allow it (finalized, nested iteration)."""


class ModelStateUnavailableError(PPEError, RuntimeError):
    """An extension read ``manager.models`` in an iteration where model state is not current.

    Only extensions declaring ``needs_model_state = True`` may read models while extensions run,
    because runtimes that defer work only make the model state current for them.
    """


class ExtensionErrorHandlerWarning(PPEWarning):
    """An ``on_error`` or ``finalize`` handler raised while training was failing.

    The handler's exception is reported by this warning so that the original training error,
    which is re-raised, is not masked.
    """


class IgnoredArgumentWarning(PPEWarning):
    """A keyword argument PPE accepts for compatibility was passed and has no effect."""


class IgniteNotInstalledError(PPEError, ImportError):
    """``IgniteExtensionsManager`` was created without pytorch-ignite installed."""


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


class StateVersionWarning(PPEWarning):
    """A loaded state was written by another (or an unknown) version.

    A ``UserWarning`` mentioning "version", as PPE's. States written by ppe-core itself and by
    the PPE release ppe-core is compatible with load without it.
    """


class EpochLengthChangedWarning(PPEWarning):
    """A resumed state was saved with another number of iterations per epoch than this run has.

    The dataset length or the batch size changed: epoch boundaries fall at other iterations, so
    epoch-based triggers fire at other iterations than in the saved run.
    """


class WorldSizeMismatchWarning(PPEWarning):
    """A state saved by a run of another world size was loaded.

    Weights, optimizer states and iteration counts resume exactly; each rank's RNG states and
    loader position do not (every rank restores the saving rank's), and the data is split
    differently across ranks, so the run is not the one the saved run would have continued.
    """


class OutputDirectoryInUseError(PPEError, RuntimeError):
    """Another live process is training into the same ``out_dir`` (it holds the run lock)."""


class RunLockWarning(PPEWarning):
    """The run lock was taken over from a process that is gone, taken again after its file was
    deleted while held, or cannot be taken here."""


# The Trainer -------------------------------------------------------------------------------------
class AmbiguousEvaluatorError(PPEError, ValueError):
    """``trainer.evaluator`` was read while several evaluators are registered."""


class UnknownOptimizerError(PPEError, KeyError):
    """``get_optimizer`` was asked for a name the trainer does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ValLoaderIgnoredWarning(PPEWarning):
    """``run()`` got a ``val_loader`` but the trainer has no evaluator to use it."""


# Metrics -----------------------------------------------------------------------------------------
class MetricInputError(ConfigurationError, RuntimeError):
    """A metric got labels and predictions it cannot compare (PPE fails with a RuntimeError)."""


class MetricKeyError(PPEError, KeyError):
    """A metric's key is missing from the batch or the outputs (a ``KeyError``, as in PPE)."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


# Extensions --------------------------------------------------------------------------------------
class OptionalDependencyError(PPEError, ImportError):
    """A feature needs a package that is not installed; the message says what to install."""


def missing_extra_error(feature: str, package: str, extra: str) -> OptionalDependencyError:
    """Builds the error raised when ``feature`` needs the uninstalled ``package``."""
    return OptionalDependencyError(
        f"{feature} needs {package}, which is not installed. Install it with "
        f"`pip install 'ppe-core[{extra}]'` (or `pip install {package}`)."
    )


class SnapshotError(PPEError, RuntimeError):
    """A snapshot could not be written, verified or loaded."""


class UnsafeSnapshotError(SnapshotError):
    """A snapshot needs arbitrary unpickling to load, so it was refused."""


class SnapshotStateError(SnapshotError, TypeError):
    """A state to snapshot holds a value that the safe loader could not rebuild at resume."""


class SnapshotVerificationWarning(PPEWarning):
    """A file was skipped at autoload: it failed verification, could not be read (truncated,
    corrupt, an unreadable manifest), is not a snapshot, or links out of the output directory."""


class SnapshotRanksError(SnapshotError):
    """A snapshot that needs every rank (DISTRIBUTED or SHARDED mode, or one autoloading a
    snapshot to resume) is registered on some ranks only, or with another trigger there.

    Raised when the extensions start, on every rank that has it, instead of hanging in a
    collective the other ranks never reach (or training ranks that resumed differently).
    """


class ShardedStateError(SnapshotError):
    """A snapshot that writes one whole state (``SnapshotMode.DEFAULT`` or ``DISTRIBUTED``, or
    ``snapshot_object``) was given sharded tensors (DTensors: an FSDP2 ``fully_shard`` or
    tensor-parallel model, or its optimizer), or a ``SnapshotMode.SHARDED`` snapshot of such
    state is resumed by another number of processes.

    Each rank holds only its part of them, so the file would hold the saver's part only and a
    resumed run would train other weights. Raised before anything is written: when training
    starts, on every rank (for DTensors only an extension's state holds: when the saver takes
    the state).
    """


class SnapshotRanksWarning(PPEWarning):
    """A DEFAULT-mode snapshot is registered on some ranks only (or with another trigger).

    It then issues no collective (nothing hangs) but cannot gather the other ranks' RNG and
    loader states: a run resumed from it is bit-exact on the saving rank only.
    """


class NoBestValueError(PPEError, RuntimeError):
    """The best value was read before any value was observed.

    Subclasses ``RuntimeError``, which PPE raised here.
    """


class BestValueKeyError(PPEError, KeyError):
    """The tracked key was not reported when BestValue ran (a ``KeyError``, as in PPE)."""


class NonFiniteParameterError(PPEError, RuntimeError):
    """A model parameter (or its gradient) holds NaN or inf: training diverged.

    Subclasses ``RuntimeError``, which PPE raised here.
    """


class SlackTokenError(ConfigurationError, RuntimeError):
    """``Slack`` got no bot token (neither ``token=`` nor ``SLACK_BOT_TOKEN``)."""


class SlackPostWarning(PPEWarning):
    """A Slack post or upload failed; training goes on."""


class TrackerWarning(PPEWarning):
    """An experiment tracker (``ppe_core.tracking.BaseTracker``) dropped or could not send
    entries: its queue overflowed, its backend failed after the retries, or the flush at the
    end of training timed out. Training goes on; the warning counts what was not sent.
    """


class MissingEvalTargetError(ConfigurationError, KeyError):
    """An evaluator has neither an ``eval_func`` nor a target named ``'main'`` to call.

    Subclasses ``KeyError``, which PPE raises (``self._targets['main']``) in this situation.
    """

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class NoPlotDataWarning(PPEWarning):
    """PlotReport had no value of any of its keys to plot, so it wrote no file."""


class LogFileError(PPEError, ValueError):
    """``LogReport.read`` found a log file damaged before its last entry (a CSV log truncated
    or overwritten in place, lines of two writers mixed); the message names the file, where
    it is damaged and how to get a whole log back."""


# The runtime conformance kit and the emulated device (the ppe-testing distribution) --------------
class ConformanceError(PPEError, AssertionError):
    """A runtime broke the runtime contract; the message says what is wrong and how to fix it.

    Also an ``AssertionError``, so pytest reports it as a test failure, not an error.
    """


class EmulatedDeviceError(DeviceUnavailableError):
    """``ppe_testing``'s emulated device cannot be set up in this process: torch lacks
    the PrivateUse1 Python hooks, PrivateUse1 already serves another name, or autograd ran
    before it was enabled."""
