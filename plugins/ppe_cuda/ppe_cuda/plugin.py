"""ppe-core plugin hooks of ppe-cuda; importing this never initialises CUDA."""

from __future__ import annotations

import torch

from ppe_core import hookimpl
from ppe_core.runtime import RuntimeRegistry


@hookimpl
def ppe_register_runtimes(registry: RuntimeRegistry) -> None:
    """Register :class:`~ppe_cuda.CUDARuntime` for the ``cuda`` device type."""
    from ppe_cuda._runtime import CUDARuntime

    registry.register("cuda", CUDARuntime)


@hookimpl
def ppe_default_device() -> str | None:
    """``"cuda"`` when a GPU is usable, otherwise abstain so the next plugin answers."""
    return "cuda" if torch.cuda.is_available() else None


@hookimpl
def ppe_environment_info() -> list[str]:
    """CUDA build, driver visibility and devices."""
    lines = [f"cuda: torch built with CUDA {torch.version.cuda or '(none)'}"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            lines.append(f"cuda:{i}: {torch.cuda.get_device_name(i)}")
    else:
        lines.append("cuda: no usable device")
    return lines
