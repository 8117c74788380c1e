"""ppe-core plugin hooks of ppe-cpu (cheap to import: the runtime loads when registered)."""

from __future__ import annotations

import os
import platform

import torch

from ppe_core import hookimpl
from ppe_core.runtime import RuntimeRegistry

# The ppe-core hook API this plugin was written for (checked when the plugin registers).
PPE_CORE_HOOK_API = (1, 0)


@hookimpl
def ppe_register_runtimes(registry: RuntimeRegistry) -> None:
    """Register :class:`~ppe_cpu.CPURuntime` for the ``cpu`` device type."""
    from ppe_cpu._runtime import CPURuntime

    registry.register("cpu", CPURuntime)


@hookimpl(trylast=True)
def ppe_default_device() -> str:
    """The CPU is always there: the last answer for ``device="auto"``."""
    return "cpu"


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "(not installed, imported from source)"


@hookimpl
def ppe_environment_info() -> list[str]:
    """The plugin's version and the CPU facts that explain training speed."""
    processor = platform.processor() or platform.machine() or "unknown processor"
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    return [
        f"cpu: ppe-cpu {_distribution_version('ppe-cpu')}, torch {torch.__version__}",
        f"cpu: {processor}, {os.cpu_count()} logical cores, SIMD {capability}",
        f"cpu: torch uses {torch.get_num_threads()} intra-op and "
        f"{torch.get_num_interop_threads()} inter-op threads",
    ]
