"""PPE's path ``training.extensions.value_observation``: the value-observation extensions."""

from __future__ import annotations

from ppe_core.training.extensions._value_observation import (
    observe_lr,
    observe_value,
)

__all__ = ["observe_lr", "observe_value"]
