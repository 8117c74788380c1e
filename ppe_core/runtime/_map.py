"""PPE's module path of ``map``: ``ppe.runtime._map.map`` is :func:`ppe_core.map`."""

from __future__ import annotations

from ppe_core._map import map

__all__ = ["map"]
