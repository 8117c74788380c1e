"""ParameterStatistics: reports statistics (mean, std, ...) of parameters and gradients."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.reporting import DictSummary
from ppe_core.training.extension import PRIORITY_WRITER, Extension
from ppe_core.training.triggers import get_trigger

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["ParameterStatistics", "StatisticFunction"]

#: Takes a flattened tensor; returns a number or a tensor (one key per element when it has
#: more than one).
StatisticFunction = Callable[[torch.Tensor], Any]


def _std(x: torch.Tensor) -> torch.Tensor:
    # torch.std of one element is NaN and warns; a one-element parameter has no spread to report.
    if x.numel() < 2:
        return torch.full((), math.nan, dtype=x.dtype, device=x.device)
    return torch.std(x)


_DEFAULT_STATISTICS: dict[str, StatisticFunction] = {
    "mean": torch.mean,
    "std": _std,
    "min": torch.min,
    "max": torch.max,
    "zeros": lambda x: (x == 0).sum(),
}


def _check_modules(modules: Iterable[object]) -> None:
    for module in modules:
        if not isinstance(module, torch.nn.Module):
            raise ConfigurationError(
                "ParameterStatistics links must be a torch.nn.Module or an iterable of "
                f"modules, got an element of type {type(module).__name__}"
            )


def _check_default(statistics: str) -> None:
    if statistics != "default":
        raise ConfigurationError(
            f"ParameterStatistics statistics must be 'default', None or a mapping of "
            f"names to functions, got {statistics!r}"
        )


class ParameterStatistics(Extension):
    """Reports statistics of the parameters (and gradients) of modules.

    For every parameter, attribute (``data`` for values, ``grad`` for gradients) and statistic
    it reports ``[<prefix>/]<parameter name>/<attribute>/<statistic>``, e.g.
    ``fc.weight/grad/std``; a statistic returning several values gets one key per element
    (``.../<statistic>/0``, ``.../1``, ...). Parameters without a gradient are skipped for
    ``grad``.

    As in PPE, the extension runs at every iteration and accumulates the statistics of the
    parameters as they are then; when ``trigger`` fires it reports their mean over the
    iterations since the last report (a tensor on the device; ``LogReport`` reads it when it
    computes its means). Reporting epoch-end values instead would give other numbers than
    PPE for the same run.

    Default statistics: ``mean``, ``std`` (unbiased; NaN for one element), ``min``, ``max``
    and ``zeros`` (the number of exact zeros).

    Args:
        links: A module or an iterable of modules whose parameters are observed.
        statistics: ``{name: function}`` of statistic functions; ``'default'`` for the
            defaults, ``None`` for none (add some with :meth:`register_statistics`).
        report_params: Report statistics of the parameter values.
        report_grads: Report statistics of the gradients.
        prefix: Prepended to every key, followed by ``/``.
        trigger: When to report the accumulated means; once per epoch by default.
        skip_nan_params: Report NaN for every statistic of a tensor that contains NaN (without
            a device sync for tensor statistics) instead of its statistics.
    """

    priority = PRIORITY_WRITER
    # Runs at every iteration (as PPE's does); ``trigger`` only decides when to report.
    trigger: TriggerLike = (1, "iteration")
    needs_model_state = True
    report_key_template = "{prefix}{param_name}/{attr_name}/{function_name}"
    default_statistics: Mapping[str, StatisticFunction] = _DEFAULT_STATISTICS

    def __init__(
        self,
        links: torch.nn.Module | Iterable[torch.nn.Module],
        statistics: Mapping[str, StatisticFunction] | str | None = "default",
        report_params: bool = True,
        report_grads: bool = True,
        prefix: str | None = None,
        trigger: TriggerLike = (1, "epoch"),
        skip_nan_params: bool = False,
    ) -> None:
        self._links = [links] if isinstance(links, torch.nn.Module) else list(links)
        _check_modules(self._links)
        if statistics is None:
            self._statistics: dict[str, StatisticFunction] = {}
        elif isinstance(statistics, str):
            _check_default(statistics)
            self._statistics = dict(self.default_statistics)
        else:
            self._statistics = dict(statistics)
        self._attrs = [
            attr for attr, wanted in (("data", report_params), ("grad", report_grads)) if wanted
        ]
        self._prefix = prefix
        self._skip_nan_params = skip_nan_params
        self._report_trigger = get_trigger(trigger)
        self._summary = DictSummary()

    default_name = "parameter_statistics"

    def register_statistics(self, name: str, function: StatisticFunction) -> None:
        """Adds (or replaces) a statistic.

        Args:
            name: The statistic's name in the report keys.
            function: Takes the flattened tensor; returns a number or a tensor.
        """
        self._statistics[name] = function

    def __call__(self, manager: ManagerView) -> None:
        """Accumulates the current statistics; reports their means when the trigger fires."""
        self._summary.add(self.compute())
        if self._report_trigger(manager):
            manager.observation.update(self._summary.compute_mean())
            self._summary = DictSummary()

    def compute(self) -> dict[str, Any]:
        """Returns the statistics of the current parameters, keyed as reported."""
        prefix = f"{self._prefix}/" if self._prefix else ""
        report: dict[str, Any] = {}
        with torch.no_grad():
            for link in self._links:
                for param_name, param in link.named_parameters():
                    for attr_name in self._attrs:
                        tensor = param.detach() if attr_name == "data" else param.grad
                        if tensor is None or tensor.numel() == 0:
                            continue
                        flat = tensor.flatten()
                        has_nan = torch.isnan(flat).any() if self._skip_nan_params else None
                        for function_name, function in self._statistics.items():
                            key = self.report_key_template.format(
                                prefix=prefix,
                                param_name=param_name,
                                attr_name=attr_name,
                                function_name=function_name,
                            )
                            value = function(flat)
                            if has_nan is not None:
                                value = self._nan_if(has_nan, value)
                            if isinstance(value, torch.Tensor) and value.numel() > 1:
                                for index, element in enumerate(value.flatten()):
                                    report[f"{key}/{index}"] = element
                            else:
                                report[key] = value
        return report

    @staticmethod
    def _nan_if(has_nan: torch.Tensor, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            value = value if value.is_floating_point() else value.to(torch.float32)
            return torch.where(has_nan, torch.full_like(value, math.nan), value)
        # A host number from a custom statistic: deciding needs the flag on the host.
        return math.nan if bool(has_nan) else value
