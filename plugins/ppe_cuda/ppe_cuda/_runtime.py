"""``CUDARuntime``: the runtime for ``device="cuda"`` / ``"cuda:N"``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ppe_core.errors import ConfigurationError, PPEError
from ppe_core.runtime import DeviceLike, PyTorchRuntime, device_type_of

__all__ = ["CUDARuntime", "CUDAUnavailableError"]


class CUDAUnavailableError(PPEError, RuntimeError):
    """A CUDA device was requested where PyTorch cannot use one."""


class CUDARuntime(PyTorchRuntime):
    """Runs models on an NVIDIA GPU.

    Importing and registering this class never touches the CUDA driver; constructing it
    (``ppe.to(model, "cuda")``) checks that the device can be used and explains why not.
    """

    #: PyTorchRuntime's options (``autocast``, ``grad_scaler``); any other key is rejected.
    accepted_options: ClassVar[frozenset[str] | None] = PyTorchRuntime.accepted_options

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        if device_type_of(device_spec) != "cuda":
            raise ConfigurationError(
                f"CUDARuntime serves 'cuda' devices, got {device_spec!r}; pass device='cuda' or "
                "'cuda:N', or leave runtime_class unset so the device's own runtime is looked up"
            )
        super().__init__(device_spec, options)  # validates the spec; touches no driver
        _require_cuda(device_spec)

    def rng_state(self) -> torch.Tensor:
        """This device's CUDA RNG state, saved in snapshots for bit-exact resume."""
        return torch.cuda.get_rng_state(self.device)

    def set_rng_state(self, state: Any) -> None:
        torch.cuda.set_rng_state(state, self.device)


def _require_cuda(device_spec: DeviceLike) -> None:
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"this PyTorch build ({torch.__version__}) has no CUDA support"
            fix = "install a CUDA build of PyTorch"
        else:
            why = "no CUDA device or driver is visible (check nvidia-smi, CUDA_VISIBLE_DEVICES)"
            fix = "run on a machine with a GPU"
        raise CUDAUnavailableError(
            f"device {str(device_spec)!r} was requested but {why}. "
            f"To train here use device='cpu' (or 'auto'); to use the GPU, {fix}."
        )
    index = torch.device(device_spec).index
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise CUDAUnavailableError(
            f"device {str(device_spec)!r} does not exist: {count} CUDA device(s) are visible "
            f"(indices 0..{count - 1}). Pass one of those, e.g. 'cuda:0', or check "
            "CUDA_VISIBLE_DEVICES."
        )
