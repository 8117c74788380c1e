"""ppe-core plugin hooks of ppe-cpu (cheap to import: the runtime loads when registered)."""

from __future__ import annotations

import os

import torch

from ppe_core import hookimpl
from ppe_core.runtime import RuntimeRegistry


@hookimpl
def ppe_register_runtimes(registry: RuntimeRegistry) -> None:
    """Register :class:`~ppe_cpu.CPURuntime` for the ``cpu`` device type."""
    from ppe_cpu._runtime import CPURuntime

    registry.register("cpu", CPURuntime)


@hookimpl(trylast=True)
def ppe_default_device() -> str:
    """The CPU is always there: the last answer for ``device="auto"``."""
    return "cpu"


@hookimpl
def ppe_environment_info() -> list[str]:
    """CPU threading facts that explain training speed."""
    return [
        f"cpu: {os.cpu_count()} logical cores, torch uses {torch.get_num_threads()} threads",
    ]
