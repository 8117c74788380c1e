"""Reporting observed values (``report``, ``Reporter``) and summarising them (``Summary``)."""

from __future__ import annotations

from ppe_core._reporting import (
    DictSummary,
    EmptySummaryError,
    NoCurrentReporterError,
    Observation,
    Reporter,
    Scalar,
    Summary,
    UnknownObserverError,
    get_current_reporter,
    report,
    report_scope,
)

__all__ = [
    "DictSummary",
    "EmptySummaryError",
    "NoCurrentReporterError",
    "Observation",
    "Reporter",
    "Scalar",
    "Summary",
    "UnknownObserverError",
    "get_current_reporter",
    "report",
    "report_scope",
]
