"""ppe-wandb: the Weights & Biases experiment-tracking extension for ppe-core.

``WandbLogger`` loads on first access, so ppe-core importing the plugin module at discovery
stays cheap (wandb itself is imported by the tracker's worker thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppe_wandb._logger import WandbLogger

__all__ = ["WandbLogger"]


def __getattr__(name: str) -> Any:
    if name == "WandbLogger":
        from ppe_wandb._logger import WandbLogger

        return WandbLogger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
