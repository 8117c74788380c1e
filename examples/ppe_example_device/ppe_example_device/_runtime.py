"""``ExampleDeviceRuntime``: how ppe-core moves models and batches to ``exampledev``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.runtime import BaseRuntime, DeviceLike, device_type_of
from ppe_example_device import _device

__all__ = ["ExampleDeviceRuntime"]


class ExampleDeviceRuntime(BaseRuntime):
    """Runs models on the simulated device ``exampledev`` (or ``exampledev:N``).

    Data lives in host memory, so a move is a ``.to("cpu")``; a real device would copy to its
    own memory in :meth:`move_tensor` and :meth:`move_module` instead.

    Options:
        count_copies: Count the bytes every batch copies onto the device (default ``True``);
            the ``CopyStats`` extension reports them.
    """

    #: Declared in the class body, so BaseRuntime rejects any other option key by name.
    accepted_options: ClassVar[frozenset[str] | None] = frozenset({"count_copies"})

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        if device_type_of(device_spec) != "exampledev":
            raise ConfigurationError(
                f"ExampleDeviceRuntime serves 'exampledev' devices, got {device_spec!r}; pass "
                "device='exampledev' or 'exampledev:N'"
            )
        index = str(device_spec).partition(":")[2]
        if index and not index.isdigit():
            raise ConfigurationError(
                f"device {device_spec!r} has no valid index; use 'exampledev' or 'exampledev:0'"
            )
        self.index = int(index or 0)
        count = self.options.get("count_copies", True)
        if not isinstance(count, bool):
            raise ConfigurationError(
                f"runtime option 'count_copies' must be True or False, got {count!r}; e.g. "
                "runtime_options={'count_copies': False}"
            )
        self._count = count

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move parameters and buffers (``module.to`` moves both)."""
        return module.to("cpu")

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Move one tensor; BaseRuntime's ``convert_batch`` calls this for every tensor of a
        batch, inside dicts, lists, tuples and namedtuples."""
        if self._count:
            _device.record_copy(self.index, tensor.numel() * tensor.element_size())
        return tensor.to("cpu")
