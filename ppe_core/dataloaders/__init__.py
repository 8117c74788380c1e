"""``ppe.dataloaders``: PPE's data-loader names (``DataLoader``, ``utils.CollateAsDict``)."""

from __future__ import annotations

from ppe_core.dataloaders import dataloader, utils
from ppe_core.dataloaders.dataloader import DataLoader

__all__ = ["DataLoader", "dataloader", "utils"]
