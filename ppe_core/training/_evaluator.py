"""The Evaluator: one pass over a loader in eval mode, reporting the mean of every output."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core._reporting import DictSummary, Reporter
from ppe_core.errors import ArgumentTypeError, ConfigurationError

if TYPE_CHECKING:
    from ppe_core.handler import BaseHandler

__all__ = ["Evaluator", "Metric"]

#: ``metric(batch, outputs) -> {name: value}``; values are reported as ``val/<name>``.
Metric = Callable[[Any, Any], Mapping[str, Any]]


def loader_length(loader: Iterable[Any], given: int | None, argument: str) -> int:
    """The number of batches to take from ``loader``, with a clear error when unknowable."""
    if given is not None:
        if not isinstance(given, int) or isinstance(given, bool) or given < 1:
            raise ConfigurationError(
                f"{argument} must be a positive int, got {given!r}; pass the number of batches "
                f"to take per pass, or leave it out for len(loader)"
            )
        return given
    try:
        length = len(loader)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigurationError(
            f"the loader ({type(loader).__name__}) has no len(), so the number of batches is "
            f"unknown; pass {argument}=<batches per epoch>."
        ) from None
    if length < 1:
        raise ConfigurationError(
            f"the loader ({type(loader).__name__}) is empty: len() is {length}. Check the "
            "dataset, and batch_size with drop_last=True (a dataset smaller than one batch "
            "yields nothing)."
        )
    return length


class Evaluator:
    """Runs the models over a loader under ``torch.no_grad`` and reports mean outputs.

    Usable standalone (``evaluator.run(loader)``) or from a Trainer on a trigger. Training
    modes are restored afterwards. Each run reports the means over the whole loader into the
    current reporter (the trainer's observation) and returns them.

    Args:
        handler: Drives runtimes and the logic's ``eval_step``.
        models: The models, by name.
        progress_bar: Show a tqdm bar with the real number of batches.
        metrics: Callables ``metric(batch, outputs) -> dict`` whose values are averaged too.
        profile: A ``torch.profiler.profile`` stepped after each batch.
        distributed: Average the means over all ``torch.distributed`` ranks.
    """

    def __init__(
        self,
        handler: BaseHandler,
        models: Mapping[str, torch.nn.Module],
        *,
        progress_bar: bool = False,
        metrics: list[Metric] | None = None,
        profile: Any = None,
        distributed: bool = False,
    ) -> None:
        self.handler = handler
        self.models = dict(models)
        self._progress_bar = progress_bar
        self._metrics = _check_metrics(metrics)
        self._profile = profile
        self._distributed = distributed
        self.summary = DictSummary()

    def run(self, loader: Iterable[Any], *, eval_len: int | None = None) -> dict[str, float]:
        """Evaluate over ``loader`` (``eval_len`` batches when it has no ``len``)."""
        from ppe_core._plugins import get_plugin_host

        length = loader_length(loader, eval_len, "eval_len")
        handler: Any = self.handler
        hook = get_plugin_host().pm.hook
        modes = {name: model.training for name, model in self.models.items()}
        handler.eval_setup(self, loader)
        hook.ppe_evaluator_setup(evaluator=self)
        error: BaseException | None = None
        bar = _make_bar(length) if self._progress_bar else None
        self.summary = summary = DictSummary()
        reporter = Reporter()
        batches = 0
        try:
            handler.eval_loop_begin(self)
            with torch.no_grad(), reporter:
                for batch_idx, batch in zip(range(length), loader, strict=False):
                    observation: dict[str, Any] = {}
                    with reporter.scope(observation):
                        outputs = handler.eval_step(self, batch_idx, batch)
                    for metric in self._metrics:
                        values = metric(batch, outputs)
                        if not isinstance(values, Mapping):
                            raise _metric_result_error(metric, values)
                        observation.update({f"val/{k}": v for k, v in values.items()})
                    summary.add(observation)
                    batches += 1
                    if bar is not None:
                        bar.update(1)
                    if self._profile is not None:
                        self._profile.step()
            handler.eval_loop_end(self)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if bar is not None:
                bar.close()
            for name, model in self.models.items():
                model.train(modes[name])
            hook.ppe_evaluator_teardown(evaluator=self, exception=error)
        means = summary.compute_mean()
        if self._distributed:
            means = _all_reduce_mean(means, batches, handler._entry_runtime.move_tensor)
        from ppe_core._reporting import report

        report(means)
        return means


def _check_metrics(metrics: Any) -> list[Metric]:
    if metrics is None:
        return []
    if (
        callable(metrics)
        or isinstance(metrics, (str, Mapping))
        or not isinstance(metrics, Iterable)
    ):
        raise ArgumentTypeError(
            f"metrics must be a list of callables metric(batch, outputs) -> dict, got "
            f"{type(metrics).__name__}; wrap a single metric in a list: metrics=[metric]"
        )
    checked: list[Metric] = list(metrics)
    for metric in checked:
        if not callable(metric):
            raise ArgumentTypeError(
                f"every metric must be a callable metric(batch, outputs) -> dict, got "
                f"{type(metric).__name__} {metric!r}"
            )
    return checked


def _metric_result_error(metric: Metric, values: object) -> ArgumentTypeError:
    name = getattr(metric, "__qualname__", None) or type(metric).__name__
    return ArgumentTypeError(
        f"metric {name} returned {type(values).__name__} {values!r}, but a metric must return a "
        "dict of names to values (reported as val/<name>); return e.g. {'accuracy': acc}"
    )


def _make_bar(total: int) -> Any:
    """A tqdm bar on a terminal or in Jupyter; one plain summary line anywhere else."""
    out = sys.stdout
    if _is_interactive(out):
        from tqdm.auto import tqdm  # imported when used: keeps ``import ppe_core`` cheap

        return tqdm(total=total, desc="validation", unit="batch", leave=False, file=out)
    return _PlainBar(total, out)


def _is_interactive(out: Any) -> bool:
    from ppe_core.training.extensions._util import in_notebook, is_terminal

    return is_terminal(out) or (in_notebook() and out is sys.stdout)


class _PlainBar:
    """For logs and pipes: no cursor control, a single line when the pass ends."""

    def __init__(self, total: int, out: Any) -> None:
        self._total = total
        self._done = 0
        self._out = out
        self._start = time.perf_counter()

    def update(self, n: int) -> None:
        self._done += n

    def close(self) -> None:
        seconds = time.perf_counter() - self._start
        rate = self._done / seconds if seconds > 0 else float("inf")
        print(
            f"validation: {self._done}/{self._total} batches in {seconds:.2f}s ({rate:.1f} it/s)",
            file=self._out,
            flush=True,
        )


def _all_reduce_mean(
    means: dict[str, float], batches: int, move: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, float]:
    """Average per-rank means over all ranks, weighted by each rank's number of batches.

    The values travel on the evaluator's device (``move``), as collective backends such as
    NCCL require; nothing here names a device.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigurationError(
            "create_evaluator(distributed=True) needs torch.distributed to be initialised "
            "(run under torchrun and call torch.distributed.init_process_group first)."
        )
    keys = sorted(means)
    values = move(torch.tensor([means[k] * batches for k in keys] + [batches], dtype=torch.float64))
    dist.all_reduce(values)
    *totals, count = values.tolist()
    return {k: total / count for k, total in zip(keys, totals, strict=True)}
