"""Throughput: iterations and samples per second, and (when asked) FLOPs and MFU.

The per-step work is a counter: under a Trainer, :meth:`Throughput.wrap_train_step` adds the
batch's sample count to it (one Python call and one ``shape[0]`` per step); everything else
happens when the trigger fires (by default with LogReport, once per epoch). FLOPs are counted
once, on the first training step, with ``torch.utils.flop_counter.FlopCounterMode`` (imported
only then); no step synchronizes the host with the device.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.training.extension import PRIORITY_WRITER, Extension

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["Throughput", "batch_size_of"]

Step = Callable[[Any, int, Any], Any]


def batch_size_of(batch: Any) -> Callable[[Any], int] | None:
    """A function giving the sample count of batches shaped like ``batch``, or None.

    The count is the first dimension of the first tensor found (a dict's first value, a
    sequence's first item, depth first), looked up by the same path in every batch, so the
    per-step cost is one or two indexings and a ``shape[0]``.
    """
    path: list[Any] = []
    value = batch
    while not isinstance(value, torch.Tensor):
        if isinstance(value, Mapping) and value:
            key = next(iter(value))
        elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value:
            key = 0
        else:
            return None
        path.append(key)
        value = value[key]
    if value.dim() == 0:
        return None
    if not path:
        return lambda b: b.shape[0]
    if len(path) == 1:
        (key,) = path
        return lambda b: b[key].shape[0]

    def walk(b: Any) -> int:
        for key in path:
            b = b[key]
        return b.shape[0]  # type: ignore[no-any-return]

    return walk


def _eager_if_compiling() -> contextlib.AbstractContextManager[Any]:
    """``torch.compiler.set_stance("force_eager")`` when dynamo is loaded (and torch has
    stances), else a no-op context."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if "torch._dynamo" not in sys.modules or set_stance is None:
        return contextlib.nullcontext()
    return set_stance("force_eager")  # type: ignore[no-any-return]


class Throughput(Extension):
    """Reports training speed when its trigger fires (with LogReport's, once per epoch).

    Observations, each over the iterations since the previous report:

    * ``throughput/iters_per_sec``;
    * ``throughput/samples_per_sec``: samples counted from each batch under a Trainer (the
      first dimension of the batch's first tensor), or ``batch_size`` per iteration in a loop
      of your own;
    * with ``flops=True``: ``throughput/flops_per_sample`` (the first training step's FLOPs,
      forward, backward and optimizer, counted once by ``FlopCounterMode``, over its samples)
      and ``throughput/tflops_per_sec``. A model compiled with ``torch.compile`` runs that one
      step eagerly (torch cannot count inside compiled code) and compiles from the next step;
    * ``throughput/mfu``: achieved FLOP/s over the device's peak, when ``peak_flops`` is given
      or the model's runtime knows its device's peak (``runtime.peak_flops()``: the CUDA
      plugin matches the GPU's name; the CPU reports none rather than a guess).

    Give the extension the same trigger as LogReport so that each log entry holds one
    measurement. Rates are wall-clock over the interval: asynchronous devices are measured
    as the host sees them, with no synchronization per step.

    Args:
        trigger: When to report (default ``(1, 'epoch')``).
        flops: Count the FLOPs of the first training step (needs a Trainer).
        peak_flops: The device's peak FLOP/s for ``mfu``; None asks the runtime.
        batch_size: Samples per iteration, for loops without a Trainer.
        prefix: Prefix of the observation keys.

    Raises:
        ConfigurationError: A non-positive ``peak_flops`` or ``batch_size``.
    """

    priority = PRIORITY_WRITER  # before LogReport reads the same iteration's observation

    def __init__(
        self,
        trigger: TriggerLike = (1, "epoch"),
        *,
        flops: bool = False,
        peak_flops: float | None = None,
        batch_size: int | None = None,
        prefix: str = "throughput/",
    ) -> None:
        for name, value in (("peak_flops", peak_flops), ("batch_size", batch_size)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ConfigurationError(
                    f"Throughput {name} must be a positive number or None, got {value!r}"
                )
        self.trigger = trigger
        self._flops = bool(flops)
        self._given_peak = None if peak_flops is None else float(peak_flops)
        self._peak = self._given_peak
        self._batch_size = batch_size
        self._prefix = prefix
        #: Samples seen by the wrapped step (None: not counted, e.g. outside a Trainer).
        self.samples: int | None = None
        #: FLOPs per sample of the first step, once counted.
        self.flops_per_sample: float | None = None
        self._last: tuple[int, int, float] | None = None  # (iteration, samples, time)

    def wrap_train_step(self, step: Step) -> Step:
        """Called by the Trainer once per ``run()``: the step it then calls, counting samples
        (and the first step's FLOPs when asked)."""
        size: Callable[[Any], int] | None = None
        counted = 0
        flops_pending = self._flops and self.flops_per_sample is None

        def counting(trainer: Any, batch_idx: int, batch: Any) -> Any:
            nonlocal size, counted, flops_pending
            if size is None:
                size = batch_size_of(batch)
                if size is None:
                    raise ConfigurationError(
                        "Throughput cannot count the samples of a batch of type "
                        f"{type(batch).__name__} (no tensor in it); pass "
                        "Throughput(batch_size=<samples per iteration>) instead"
                    )
                self._baseline(trainer.manager.iteration)
            counted += size(batch)
            self.samples = counted
            if flops_pending:
                flops_pending = False
                return self._count_flops(step, trainer, batch_idx, batch, size(batch))
            return step(trainer, batch_idx, batch)

        if self._batch_size is not None and not flops_pending:
            return step  # samples per iteration given: nothing to count per step
        return counting

    def _count_flops(self, step: Step, trainer: Any, batch_idx: int, batch: Any, n: int) -> Any:
        """Runs the step under ``FlopCounterMode``, a compiled model's forward eagerly.

        torch.compile does not trace under a dispatch mode such as the counter: the frame it
        meets there is marked "skip" for good, so the model would never compile. The
        ``force_eager`` stance runs compiled code eagerly for this one step without asking
        dynamo at all, so the next step compiles as it would have (torch>=2.6; dynamo is only
        consulted when something imported it, i.e. when something may be compiled).
        """
        from torch.utils.flop_counter import FlopCounterMode

        with _eager_if_compiling(), FlopCounterMode(display=False) as counter:
            result = step(trainer, batch_idx, batch)
        self.flops_per_sample = counter.get_total_flops() / max(n, 1)
        return result

    def _baseline(self, iteration: int) -> None:
        """Starts the measurement at ``iteration`` (a resumed run's loaded one)."""
        self._last = (iteration, self.samples or 0, time.perf_counter())

    def initialize(self, manager: ManagerView) -> None:
        """Starts the clock, and asks the models' runtimes for a peak (once per run)."""
        self._baseline(manager.iteration)
        if self._flops and self._given_peak is None:
            from ppe_core.runtime import get_runtime

            self._peak = None
            for model in manager.raw_models.values():
                peak = getattr(get_runtime(model), "peak_flops", None)
                found = peak() if callable(peak) else None
                if found:
                    self._peak = float(found)
                    break

    def __call__(self, manager: ManagerView) -> None:
        now = time.perf_counter()
        iteration = manager.iteration
        if self._last is None:
            self._baseline(iteration)
            return
        last_iteration, last_samples, last_time = self._last
        span = now - last_time
        iterations = iteration - last_iteration
        self._last = (iteration, self.samples or 0, now)
        if span <= 0 or iterations <= 0:
            return
        prefix = self._prefix
        observation = manager.observation
        observation[prefix + "iters_per_sec"] = iterations / span
        if self.samples is not None and self._batch_size is None:
            samples = self.samples - last_samples
        elif self._batch_size is not None:
            samples = iterations * self._batch_size
        else:
            return
        samples_per_sec = samples / span
        observation[prefix + "samples_per_sec"] = samples_per_sec
        if self.flops_per_sample is None:
            return
        achieved = self.flops_per_sample * samples_per_sec
        observation[prefix + "flops_per_sample"] = self.flops_per_sample
        observation[prefix + "tflops_per_sec"] = achieved / 1e12
        if self._peak:
            observation[prefix + "mfu"] = achieved / self._peak
