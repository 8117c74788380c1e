"""Extensions: every extension a plugin registered, reachable as ``extensions.<Name>``.

The standard extensions ship in the ppe-extensions package, which registers them through the
same ``ppe_register_extensions`` hook third-party packages use; PPE's submodule paths here
(``log_report``, ``snapshot_writers``, ...) are faces that forward to it (``ppe_core._faces``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core._plugins import get_plugin_host
from ppe_core.errors import RegistryLookupError

if TYPE_CHECKING:
    from ppe_extensions._accumulate import (
        AverageAccumulate,
        MaxAccumulate,
        MinAccumulate,
        StandardDeviationAccumulate,
        UnbiasedStandardDeviationAccumulate,
    )

    # For type checkers and IDEs only: what ppe-extensions registers. At run time every name
    # resolves through the extension registry, like a third-party plugin's.
    from ppe_extensions._best_value import BestValue, MaxValue, MinValue
    from ppe_extensions._evaluator import (
        DistributedEvaluator,
        Evaluator,
        IgniteEvaluator,
    )
    from ppe_extensions._fail_on_non_number import FailOnNonNumber
    from ppe_extensions._log_report import LogReport
    from ppe_extensions._lr_scheduler import LRScheduler
    from ppe_extensions._micro_average import MicroAverage
    from ppe_extensions._parameter_statistics import ParameterStatistics
    from ppe_extensions._plot_report import PlotReport
    from ppe_extensions._print_report import PrintReport
    from ppe_extensions._print_report import PrintReport as PrintReportCLI
    from ppe_extensions._print_report import PrintReport as PrintReportNotebook
    from ppe_extensions._profile_report import ProfileReport
    from ppe_extensions._progress_bar import ProgressBar
    from ppe_extensions._progress_bar import ProgressBar as ProgressBarCLI
    from ppe_extensions._progress_bar import ProgressBar as ProgressBarNotebook
    from ppe_extensions._slack import Slack, SlackWebhook
    from ppe_extensions._snapshot import SnapshotMode, snapshot, snapshot_object
    from ppe_extensions._snapshot_export import export_snapshot
    from ppe_extensions._tensorboard import TensorBoard
    from ppe_extensions._throughput import Throughput
    from ppe_extensions._timeline_trace import TimelineTrace
    from ppe_extensions._value_observation import observe_lr, observe_value
    from ppe_extensions._variable_statistics_plot import VariableStatisticsPlot


#: What ppe-extensions registers here (and type checkers see above): a script asking for one
#: without the package is told to install it.
__all__ = [
    "AverageAccumulate",
    "BestValue",
    "DistributedEvaluator",
    "Evaluator",
    "FailOnNonNumber",
    "IgniteEvaluator",
    "LRScheduler",
    "LogReport",
    "MaxAccumulate",
    "MaxValue",
    "MicroAverage",
    "MinAccumulate",
    "MinValue",
    "ParameterStatistics",
    "PlotReport",
    "PrintReport",
    "PrintReportCLI",
    "PrintReportNotebook",
    "ProfileReport",
    "ProgressBar",
    "ProgressBarCLI",
    "ProgressBarNotebook",
    "Slack",
    "SlackWebhook",
    "SnapshotMode",
    "StandardDeviationAccumulate",
    "TensorBoard",
    "Throughput",
    "TimelineTrace",
    "UnbiasedStandardDeviationAccumulate",
    "VariableStatisticsPlot",
    "export_snapshot",
    "observe_lr",
    "observe_value",
    "snapshot",
    "snapshot_object",
]

#: PPE's flag for its IPython-widget PrintReport/ProgressBar variants, which ppe-core does
#: not provide (ProgressBar uses tqdm's notebook widget itself); see docs/migration.md.
_ipython_module_available = False


#: PPE's submodule paths (``ppe.training.extensions.log_report``, ...), imported on access.
#: ``snapshot`` is not one: in PPE, as here, it is the snapshot extension function.
_SUBMODULES = frozenset(
    {
        "accumulate",
        "best_value",
        "evaluator",
        "fail_on_non_number",
        "log_report",
        "lr_scheduler",
        "micro_average",
        "parameter_statistics",
        "plot_report",
        "print_report",
        "profile_report",
        "progress_bar",
        "slack",
        "snapshot_writers",
        "timeline_trace",
        "util",
        "value_observation",
        "variable_statistics_plot",
    }
)

#: The tracker extensions of ppe-core's tracker packages: a script asking for one that is not
#: installed is told which package to install.
_TRACKER_PACKAGES = {"MLflowLogger": "ppe-mlflow", "WandbLogger": "ppe-wandb"}

#: PPE names in this namespace that are not extensions: module attributes, which the modules
#: registered for this path (``ppe_register_modules``) provide.
_ATTRIBUTES = frozenset({"SnapshotMode", "export_snapshot"})


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _ATTRIBUTES:
        from ppe_core._faces import provider_modules

        for module in provider_modules(__name__, name):
            if hasattr(module, name):
                return getattr(module, name)
    try:
        return get_plugin_host().extensions.get(name)
    except RegistryLookupError as exc:
        if name in __all__:
            from ppe_core._faces import missing_provider_error

            raise missing_provider_error(__name__, name) from None
        raise AttributeError(f"{exc}{_tracker_hint(name)}") from None


def _tracker_hint(name: str) -> str:
    """For a tracker extension of a ppe-core package that is not installed, which to install."""
    package = _TRACKER_PACKAGES.get(name)
    if package is None:
        return ""
    return (
        f"\n{name} is provided by the {package} package, which is not installed (or its "
        f"plugin did not load): run `pip install -e plugins/{package.replace('-', '_')}` in a "
        "ppe-core checkout (see docs/tracking.md)"
    )


def __dir__() -> list[str]:
    names = (
        set(globals()) | _SUBMODULES | set(_ATTRIBUTES) | set(get_plugin_host().extensions.names())
    )
    return sorted(names)
