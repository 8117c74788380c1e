"""PPE's path ``training.extensions.micro_average``: the MicroAverage extension."""

from __future__ import annotations

from ppe_core.training.extensions._micro_average import MicroAverage

__all__ = ["MicroAverage"]
