"""``CPURuntime``: the runtime for ``device="cpu"``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ppe_core.errors import ConfigurationError
from ppe_core.runtime import DeviceLike, PyTorchRuntime, device_type_of

__all__ = ["CPURuntime"]


class CPURuntime(PyTorchRuntime):
    """Runs models on the host CPU.

    A thin specialisation of the generic runtime today; CPU-specific features (bf16 autocast,
    thread settings) attach here, never in the core.
    """

    #: PyTorchRuntime's options (``autocast``, ``grad_scaler``); any other key is rejected.
    accepted_options: ClassVar[frozenset[str] | None] = PyTorchRuntime.accepted_options

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        if device_type_of(device_spec) != "cpu":
            raise ConfigurationError(
                f"CPURuntime serves 'cpu' devices, got {device_spec!r}; pass device='cpu', or "
                "leave runtime_class unset so the device's own runtime is looked up"
            )
        super().__init__(device_spec, options)
