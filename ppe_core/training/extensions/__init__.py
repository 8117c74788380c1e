"""Extensions: every extension a plugin registered, reachable as ``extensions.<Name>``.

The standard extensions are registered by ppe-core's built-in plugin through the same
``ppe_register_extensions`` hook third-party packages use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core.errors import RegistryLookupError

if TYPE_CHECKING:
    # What type checkers and IDEs see for the built-in plugin's extensions; at run time every
    # name resolves through the extension registry, like a third-party plugin's.
    from ppe_core.training.extensions._best_value import BestValue, MaxValue, MinValue
    from ppe_core.training.extensions._fail_on_non_number import FailOnNonNumber
    from ppe_core.training.extensions._log_report import LogReport
    from ppe_core.training.extensions._lr_scheduler import LRScheduler
    from ppe_core.training.extensions._micro_average import MicroAverage
    from ppe_core.training.extensions._parameter_statistics import ParameterStatistics
    from ppe_core.training.extensions._plot_report import PlotReport
    from ppe_core.training.extensions._print_report import PrintReport
    from ppe_core.training.extensions._profile_report import ProfileReport
    from ppe_core.training.extensions._progress_bar import ProgressBar
    from ppe_core.training.extensions._snapshot import snapshot, snapshot_object
    from ppe_core.training.extensions._tensorboard import TensorBoard
    from ppe_core.training.extensions._value_observation import observe_lr, observe_value

    __all__ = [
        "BestValue",
        "FailOnNonNumber",
        "LRScheduler",
        "LogReport",
        "MaxValue",
        "MicroAverage",
        "MinValue",
        "ParameterStatistics",
        "PlotReport",
        "PrintReport",
        "ProfileReport",
        "ProgressBar",
        "TensorBoard",
        "observe_lr",
        "observe_value",
        "snapshot",
        "snapshot_object",
    ]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from ppe_core._plugins import get_plugin_host

    try:
        return get_plugin_host().extensions.get(name)
    except RegistryLookupError as exc:
        raise AttributeError(str(exc)) from None


def __dir__() -> list[str]:
    from ppe_core._plugins import get_plugin_host

    return sorted(set(globals()) | set(get_plugin_host().extensions.names()))
