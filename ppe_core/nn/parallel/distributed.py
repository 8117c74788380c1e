"""PPE's module path ``ppe.nn.parallel.distributed``; the class lives in ``_distributed``."""

from __future__ import annotations

from ppe_core.nn.parallel._distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
