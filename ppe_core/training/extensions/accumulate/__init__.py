"""PPE's path ``training.extensions.accumulate``: the accumulate extensions."""

from __future__ import annotations

# Imported through PPE's submodule paths so those are attributes of this package, as in PPE.
from ppe_core.training.extensions.accumulate.average_accumulate import AverageAccumulate
from ppe_core.training.extensions.accumulate.max_accumulate import MaxAccumulate
from ppe_core.training.extensions.accumulate.min_accumulate import MinAccumulate
from ppe_core.training.extensions.accumulate.standard_deviation_accumulate import (
    StandardDeviationAccumulate,
)
from ppe_core.training.extensions.accumulate.unbiased_standard_deviation_accumulate import (
    UnbiasedStandardDeviationAccumulate,
)

__all__ = [
    "AverageAccumulate",
    "MaxAccumulate",
    "MinAccumulate",
    "StandardDeviationAccumulate",
    "UnbiasedStandardDeviationAccumulate",
]
