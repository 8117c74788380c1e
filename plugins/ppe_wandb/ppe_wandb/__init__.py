"""ppe-wandb: the Weights & Biases experiment-tracking extension for ppe-core.

Importing it is cheap: wandb itself is imported by the worker thread when the run opens.
"""

from __future__ import annotations

from ppe_wandb._logger import WandbLogger

__all__ = ["WandbLogger"]
