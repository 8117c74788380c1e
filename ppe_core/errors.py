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
* ``NoGradientError`` (``ModelOutputError``): the first training step backpropagated nothing.
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

Defined beside the code that raises them, and loaded from there on first access here:

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
  ``WorldSizeMismatchWarning`` (resuming another world size's snapshot),
  ``OptionalDependencyError``, ``NoBestValueError``, ``BestValueKeyError``,
  ``NonFiniteParameterError``, ``SlackTokenError``, ``SlackPostWarning``,
  ``MissingEvalTargetError``, ``NoPlotDataWarning``.
* Reporting and writing: ``NoCurrentReporterError``, ``UnknownObserverError``,
  ``EmptySummaryError``, ``WriterError``, ``WriterFinalizedError``, ``DiskFullError``.
* Configuration (``ppe_core.config``): ``ConfigKeyError``, ``ConfigCycleError``.
* Runtimes and distributed: ``RuntimeOptionTypeError``, ``ProcessGroupNotInitializedError``,
  ``DistributedEnvironmentError``, ``CollectiveTimeoutError``; ``ConformanceError``
  (``ppe_core.testing``'s runtime conformance kit).

Those live beside their code because that code imports this module; loading them lazily keeps
``import ppe_core.errors`` free of the training stack and of import cycles. Inside ppe-core,
import such a class from the module that defines it, not from here: a module that is itself
still importing would otherwise be asked for it half-built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppe_core._reporting import (
        EmptySummaryError,
        NoCurrentReporterError,
        UnknownObserverError,
    )
    from ppe_core.config import ConfigCycleError, ConfigKeyError
    from ppe_core.distributed import (
        CollectiveTimeoutError,
        DistributedEnvironmentError,
        ProcessGroupNotInitializedError,
    )
    from ppe_core.runtime._options import RuntimeOptionTypeError
    from ppe_core.testing import ConformanceError
    from ppe_core.training._resume import WorldSizeMismatchWarning
    from ppe_core.training._run_lock import OutputDirectoryInUseError, RunLockWarning
    from ppe_core.training._state import EpochLengthChangedWarning
    from ppe_core.training._trainer import (
        AmbiguousEvaluatorError,
        UnknownOptimizerError,
        ValLoaderIgnoredWarning,
    )
    from ppe_core.training.extension import DuplicateExtensionError, ExtensionNameError
    from ppe_core.training.extensions._best_value import BestValueKeyError, NoBestValueError
    from ppe_core.training.extensions._fail_on_non_number import NonFiniteParameterError
    from ppe_core.training.extensions._plot_report import NoPlotDataWarning
    from ppe_core.training.extensions._slack import SlackPostWarning, SlackTokenError
    from ppe_core.training.extensions._snapshot import (
        SnapshotError,
        SnapshotRanksError,
        SnapshotRanksWarning,
        SnapshotStateError,
        SnapshotVerificationWarning,
        UnsafeSnapshotError,
    )
    from ppe_core.training.extensions._util import OptionalDependencyError
    from ppe_core.training.extensions.evaluator import MissingEvalTargetError
    from ppe_core.training.manager import (
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
    from ppe_core.training.metrics import MetricInputError, MetricKeyError
    from ppe_core.training.triggers import MissingObservationWarning, TriggerTypeError
    from ppe_core.writing import DiskFullError, WriterError, WriterFinalizedError

#: Classes defined beside the code that raises them: name -> the module that provides it.
_ELSEWHERE: dict[str, str] = {
    "AmbiguousEvaluatorError": "ppe_core.training._trainer",
    "BestValueKeyError": "ppe_core.training.extensions._best_value",
    "CollectiveTimeoutError": "ppe_core.distributed",
    "ConfigCycleError": "ppe_core.config",
    "ConfigKeyError": "ppe_core.config",
    "ConformanceError": "ppe_core.testing",
    "DiskFullError": "ppe_core.writing",
    "DistributedEnvironmentError": "ppe_core.distributed",
    "DuplicateExtensionError": "ppe_core.training.extension",
    "EmptySummaryError": "ppe_core._reporting",
    "EpochLengthChangedWarning": "ppe_core.training._state",
    "ExtensionErrorHandlerWarning": "ppe_core.training.manager",
    "ExtensionNameError": "ppe_core.training.extension",
    "IgniteNotInstalledError": "ppe_core.training.manager",
    "IgnoredArgumentWarning": "ppe_core.training.manager",
    "ManagerStateError": "ppe_core.training.manager",
    "MetricInputError": "ppe_core.training.metrics",
    "MetricKeyError": "ppe_core.training.metrics",
    "MissingEvalTargetError": "ppe_core.training.extensions.evaluator",
    "MissingExtensionStateWarning": "ppe_core.training.manager",
    "MissingObservationWarning": "ppe_core.training.triggers",
    "ModelStateUnavailableError": "ppe_core.training.manager",
    "NoBestValueError": "ppe_core.training.extensions._best_value",
    "NoCurrentReporterError": "ppe_core._reporting",
    "NoPlotDataWarning": "ppe_core.training.extensions._plot_report",
    "NonFiniteParameterError": "ppe_core.training.extensions._fail_on_non_number",
    "OptionalDependencyError": "ppe_core.training.extensions._util",
    "OutputDirectoryInUseError": "ppe_core.training._run_lock",
    "ProcessGroupNotInitializedError": "ppe_core.distributed",
    "RunLockWarning": "ppe_core.training._run_lock",
    "RuntimeOptionTypeError": "ppe_core.runtime._options",
    "SlackPostWarning": "ppe_core.training.extensions._slack",
    "SlackTokenError": "ppe_core.training.extensions._slack",
    "SnapshotError": "ppe_core.training.extensions._snapshot",
    "SnapshotStateError": "ppe_core.training.extensions._snapshot",
    "SnapshotRanksError": "ppe_core.training.extensions._snapshot",
    "SnapshotRanksWarning": "ppe_core.training.extensions._snapshot",
    "SnapshotVerificationWarning": "ppe_core.training.extensions._snapshot",
    "StateDictKeyError": "ppe_core.training.manager",
    "StateDictMismatchError": "ppe_core.training.manager",
    "StateVersionWarning": "ppe_core.training.manager",
    "TriggerTypeError": "ppe_core.training.triggers",
    "UnknownObserverError": "ppe_core._reporting",
    "UnknownOptimizerError": "ppe_core.training._trainer",
    "UnsafeSnapshotError": "ppe_core.training.extensions._snapshot",
    "ValLoaderIgnoredWarning": "ppe_core.training._trainer",
    "WriterError": "ppe_core.writing",
    "WorldSizeMismatchWarning": "ppe_core.training._resume",
    "WriterFinalizedError": "ppe_core.writing",
}

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
    "EpochLengthChangedWarning",
    "ExtensionErrorHandlerWarning",
    "ExtensionNameError",
    "IgniteNotInstalledError",
    "IgnoredArgumentWarning",
    "LazyStateError",
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
    "NoPlotDataWarning",
    "NoRuntimeError",
    "NonFiniteParameterError",
    "NotProvidedError",
    "NotProvidedModuleError",
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
    "TriggerTypeError",
    "UnknownObserverError",
    "UnknownOptimizerError",
    "UnsafeSnapshotError",
    "ValLoaderIgnoredWarning",
    "WorldSizeMismatchWarning",
    "WriterError",
    "WriterFinalizedError",
]


def __getattr__(name: str) -> Any:
    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    """The first training step backpropagated nothing, so the parameters can never change."""


class BatchMismatchError(PPEError, TypeError):
    """A batch from the loader does not fit the model's ``forward`` signature."""


class BatchDtypeError(BatchMismatchError, RuntimeError):
    """A batch tensor's dtype differs from the model's (a ``RuntimeError`` too, as in PyTorch)."""


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
