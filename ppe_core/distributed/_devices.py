"""Which device a rank trains on, and where its object collectives put their payload."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

__all__ = ["device_of", "object_device"]


def device_of(models: Iterable[torch.nn.Module]) -> torch.device | None:
    """The device of the first parameter of ``models``: where this rank trains."""
    for model in models:
        for parameter in model.parameters():
            return parameter.device
    return None


def object_device(device: torch.device | None) -> AbstractContextManager[Any]:
    """Makes ``device`` its type's current device while object collectives run.

    ``all_gather_object`` and ``gather_object`` place their payload on the backend's current
    device of its type (for NCCL, the current accelerator): without this every rank that did
    not select its own device would use device 0. CPU devices need nothing.
    """
    if device is None or device.type == "cpu" or device.index is None:
        return contextlib.nullcontext()
    scope = getattr(torch.get_device_module(device.type), "device", None)
    return scope(device.index) if callable(scope) else contextlib.nullcontext()
