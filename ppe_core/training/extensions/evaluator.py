"""PPE's path ``training.extensions.evaluator``: the extension-style evaluators.

This module *is* the implementation module (it replaces itself with it in ``sys.modules``),
so code that patches a helper here, such as ``_dist_gather`` in PPE's tests, patches what the
evaluators call.
"""

from __future__ import annotations

import sys

from ppe_core.training.extensions import _evaluator
from ppe_core.training.extensions._evaluator import (
    DistributedEvaluator,
    DistributedNotInitializedError,
    Evaluator,
    IgniteEvaluator,
    MissingEvalTargetError,
    TextProgressBar,
)
from ppe_core.training.extensions._util import dist_gather as _dist_gather

__all__ = [
    "DistributedEvaluator",
    "DistributedNotInitializedError",
    "Evaluator",
    "IgniteEvaluator",
    "MissingEvalTargetError",
    "TextProgressBar",
    "_dist_gather",
]

sys.modules[__name__] = _evaluator
