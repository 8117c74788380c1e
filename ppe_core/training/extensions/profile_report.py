"""PPE's path ``training.extensions.profile_report``: the ProfileReport extension."""

from __future__ import annotations

from ppe_core.training.extensions._profile_report import ProfileReport

__all__ = ["ProfileReport"]
