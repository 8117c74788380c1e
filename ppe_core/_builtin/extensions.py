"""Built-in plugin registering the standard extensions (LogReport, ProgressBar, ...)."""

from __future__ import annotations

from typing import Any

from ppe_core.hookspecs import hookimpl

#: Extension name -> "module:attribute"; imported at first lookup.
_EXT = "ppe_core.training.extensions."
BUILTIN_EXTENSIONS: dict[str, str] = {
    "LogReport": _EXT + "_log_report:LogReport",
    "PrintReport": _EXT + "_print_report:PrintReport",
    "ProgressBar": _EXT + "_progress_bar:ProgressBar",
    "snapshot": _EXT + "_snapshot:snapshot",
    "snapshot_object": _EXT + "_snapshot:snapshot_object",
    "LRScheduler": _EXT + "_lr_scheduler:LRScheduler",
    "observe_value": _EXT + "_value_observation:observe_value",
    "observe_lr": _EXT + "_value_observation:observe_lr",
    "FailOnNonNumber": _EXT + "_fail_on_non_number:FailOnNonNumber",
    "BestValue": _EXT + "_best_value:BestValue",
    "MaxValue": _EXT + "_best_value:MaxValue",
    "MinValue": _EXT + "_best_value:MinValue",
    "MicroAverage": _EXT + "_micro_average:MicroAverage",
    "ParameterStatistics": _EXT + "_parameter_statistics:ParameterStatistics",
    "PlotReport": _EXT + "_plot_report:PlotReport",
    "ProfileReport": _EXT + "_profile_report:ProfileReport",
    "TensorBoard": _EXT + "_tensorboard:TensorBoard",
    "Evaluator": _EXT + "_evaluator:Evaluator",
    "DistributedEvaluator": _EXT + "_evaluator:DistributedEvaluator",
    "IgniteEvaluator": _EXT + "_evaluator:IgniteEvaluator",
    "AverageAccumulate": _EXT + "_accumulate:AverageAccumulate",
    "MaxAccumulate": _EXT + "_accumulate:MaxAccumulate",
    "MinAccumulate": _EXT + "_accumulate:MinAccumulate",
    "StandardDeviationAccumulate": _EXT + "_accumulate:StandardDeviationAccumulate",
    "UnbiasedStandardDeviationAccumulate": _EXT + "_accumulate:UnbiasedStandardDeviationAccumulate",
    "PrintReportCLI": _EXT + "_print_report:PrintReport",
    "ProgressBarCLI": _EXT + "_progress_bar:ProgressBar",
    # PPE defines these only with IPython; ours show tqdm's notebook widget in Jupyter.
    "PrintReportNotebook": _EXT + "_print_report:PrintReport",
    "ProgressBarNotebook": _EXT + "_progress_bar:ProgressBar",
    "VariableStatisticsPlot": _EXT + "_variable_statistics_plot:VariableStatisticsPlot",
    "Slack": _EXT + "_slack:Slack",
    "SlackWebhook": _EXT + "_slack:SlackWebhook",
    "TimelineTrace": _EXT + "_timeline_trace:TimelineTrace",
    "Throughput": _EXT + "_throughput:Throughput",
}


@hookimpl
def ppe_register_extensions(registry: Any) -> None:
    """Register every built-in extension under its public name."""
    for name, target in BUILTIN_EXTENSIONS.items():
        registry.register_lazy(name, target)
