"""PPE's path ``training.extensions.evaluator``: the extension-style evaluators.

This module *is* the implementation module (it replaces itself with it in ``sys.modules``),
so code that patches a helper here, such as ``_dist_gather`` in PPE's tests, patches what the
evaluators call.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.distributed._env import gather_objects as _dist_gather
from ppe_core.errors import MissingEvalTargetError
from ppe_core.training.extensions import _evaluator
from ppe_core.training.extensions._evaluator import (
    DistributedEvaluator,
    DistributedNotInitializedError,
    Evaluator,
    IgniteEvaluator,
    TextProgressBar,
)

__all__ = [
    "DistributedEvaluator",
    "DistributedNotInitializedError",
    "Evaluator",
    "IgniteEvaluator",
    "MissingEvalTargetError",
    "TextProgressBar",
    "_dist_gather",
]

if not TYPE_CHECKING:  # PPE's names left out here say what to use (docs/migration.md)
    _evaluator.__getattr__ = module_getattr(__name__)
sys.modules[__name__] = _evaluator
