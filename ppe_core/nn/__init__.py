"""``ppe.nn``: PPE's neural-network helpers (``ensure``/``Ensure``, ``ExtendedSequential``, the
lazy layers) and ``ppe.nn.parallel``; each loads on first access."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ppe_core import _not_provided

if TYPE_CHECKING:
    from ppe_core.nn import parallel
    from ppe_core.nn._ensure import Ensure, ensure
    from ppe_core.nn._lazy import (
        LazyBatchNorm1d,
        LazyBatchNorm2d,
        LazyBatchNorm3d,
        LazyConv1d,
        LazyConv2d,
        LazyConv3d,
        LazyLinear,
    )
    from ppe_core.nn._sequential import ExtendedSequential
    from ppe_core.nn.parallel import DistributedDataParallel

# Public name -> the module that defines it.
_NAMES: dict[str, str] = {
    "DistributedDataParallel": "ppe_core.nn.parallel",
    "Ensure": "ppe_core.nn._ensure",
    "ensure": "ppe_core.nn._ensure",
    "ExtendedSequential": "ppe_core.nn._sequential",
    **{
        name: "ppe_core.nn._lazy"
        for name in (
            "LazyBatchNorm1d",
            "LazyBatchNorm2d",
            "LazyBatchNorm3d",
            "LazyConv1d",
            "LazyConv2d",
            "LazyConv3d",
            "LazyLinear",
        )
    },
}

__all__ = [
    "DistributedDataParallel",
    "Ensure",
    "ExtendedSequential",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyLinear",
    "ensure",
    "parallel",
]


def __getattr__(name: str) -> Any:
    if name == "parallel":
        return importlib.import_module(f"{__name__}.parallel")
    module = _NAMES.get(name)
    if module is None:
        raise _not_provided.not_provided_error(__name__, name)  # ppe.nn.modules says why
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
