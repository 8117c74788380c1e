"""``CUDARuntime``: the runtime for ``device="cuda"`` / ``"cuda:N"``, with CUDA options
(autocast with a grad scaler, non-blocking copies, cuDNN/TF32 switches, ``torch.compile``,
memory reporting)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ppe_core.errors import DeviceUnavailableError
from ppe_core.runtime import DeviceLike, DeviceRuntime, OptionSpec, RuntimeOptions, positive_int

__all__ = ["CUDA_OPTIONS", "CUDARuntime", "CUDAUnavailableError", "MemoryReporter"]


class CUDAUnavailableError(DeviceUnavailableError):
    """A CUDA device was requested where PyTorch cannot use one (a ``RuntimeError``)."""


#: ``report_memory=True`` reports every this many training steps (and each epoch's first).
DEFAULT_MEMORY_EVERY = 100

#: The options ``CUDARuntime`` accepts (also rendered in docs/runtimes.md).
CUDA_OPTIONS = RuntimeOptions(
    "CUDARuntime",
    *DeviceRuntime.shared_options("cuda", torch.float16, non_blocking=True),
    OptionSpec(
        "cudnn_benchmark",
        (bool,),
        None,
        "Set `torch.backends.cudnn.benchmark` when the runtime is created (default: leave it).",
    ),
    OptionSpec(
        "tf32",
        (bool,),
        None,
        "Allow TF32 in matmuls and cuDNN convolutions when the runtime is created "
        "(default: leave torch's settings).",
    ),
    OptionSpec(
        "report_memory",
        (bool, int),
        False,
        "Report `cuda/max_memory_allocated`, `cuda/memory_allocated` and "
        f"`cuda/max_memory_reserved` (bytes) every N training steps (`True`: "
        f"{DEFAULT_MEMORY_EVERY}) and at each epoch's first step; no device sync.",
        "10",
        positive_int,
        on_move=True,  # installed on the module's optimizer by the model's runtime
    ),
)


class CUDARuntime(DeviceRuntime):
    """Runs models on an NVIDIA GPU.

    Importing and registering this class never touches the CUDA driver; constructing it
    (``ppe.to(model, "cuda")``) validates the options, then checks that the device can be used
    and explains why not.

    Options (``ppe.to(model, "cuda", options=...)``; see :data:`CUDA_OPTIONS`): ``autocast``,
    ``grad_scaler``, ``channels_last``, ``non_blocking``, ``cudnn_benchmark``, ``tf32``,
    ``compile``, ``report_memory``. Module options act on the module ``ppe.to`` moves; batch
    options (``non_blocking``, ``channels_last``) act where this runtime converts batches:
    ``create_trainer`` uses the runtime the model was moved with. float16 autocast without a
    ``grad_scaler`` creates a ``torch.amp.GradScaler("cuda")`` (``runtime.grad_scaler``).
    """

    #: The declarative spec the options are validated against (any other key is rejected).
    option_spec: ClassVar[RuntimeOptions] = CUDA_OPTIONS
    device_type: ClassVar[str] = "cuda"
    #: ``autocast=True`` on a GPU: float16 (with a GradScaler); pass torch.bfloat16 for bf16.
    default_autocast_dtype: ClassVar[torch.dtype] = torch.float16

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)  # validates spec and options; touches no driver
        _require_cuda(device_spec)
        fp16 = self.autocast is not None and self.autocast["dtype"] == torch.float16
        if fp16 and self.grad_scaler is None:
            # fp16 gradients underflow without loss scaling; the Handler saves the scaler's
            # state in snapshots and offers it to the Logic, and code blocks use it.
            self.grad_scaler = torch.amp.GradScaler("cuda")
        resolved = self.resolved_options
        every = resolved["report_memory"]
        #: Report memory every this many training steps (``0``: off).
        self.memory_every: int = (
            DEFAULT_MEMORY_EVERY if every is True else 0 if every is False else int(every)
        )
        if resolved["cudnn_benchmark"] is not None:
            torch.backends.cudnn.benchmark = resolved["cudnn_benchmark"]
        if resolved["tf32"] is not None:
            torch.backends.cuda.matmul.allow_tf32 = resolved["tf32"]
            torch.backends.cudnn.allow_tf32 = resolved["tf32"]
        self._memory_hooks: list[Any] = []

    def initialize_module(
        self,
        module: torch.nn.Module,
        loader_or_batch: Any,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """Install the memory reporter (``report_memory``) on the optimizer's step, so the
        per-step path of runs without it has no extra call."""
        if not self.memory_every or (optimizer is None and self._memory_hooks):
            return  # an evaluator's setup keeps the trainer's reporter
        for handle in self._memory_hooks:
            handle.remove()
        self._memory_hooks.clear()
        length = _epoch_length(loader_or_batch)
        reporter = MemoryReporter(self.device, self.memory_every, length)
        self._memory_hooks.append(reporter.install(module, optimizer))

    def peak_flops(self) -> float | None:
        """The GPU's peak dense FLOP/s in the precision its matmuls run in: the autocast dtype,
        else TF32 when ``torch.backends.cuda.matmul.allow_tf32``, else FP32 (None for a GPU
        :data:`~ppe_cuda._peak.PEAK_TFLOPS` does not know). Asked once per run."""
        from ppe_cuda._peak import peak_flops_for

        if self.autocast is not None:
            precision = "bf16" if self.autocast["dtype"] == torch.bfloat16 else "fp16"
        else:
            precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
        return peak_flops_for(torch.cuda.get_device_name(self.device), precision)

    def rng_state(self) -> torch.Tensor:
        """This device's CUDA RNG state, saved in snapshots for bit-exact resume."""
        return torch.cuda.get_rng_state(self.device)

    def set_rng_state(self, state: Any) -> None:
        torch.cuda.set_rng_state(state, self.device)


def _epoch_length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


class MemoryReporter:
    """Reports the CUDA caching allocator's counters every ``every`` training steps.

    The values come from ``torch.cuda.memory_stats`` (host-side counters: no device
    synchronisation), reported with ``ppe_core.reporting.report`` inside the step's
    observation, at the first step of each epoch and every ``every`` steps.

    Args:
        device: The device whose counters are read.
        every: Steps between reports.
        epoch_length: Steps per epoch (to report at each epoch's first step), if known.
    """

    KEYS = (
        ("cuda/max_memory_allocated", "allocated_bytes.all.peak"),
        ("cuda/memory_allocated", "allocated_bytes.all.current"),
        ("cuda/max_memory_reserved", "reserved_bytes.all.peak"),
    )

    def __init__(self, device: torch.device, every: int, epoch_length: int | None = None) -> None:
        self.device = device
        self.every = every
        self.epoch_length = epoch_length
        self.steps = 0

    def __call__(self, *args: Any) -> None:
        """Count one training step; report when due (an optimizer step post-hook)."""
        step = self.steps
        self.steps = step + 1
        in_epoch = step % self.epoch_length if self.epoch_length else step
        if in_epoch == 0 or step % self.every == 0:
            self.report()

    def report(self) -> None:
        """Report the three counters now."""
        from ppe_core.reporting import report

        stats = torch.cuda.memory_stats(self.device)
        report({key: stats.get(stat, 0) for key, stat in self.KEYS})

    def install(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Any:
        """Hook onto ``optimizer``'s step (or, without one, the module's training forwards);
        returns the removable handle."""
        if optimizer is not None:
            return optimizer.register_step_post_hook(self)

        def on_forward(mod: torch.nn.Module, args: Any, output: Any) -> None:
            if mod.training and torch.is_grad_enabled():
                self()

        return module.register_forward_hook(on_forward)


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
