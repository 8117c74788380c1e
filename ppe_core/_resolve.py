"""Runtime resolution with the active plugin host's registry (``ppe_core.plugins``' names).

The resolution itself is :func:`ppe_core.runtime._to.runtime_for`, shared by ``ppe.to`` and
the engine's factories; these functions pass it the host's registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ppe_core.runtime import BaseRuntime, DeviceLike, to
from ppe_core.runtime._registry import active_registry
from ppe_core.runtime._to import runtime_for

__all__ = ["resolve_device", "resolve_runtime", "resolve_runtime_class", "to"]


def resolve_device(device: DeviceLike) -> DeviceLike:
    """``device`` itself, or for ``"auto"`` the ``ppe_default_device`` hook's answer."""
    return active_registry().resolve_device(device)


def resolve_runtime_class(device: DeviceLike) -> type[BaseRuntime]:
    """The runtime class the active registry has for ``device`` (or ``"auto"``)."""
    runtimes = active_registry()
    return runtimes.get_runtime_class_for_device_spec(runtimes.resolve_device(device))


def resolve_runtime(
    device: DeviceLike,
    options: Mapping[str, Any] | None = None,
    runtime_class: type[BaseRuntime] | None = None,
    modules: Iterable[torch.nn.Module] = (),
) -> BaseRuntime:
    """:func:`~ppe_core.runtime._to.runtime_for` with the active plugin host's registry: the
    runtime ``modules`` were moved with when it serves ``device`` (and ``options`` are empty or
    its own), else a new one."""
    return runtime_for(active_registry(), device, options, runtime_class, modules)
