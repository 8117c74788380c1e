"""ppe-cuda: the CUDA runtime plugin for ppe-core."""

from __future__ import annotations

from ppe_cuda._runtime import CUDARuntime, CUDAUnavailableError

__all__ = ["CUDARuntime", "CUDAUnavailableError"]
