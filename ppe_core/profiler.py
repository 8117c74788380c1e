"""Timing helpers (PPE's ``ppe.profiler``): named time sections summarised by ProfileReport."""

from __future__ import annotations

from ppe_core.training.extensions._profile_report import TimeSummary, get_time_summary

__all__ = ["TimeSummary", "get_time_summary"]
