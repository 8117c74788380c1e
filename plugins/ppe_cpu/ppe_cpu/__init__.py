"""ppe-cpu: the CPU runtime plugin for ppe-core."""

from __future__ import annotations

from ppe_cpu._runtime import CPU_OPTIONS, CPURuntime

__all__ = ["CPU_OPTIONS", "CPURuntime"]
