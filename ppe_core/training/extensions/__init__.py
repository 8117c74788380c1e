"""Extensions: every extension a plugin registered, reachable as ``extensions.<Name>``.

The standard extensions are registered by ppe-core's built-in plugin through the same
``ppe_register_extensions`` hook third-party packages use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core._active_host import active_host
from ppe_core.errors import RegistryLookupError

if TYPE_CHECKING:
    from ppe_core.training.extensions._accumulate import (
        AverageAccumulate,
        MaxAccumulate,
        MinAccumulate,
        StandardDeviationAccumulate,
        UnbiasedStandardDeviationAccumulate,
    )

    # What type checkers and IDEs see for the built-in plugin's extensions; at run time every
    # name resolves through the extension registry, like a third-party plugin's.
    from ppe_core.training.extensions._best_value import BestValue, MaxValue, MinValue
    from ppe_core.training.extensions._evaluator import (
        DistributedEvaluator,
        Evaluator,
        IgniteEvaluator,
    )
    from ppe_core.training.extensions._fail_on_non_number import FailOnNonNumber
    from ppe_core.training.extensions._log_report import LogReport
    from ppe_core.training.extensions._lr_scheduler import LRScheduler
    from ppe_core.training.extensions._micro_average import MicroAverage
    from ppe_core.training.extensions._parameter_statistics import ParameterStatistics
    from ppe_core.training.extensions._plot_report import PlotReport
    from ppe_core.training.extensions._print_report import PrintReport
    from ppe_core.training.extensions._print_report import PrintReport as PrintReportCLI
    from ppe_core.training.extensions._print_report import PrintReport as PrintReportNotebook
    from ppe_core.training.extensions._profile_report import ProfileReport
    from ppe_core.training.extensions._progress_bar import ProgressBar
    from ppe_core.training.extensions._progress_bar import ProgressBar as ProgressBarCLI
    from ppe_core.training.extensions._progress_bar import ProgressBar as ProgressBarNotebook
    from ppe_core.training.extensions._slack import Slack, SlackWebhook
    from ppe_core.training.extensions._snapshot import SnapshotMode, snapshot, snapshot_object
    from ppe_core.training.extensions._snapshot_export import export_snapshot
    from ppe_core.training.extensions._tensorboard import TensorBoard
    from ppe_core.training.extensions._throughput import Throughput
    from ppe_core.training.extensions._timeline_trace import TimelineTrace
    from ppe_core.training.extensions._value_observation import observe_lr, observe_value
    from ppe_core.training.extensions._variable_statistics_plot import VariableStatisticsPlot

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

#: PPE names in this namespace that are not extensions: attributes of a module, not
#: registry entries.
_ATTRIBUTES: dict[str, str] = {
    "SnapshotMode": "ppe_core.training.extensions._snapshot",
    "export_snapshot": "ppe_core.training.extensions._snapshot_export",
}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _ATTRIBUTES:
        return getattr(importlib.import_module(_ATTRIBUTES[name]), name)
    try:
        return active_host().extensions.get(name)
    except RegistryLookupError as exc:
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
    names = set(globals()) | _SUBMODULES | set(_ATTRIBUTES) | set(active_host().extensions.names())
    return sorted(names)
