"""ppe-core hook implementations of ppe-extensions: the standard extensions by name, and the
modules behind PPE's import paths that the core keeps as faces.

Cheap at discovery: every name is a lazy ``"module:attribute"`` target, imported when a script
first looks it up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core import hookimpl

if TYPE_CHECKING:
    from ppe_core.plugins import Registry

# The ppe-core hook API this plugin was written for (checked when the plugin registers).
PPE_CORE_HOOK_API = (1, 1)

#: Extension name -> "module:attribute"; imported at first lookup.
_ACC = "ppe_extensions._accumulate:"
EXTENSIONS: dict[str, str] = {
    "LogReport": "ppe_extensions._log_report:LogReport",
    "PrintReport": "ppe_extensions._print_report:PrintReport",
    "ProgressBar": "ppe_extensions._progress_bar:ProgressBar",
    "snapshot": "ppe_extensions._snapshot:snapshot",
    "snapshot_object": "ppe_extensions._snapshot:snapshot_object",
    "LRScheduler": "ppe_extensions._lr_scheduler:LRScheduler",
    "observe_value": "ppe_extensions._value_observation:observe_value",
    "observe_lr": "ppe_extensions._value_observation:observe_lr",
    "FailOnNonNumber": "ppe_extensions._fail_on_non_number:FailOnNonNumber",
    "BestValue": "ppe_extensions._best_value:BestValue",
    "MaxValue": "ppe_extensions._best_value:MaxValue",
    "MinValue": "ppe_extensions._best_value:MinValue",
    "MicroAverage": "ppe_extensions._micro_average:MicroAverage",
    "ParameterStatistics": "ppe_extensions._parameter_statistics:ParameterStatistics",
    "PlotReport": "ppe_extensions._plot_report:PlotReport",
    "ProfileReport": "ppe_extensions._profile_report:ProfileReport",
    "TensorBoard": "ppe_extensions._tensorboard:TensorBoard",
    "Evaluator": "ppe_extensions._evaluator:Evaluator",
    "DistributedEvaluator": "ppe_extensions._evaluator:DistributedEvaluator",
    "IgniteEvaluator": "ppe_extensions._evaluator:IgniteEvaluator",
    "AverageAccumulate": _ACC + "AverageAccumulate",
    "MaxAccumulate": _ACC + "MaxAccumulate",
    "MinAccumulate": _ACC + "MinAccumulate",
    "StandardDeviationAccumulate": _ACC + "StandardDeviationAccumulate",
    "UnbiasedStandardDeviationAccumulate": _ACC + "UnbiasedStandardDeviationAccumulate",
    "PrintReportCLI": "ppe_extensions._print_report:PrintReport",
    "ProgressBarCLI": "ppe_extensions._progress_bar:ProgressBar",
    # PPE defines these only with IPython; ours show tqdm's notebook widget in Jupyter.
    "PrintReportNotebook": "ppe_extensions._print_report:PrintReport",
    "ProgressBarNotebook": "ppe_extensions._progress_bar:ProgressBar",
    "VariableStatisticsPlot": "ppe_extensions._variable_statistics_plot:VariableStatisticsPlot",
    "Slack": "ppe_extensions._slack:Slack",
    "SlackWebhook": "ppe_extensions._slack:SlackWebhook",
    "TimelineTrace": "ppe_extensions._timeline_trace:TimelineTrace",
    "Throughput": "ppe_extensions._throughput:Throughput",
}

#: ppe_core face (PPE's module path) -> the modules of this package that provide its names.
MODULES: dict[str, tuple[str, ...]] = {
    "ppe_core.training.extensions.accumulate._accumulate_base": ("ppe_extensions._accumulate",),
    "ppe_core.training.extensions": (
        "ppe_extensions._snapshot",
        "ppe_extensions._snapshot_export",
    ),
    "ppe_core.training.extensions.accumulate.average_accumulate": ("ppe_extensions._accumulate",),
    "ppe_core.training.extensions.accumulate.max_accumulate": ("ppe_extensions._accumulate",),
    "ppe_core.training.extensions.accumulate.min_accumulate": ("ppe_extensions._accumulate",),
    "ppe_core.training.extensions.accumulate.standard_deviation_accumulate": (
        "ppe_extensions._accumulate",
    ),
    "ppe_core.training.extensions.accumulate.unbiased_standard_deviation_accumulate": (
        "ppe_extensions._accumulate",
    ),
    "ppe_core.training.extensions.best_value": ("ppe_extensions._best_value",),
    "ppe_core.training.extensions.evaluator": ("ppe_extensions._evaluator",),
    "ppe_core.training.extensions.fail_on_non_number": ("ppe_extensions._fail_on_non_number",),
    "ppe_core.training.extensions.log_report": (
        "ppe_extensions._log_buffer",
        "ppe_extensions._log_report",
    ),
    "ppe_core.training.extensions.lr_scheduler": ("ppe_extensions._lr_scheduler",),
    "ppe_core.training.extensions.micro_average": ("ppe_extensions._micro_average",),
    "ppe_core.training.extensions.parameter_statistics": ("ppe_extensions._parameter_statistics",),
    "ppe_core.training.extensions.plot_report": ("ppe_extensions._plot_report",),
    "ppe_core.training.extensions.print_report": ("ppe_extensions._print_report",),
    "ppe_core.training.extensions.print_report_notebook": ("ppe_extensions._print_report",),
    "ppe_core.training.extensions.profile_report": ("ppe_extensions._profile_report",),
    "ppe_core.training.extensions.progress_bar": ("ppe_extensions._progress_bar",),
    "ppe_core.training.extensions.progress_bar_notebook": ("ppe_extensions._progress_bar",),
    "ppe_core.training.extensions.slack": ("ppe_extensions._slack",),
    "ppe_core.training.extensions.timeline_trace": ("ppe_extensions._timeline_trace",),
    "ppe_core.training.extensions.util": ("ppe_extensions._evaluator",),
    "ppe_core.training.extensions.value_observation": ("ppe_extensions._value_observation",),
    "ppe_core.training.extensions.variable_statistics_plot": (
        "ppe_extensions._variable_statistics_plot",
    ),
    "ppe_core.writing": (
        "ppe_extensions._parallel_writer",
        "ppe_extensions._queue_writer",
        "ppe_extensions._tensorboard_writer",
    ),
}


@hookimpl
def ppe_register_extensions(registry: Registry[Any]) -> None:
    """Every standard extension under its public name (``ppe.training.extensions.LogReport``)."""
    for name, target in EXTENSIONS.items():
        registry.register_lazy(name, target)


@hookimpl
def ppe_register_modules(registry: Registry[tuple[str, ...]]) -> None:
    """PPE's module paths of the standard extensions and writers resolve to this package."""
    for path, modules in MODULES.items():
        registry.register(path, modules)
