"""PPE's path ``training.extensions.fail_on_non_number``: the non-finite parameter check."""

from __future__ import annotations

from ppe_core.training.extensions._fail_on_non_number import FailOnNonNumber

__all__ = ["FailOnNonNumber"]
