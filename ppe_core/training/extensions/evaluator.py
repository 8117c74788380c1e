"""PPE's path ``training.extensions.evaluator``: the extension-style evaluators.

This path *is* ppe-extensions' implementation module (the face replaces itself with it in
``sys.modules``), so code that patches a helper here, such as ``_dist_gather`` in PPE's tests,
patches what the evaluators call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "DistributedEvaluator",
    "DistributedNotInitializedError",
    "Evaluator",
    "IgniteEvaluator",
    "MissingEvalTargetError",
    "TextProgressBar",
    "_dist_gather",
]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._evaluator import (
        DistributedEvaluator,
        DistributedNotInitializedError,
        Evaluator,
        IgniteEvaluator,
        TextProgressBar,
    )

    from ppe_core.distributed import gather_objects as _dist_gather
    from ppe_core.errors import MissingEvalTargetError
else:
    from ppe_core._faces import replace_with_provider

    replace_with_provider(__name__)
