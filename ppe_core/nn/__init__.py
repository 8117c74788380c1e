"""``ppe.nn``: neural-network helpers; ppe-core provides ``ppe.nn.parallel`` only."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppe_core.nn import parallel
    from ppe_core.nn.parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel", "parallel"]


def __getattr__(name: str) -> Any:
    if name == "parallel":
        return importlib.import_module(f"{__name__}.parallel")
    if name == "DistributedDataParallel":
        return importlib.import_module(f"{__name__}.parallel").DistributedDataParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
