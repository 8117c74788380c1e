"""``ppe.dataloaders.utils``: collate helpers."""

from __future__ import annotations

from ppe_core.dataloaders._collate import CollateAsDict

__all__ = ["CollateAsDict"]
