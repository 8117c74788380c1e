"""PPE's module path ``ppe.nn.parallel.distributed``; the class lives in ``_distributed``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.nn.parallel._distributed import DistFunc, DistributedDataParallel, HookFun, Tensors

__all__ = ["DistFunc", "DistributedDataParallel", "HookFun", "Tensors"]

if not TYPE_CHECKING:
    __getattr__ = module_getattr(__name__)
