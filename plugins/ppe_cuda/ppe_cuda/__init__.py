"""ppe-cuda: the CUDA runtime plugin for ppe-core."""

from __future__ import annotations

from ppe_cuda._prefetch import PrefetchLoader
from ppe_cuda._runtime import CUDA_OPTIONS, CUDARuntime, CUDAUnavailableError, MemoryReporter

__all__ = [
    "CUDA_OPTIONS",
    "CUDARuntime",
    "CUDAUnavailableError",
    "MemoryReporter",
    "PrefetchLoader",
]
