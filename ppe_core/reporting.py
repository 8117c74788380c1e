"""Reporting observed values (``report``, ``Reporter``) and summarising them (``Summary``)."""

from __future__ import annotations

from ppe_core._reporting import (
    DictSummary,
    FloatLikeValue,
    Observation,
    Reporter,
    Scalar,
    Summary,
    Value,
    divide_scalar,
    get_current_reporter,
    multiply_scalar,
    report,
    report_scope,
    subtract_scalar,
    to_floats,
)
from ppe_core.errors import EmptySummaryError, NoCurrentReporterError, UnknownObserverError

__all__ = [
    "DictSummary",
    "EmptySummaryError",
    "FloatLikeValue",
    "NoCurrentReporterError",
    "Observation",
    "Reporter",
    "Scalar",
    "Summary",
    "UnknownObserverError",
    "Value",
    "divide_scalar",
    "get_current_reporter",
    "multiply_scalar",
    "report",
    "report_scope",
    "subtract_scalar",
    "to_floats",
]
