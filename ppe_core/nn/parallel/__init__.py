"""``ppe.nn.parallel``: PPE's ``DistributedDataParallel`` name over PyTorch's implementation."""

from __future__ import annotations

from ppe_core.nn.parallel import distributed
from ppe_core.nn.parallel._distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel", "distributed"]
