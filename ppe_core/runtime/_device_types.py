"""Device types beyond PyTorch's own: which torch device a ``DeviceRuntime``'s spec moves to
(a device type PyTorch does not know computes on another type, e.g. an emulated device in host
memory), specs of another type refused, and the device type ``torch.autocast`` runs on,
checked where autocast is switched on. PPE hands the spec to ``torch.device`` and autocast to
``torch.autocast`` as they are, and leaves their errors to PyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ppe_core.errors import ConfigurationError, RuntimeOptionError
from ppe_core.runtime._registry import device_type_of, is_torch_device_type

if TYPE_CHECKING:
    from ppe_core.runtime._device import DeviceRuntime
    from ppe_core.runtime._runtime import BaseRuntime, DeviceLike

__all__ = ["autocast_available", "autocast_device_type_of", "require_autocast", "torch_device_for"]


def torch_device_for(cls: type[DeviceRuntime], device_spec: DeviceLike) -> DeviceLike:
    """The torch device ``cls`` moves to for ``device_spec``, through
    :attr:`~ppe_core.runtime.DeviceRuntime.torch_device_type` if set (a malformed spec of a
    type PyTorch knows is returned as is: ``PyTorchRuntime`` explains it).

    Raises:
        ConfigurationError: ``device_spec`` is of another device type than ``cls`` serves, or
            of a type PyTorch does not know while ``cls`` names no torch device type, or its
            index is not an int.
    """
    name = cls.__name__
    if device_type_of(device_spec) != cls.device_type:
        raise ConfigurationError(
            f"{name} serves {cls.device_type!r} devices, got {device_spec!r}; pass "
            f"device={cls.device_type!r} (or '{cls.device_type}:N'), or leave "
            "runtime_class unset so the device's own runtime is looked up"
        )
    target = cls.torch_device_type
    if target is None:
        try:
            return torch.device(device_spec)
        except (RuntimeError, TypeError, ValueError) as exc:
            if is_torch_device_type(cls.device_type):
                return device_spec
            raise ConfigurationError(
                f"{name} serves {cls.device_type!r}, a device type PyTorch does not know "
                f"(torch.device({str(device_spec)!r}) failed: {exc}); declare "
                f"torch_device_type = 'cpu' in the body of {name} (or the torch device type "
                "its tensors live on), or register the device type with PyTorch first"
            ) from exc
    index = device_spec.index if isinstance(device_spec, torch.device) else None
    if isinstance(device_spec, str) and ":" in device_spec:
        tail = device_spec.partition(":")[2]
        if not tail.isdigit():
            raise ConfigurationError(
                f"{name} cannot use the device {device_spec!r}: the index must be an int, "
                f"e.g. '{cls.device_type}:0'"
            )
        index = int(tail)
    if index is None or target == "cpu":
        return torch.device(target)
    return torch.device(target, index)


def autocast_device_type_of(runtime: BaseRuntime) -> str:
    """The device type ``torch.autocast`` uses for ``runtime``'s models.

    The runtime's ``autocast_device_type`` attribute when it has one (a device type PyTorch
    does not know computes on another type's kernels; see
    :attr:`~ppe_core.runtime.DeviceRuntime.autocast_device_type`), else the type of its
    ``device_spec``.
    """
    named = getattr(runtime, "autocast_device_type", None)
    return named if isinstance(named, str) else device_type_of(runtime.device_spec)


def autocast_available(device_type: str) -> bool:
    """Whether ``torch.autocast`` supports ``device_type`` (``True`` where torch cannot say)."""
    available = getattr(torch.amp, "is_autocast_available", None)  # torch>=2.4
    if available is None:
        return True
    try:
        return bool(available(device_type))
    except RuntimeError:  # a device type PyTorch does not know at all
        return False


def require_autocast(device_type: str, what: str, owner: str) -> None:
    """Raise a clear error if ``torch.autocast`` has no implementation for ``device_type``.

    Called once, where autocast is switched on, so torch's own error ("unsupported autocast
    device_type") never reaches the first training step.
    """
    if autocast_available(device_type):
        return
    raise RuntimeOptionError(
        f"{what} asks for autocast on device type {device_type!r}, which torch.autocast does "
        f"not support; name the torch device type autocast runs on in the runtime class "
        f"({owner}): autocast_device_type = 'cpu' in a DeviceRuntime subclass whose tensors "
        "compute on the host, or the type whose kernels it uses; or switch autocast off"
    )
