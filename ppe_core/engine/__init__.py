"""Factories for the Trainer and the Evaluator: the entry points users call.

As in PPE, the classes they create (and ``default_transform_model``, create_trainer's default
``transform_model``) are importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.engine._factories import (
    create_evaluator,
    create_trainer,
    filter_state_objects,
    filter_state_objects_dict,
)
from ppe_core.training._evaluator import DistributedEvaluator, Evaluator
from ppe_core.training._manager import default_transform_model
from ppe_core.training._trainer import Trainer

__all__ = [
    "DistributedEvaluator",
    "Evaluator",
    "Trainer",
    "create_evaluator",
    "create_trainer",
    "default_transform_model",
    "filter_state_objects",
    "filter_state_objects_dict",
]


if not TYPE_CHECKING:  # PPE's names left out here say what to use (docs/migration.md)
    __getattr__ = module_getattr(__name__)
