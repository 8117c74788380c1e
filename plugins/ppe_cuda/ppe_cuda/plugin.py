"""ppe-core plugin hooks of ppe-cuda; importing this never initialises CUDA."""

from __future__ import annotations

import torch

from ppe_core import hookimpl
from ppe_core.runtime import RuntimeRegistry

# The ppe-core hook API this plugin was written for (checked when the plugin registers).
PPE_CORE_HOOK_API = (1, 0)


@hookimpl
def ppe_register_runtimes(registry: RuntimeRegistry) -> None:
    """Register :class:`~ppe_cuda.CUDARuntime` for the ``cuda`` device type."""
    from ppe_cuda._runtime import CUDARuntime

    registry.register("cuda", CUDARuntime)


@hookimpl
def ppe_default_device() -> str | None:
    """``"cuda"`` when a GPU is usable, otherwise abstain so the next plugin answers."""
    return "cuda" if torch.cuda.is_available() else None


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "(not installed, imported from source)"


@hookimpl
def ppe_environment_info() -> list[str]:
    """The plugin's version, the CUDA/cuDNN build, and each visible device."""
    cudnn = torch.backends.cudnn.version() if torch.version.cuda else None  # type: ignore[no-untyped-call]
    lines = [
        f"cuda: ppe-cuda {_distribution_version('ppe-cuda')}, torch {torch.__version__} built "
        f"with CUDA {torch.version.cuda or '(none)'}, cuDNN {cudnn or '(none)'}",
    ]
    if not torch.cuda.is_available():
        lines.append("cuda: no usable device")
        return lines
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        lines.append(
            f"cuda:{i}: {props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability "
            f"{props.major}.{props.minor}, {props.multi_processor_count} SMs"
        )
    return lines
