"""``ppe.dataloaders.dataloader``: PPE keeps PyTorch's ``DataLoader`` under this path."""

from __future__ import annotations

from torch.utils.data import DataLoader

__all__ = ["DataLoader"]
