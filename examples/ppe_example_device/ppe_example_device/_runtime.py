"""``ExampleDeviceRuntime``: how ppe-core moves models and batches to ``exampledev``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from ppe_testing import enable_emulated_device

from ppe_core.errors import ConfigurationError
from ppe_core.runtime import BaseRuntime, DeviceLike, OptionSpec, RuntimeOptions, device_type_of
from ppe_example_device import _device

__all__ = ["ExampleDeviceRuntime"]


class ExampleDeviceRuntime(BaseRuntime):
    """Runs models on the simulated device ``exampledev`` (or ``exampledev:N``).

    Its tensors live on ppe-core's emulated device ``ppe_emu``: a device type PyTorch treats
    as a real accelerator (an operation mixing it with a CPU tensor fails) whose memory is the
    host's. A real plugin moves to its own torch device (``torch.device("mydev", index)``)
    exactly where this one moves to :attr:`torch_device`.

    Options:
        count_copies: Count the bytes every batch copies onto the device (default ``True``);
            the ``CopyStats`` extension reports them.
    """

    #: The options, declared once: names, accepted types, defaults and docs (the kit checks
    #: that a wrongly typed value fails with the spec's error).
    option_spec: ClassVar[RuntimeOptions] = RuntimeOptions(
        "ExampleDeviceRuntime",
        OptionSpec("count_copies", (bool,), True, "Count the bytes every batch copies.", "False"),
    )
    accepted_options: ClassVar[frozenset[str] | None] = option_spec.names

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        # Before super().__init__: the spec's error lists the accepted options with their types.
        resolved = self.option_spec.validate(options)
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
        self._count: bool = resolved["count_copies"]
        # The emulated device is set up once per process, on the first runtime created.
        emulated = enable_emulated_device(device_count=self.index + 1)
        #: Where this runtime's tensors live (``ppe_emu:N`` for ``exampledev:N``).
        self.torch_device = torch.device(emulated, self.index)

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move parameters and buffers (``module.to`` moves both)."""
        return module.to(self.torch_device)

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Move one tensor; BaseRuntime's ``convert_batch`` calls this for every tensor of a
        batch, inside dicts, lists, tuples and namedtuples."""
        if self._count:
            _device.record_copy(self.index, tensor.numel() * tensor.element_size())
        return tensor.to(self.torch_device)
