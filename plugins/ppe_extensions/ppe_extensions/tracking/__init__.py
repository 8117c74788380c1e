"""Experiment tracking: the base of tracker extensions that never block a training step.

Tracker packages (``ppe-mlflow``, ``ppe-wandb``) subclass :class:`BaseTracker` and register
their extension through the ``ppe_register_extensions`` hook; see ``docs/tracking.md``.
"""

from __future__ import annotations

from ppe_core.errors import TrackerWarning
from ppe_extensions.tracking._tracker import BaseTracker, TrackerEntry, TrackerReport

__all__ = ["BaseTracker", "TrackerEntry", "TrackerReport", "TrackerWarning"]
