"""``CPURuntime``: the runtime for ``device="cpu"``, with CPU options (bf16 autocast, threads,
channels-last, ``torch.compile``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ppe_core.runtime import DeviceLike, DeviceRuntime, OptionSpec, RuntimeOptions, positive_int

__all__ = ["CPU_OPTIONS", "CPURuntime"]

#: The options ``CPURuntime`` accepts (also rendered in docs/runtimes.md).
CPU_OPTIONS = RuntimeOptions(
    "CPURuntime",
    *DeviceRuntime.shared_options("cpu", torch.bfloat16),
    OptionSpec(
        "num_threads",
        (int,),
        None,
        "`torch.set_num_threads(n)` when the runtime is created (default: leave torch's).",
        "4",
        positive_int,
    ),
)


class CPURuntime(DeviceRuntime):
    """Runs models on the host CPU.

    Options (``ppe.to(model, "cpu", options=...)``; see :data:`CPU_OPTIONS`):
        autocast: ``True`` (bfloat16), a dtype, or a dict of ``torch.autocast`` arguments;
            the module's forward runs under ``torch.autocast("cpu")``.
        grad_scaler: As in ``PyTorchRuntime``.
        num_threads: Intra-op threads, set with ``torch.set_num_threads`` on creation.
        channels_last: The module (on ``ppe.to``) and 4-D batch tensors (in
            ``convert_batch``) use ``torch.channels_last``.
        compile: ``True`` or ``torch.compile`` arguments; the module is compiled in place
            when moved, so its ``state_dict`` keys do not change.

    Module options act on the module ``ppe.to`` moves; batch options act where this runtime
    converts batches: ``create_trainer`` uses the runtime the model was moved with, so options
    given to ``ppe.to`` reach both.
    """

    #: The declarative spec the options are validated against (any other key is rejected).
    option_spec: ClassVar[RuntimeOptions] = CPU_OPTIONS
    device_type: ClassVar[str] = "cpu"
    #: ``autocast=True`` on the CPU: bfloat16, the type CPUs compute fast.
    default_autocast_dtype: ClassVar[torch.dtype] = torch.bfloat16

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        self.num_threads: int | None = self.resolved_options["num_threads"]
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
