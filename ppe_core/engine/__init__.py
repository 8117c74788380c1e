"""Factories for the Trainer and the Evaluator: the entry points users call."""

from __future__ import annotations

from ppe_core.engine._factories import create_evaluator, create_trainer

__all__ = ["create_evaluator", "create_trainer"]
