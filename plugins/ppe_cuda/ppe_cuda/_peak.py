"""Peak dense FLOP/s of NVIDIA GPUs, matched by a model name inside the device's name.

``torch.cuda.get_device_name`` gives names such as ``"NVIDIA H100 80GB HBM3"``,
``"NVIDIA A100-SXM4-40GB"`` or ``"Tesla T4"``; a table keyed by exact names misses most of
them. Each key here is matched as a whole word inside the upper-cased name, longest key first
(``"H100 PCIE"`` before ``"H100"``, ``"L40S"`` never taken for ``"L4"``). Values are the
datasheets' dense (no sparsity) tensor-core TFLOPS per precision; a precision a GPU lacks
(bf16 before Ampere) is absent, so MFU is not reported rather than guessed.
"""

from __future__ import annotations

import re

__all__ = ["PEAK_TFLOPS", "peak_flops_for"]

#: Model -> precision ("bf16", "fp16", "tf32", "fp32") -> dense TFLOPS.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0},
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.7, "fp32": 66.9},
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H100 PCIE": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.7, "fp32": 66.9},
    "GH200": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    "L40": {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "V100-PCIE": {"fp16": 112.0, "fp32": 14.0},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "T4": {"fp16": 65.0, "fp32": 8.1},
}

_BY_LENGTH = sorted(PEAK_TFLOPS, key=len, reverse=True)


def peak_flops_for(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of the GPU named ``device_name`` in ``precision``, or None if unknown."""
    name = device_name.upper()
    for model in _BY_LENGTH:
        if re.search(rf"(?<![A-Z0-9]){re.escape(model)}(?![A-Z0-9])", name):
            tflops = PEAK_TFLOPS[model].get(precision)
            return None if tflops is None else tflops * 1e12
    return None
