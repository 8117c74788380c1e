"""The Evaluator: one pass over a loader in eval mode, reporting the mean of every output."""

from __future__ import annotations

import contextlib
import itertools
import queue
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ppe_core._plugins import get_plugin_host
from ppe_core.distributed import is_distributed, run_collective, timeouts_explained
from ppe_core.errors import ArgumentTypeError, DistributedNotInitializedError, ManagerStateError
from ppe_core.handler._handler import step_function
from ppe_core.handler._logic import keep_modes
from ppe_core.reporting import DictSummary, Reporter, report
from ppe_core.training._epoch_length import optional_length
from ppe_core.training._eval_progress import make_bar
from ppe_core.training._manager import default_transform_model, named_models
from ppe_core.training._ranks import check_same_keys
from ppe_core.training._sample_means import add_per_sample
from ppe_core.training.metrics import MetricFn, check_metrics

if TYPE_CHECKING:
    from ppe_core.handler import BaseHandler

__all__ = ["DistributedEvaluator", "DistributedNotInitializedError", "Evaluator", "Metric"]

#: ``metric(batch, outputs) -> {name: value}``; values are reported as ``val/<name>``.
Metric = Callable[[Any, Any], Mapping[str, Any]]


@contextlib.contextmanager
def _progress_bar(name: str, required: bool, size: int | None) -> Iterator[Callable[[int], None]]:
    """PPE's evaluation progress bar: ``with _progress_bar(name, required, size) as update``,
    then ``update(batch_idx)`` after each batch; the bar closes when the block ends.

    Kept for PPE subclasses that drive their own evaluation loop (``name`` is PPE's label; the
    bar always reads "validation", as PPE's evaluator passes). Not required: a no-op updater.
    """
    if not required:
        yield lambda i: None
        return
    bar = make_bar(size)
    done = 0

    def update(batch_idx: int) -> None:
        nonlocal done
        bar.update(batch_idx + 1 - done)  # PPE's position is the index of the batch just done
        done = batch_idx + 1

    yield update
    bar.close()


def _observing_reporter(models: Mapping[str, torch.nn.Module]) -> Reporter:
    """A reporter naming each model (and its submodules) as the trainer's manager does.

    ``report(values, model)`` inside ``forward`` then works during evaluation too, with the
    same ``main/...`` keys as in training. A data-parallel wrapper's inner module gets the
    wrapper's name, as ``default_transform_model`` gives it in the trainer.
    """
    reporter = Reporter()
    for name, model in models.items():
        # named_modules() starts with the model itself (``""``), which gets ``name``.
        reporter.add_observers(name, model.named_modules())
        inner = default_transform_model(name, model)
        if inner is not model:
            reporter.add_observers(name, inner.named_modules())
    return reporter


class Evaluator:
    """Runs the models over a loader under ``torch.no_grad`` and reports mean outputs.

    Usable standalone (``evaluator.run(loader)``) or from a Trainer on a trigger. Training
    modes are restored afterwards. Each run reports the means over the whole loader into the
    current reporter (the trainer's observation) and returns them.

    Every handler runs one whole step per batch through
    :func:`ppe_core.handler.step_function`; with metrics they run on the outputs before the
    handler's ``eval_post_step`` reports them. Then the step's observation joins the summary.
    Models are registered as reporter
    observers, so ``ppe.reporting.report(values, model)`` in ``forward`` reports
    ``<name>/<key>`` (``main/...``) as in training.

    Args:
        handler: Drives runtimes and the logic's ``eval_step``.
        models: A module (named ``"main"``) or a dict of modules.
        progress_bar: Show a progress bar with the real number of batches.
        metrics: Callables ``metric(batch, outputs) -> dict``; their values join the outputs
            (a dict) and are reported like them as ``val/<name>``.
        profile: A ``torch.profiler.profile``, entered for each run and stepped after each
            batch.
    """

    #: Whether the means are all-reduced over ranks (:class:`DistributedEvaluator`), which
    #: needs ``torch.distributed`` initialised when the evaluator is created.
    _distributed = False

    def __init__(
        self,
        handler: BaseHandler,
        models: torch.nn.Module | Mapping[str, torch.nn.Module],
        *,
        progress_bar: bool = False,
        metrics: Sequence[Metric] | None = None,
        profile: Any = None,
    ) -> None:
        self.handler = handler
        self.models: dict[str, torch.nn.Module] = named_models(models)
        #: Whether a progress bar is shown during a run.
        self.progress_bar = progress_bar
        self._metrics = check_metrics(metrics)
        self._profile = profile
        self._reporter = _observing_reporter(self.models)
        #: The statistics of the latest run (after ``run``: gathered over ranks if distributed).
        self.summary = DictSummary()
        self._set_up = False
        self._batch_unit = 1  # the first batch's size: the unit of the summary's weights
        self._eval_len: int | None = None  # batches in the current run (PPE's attribute)
        if self._distributed and not is_distributed():
            raise DistributedNotInitializedError(
                "a distributed evaluator needs torch.distributed to be initialised: run under "
                "torchrun and call ppe.distributed.init_from_env() (or "
                "torch.distributed.init_process_group()) before "
                "create_evaluator(..., distributed=True)"
            )

    def setup(self, loader: Iterable[Any]) -> None:
        """Calls the handler's ``eval_setup`` once; a Trainer calls it before training."""
        if not self._set_up:
            self.handler.eval_setup(self, loader)
            self._set_up = True

    # PPE's names for the attributes above, for subclasses written against PPE 0.9.
    @property
    def _progress_bar(self) -> bool:
        return self.progress_bar

    @_progress_bar.setter
    def _progress_bar(self, value: bool) -> None:
        self.progress_bar = value

    @property
    def _summary(self) -> DictSummary:
        return self.summary

    @_summary.setter
    def _summary(self, value: DictSummary) -> None:
        self.summary = value

    def _process_metrics(self, ins: Any, outs: Any) -> Any:
        """Adds each metric's values to ``outs`` (a dict; other outputs get them reported as
        ``val/<name>``) and returns ``outs``; called in every step before ``eval_post_step``.

        PPE's hook: a subclass may override it (it is then called every step, metrics or
        not) to add or change outputs before they are reported.
        """
        for metric in self._metrics:
            values = metric(ins, outs)
            if not isinstance(values, Mapping):
                raise metric_result_error(metric, values)
            if isinstance(outs, dict):
                outs.update(values)  # reported by eval_post_step with the outputs
            else:
                report({f"val/{k}": v for k, v in values.items()})
        return outs

    def _finish_step(self, evaluator: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        """The post-step with metrics (or a ``_process_metrics`` override): the metrics, then
        ``eval_post_step``."""
        reporter = self._reporter
        # The run made the reporter current; the scope keeps a handler that completes a step
        # in another thread reporting into the batch's observation.
        with reporter.scope(reporter.observation):
            outputs = self._process_metrics(batch, outputs)
            self.handler.eval_post_step(evaluator, batch_idx, batch, outputs)

    def _complete_step(self, idx: int, outs: Any, *, is_deferred: bool = False) -> None:
        """PPE's step completion, used only when a subclass overrides it (see :meth:`run`).

        Takes the step's batch and observation from the queues ``run`` fills (``_idxs``,
        ``_inputs``, ``_observed``), runs :meth:`_process_metrics` and the handler's
        ``eval_post_step`` in that observation, adds it to the summary (per sample, as
        ``run``) and updates the progress bar (``_update``; ``_pbar`` closes at the last batch).
        """
        expected = self._idxs.get()
        if expected != idx:
            raise ManagerStateError(
                f"evaluation step {idx} completed while step {expected} was expected: a "
                "handler must complete its steps in order"
            )
        batch, observation = self._inputs.get(), self._observed.get()
        with self._reporter.scope(observation):
            outs = self._process_metrics(batch, outs)
            self.handler.eval_post_step(self, idx, batch, outs)
        self._batch_unit = add_per_sample(self.summary, idx, batch, observation, self._batch_unit)
        self._update(idx)
        if idx + 1 == self._eval_len:
            self._pbar.__exit__(None, None, None)

    def _run_ppe_steps(self, loader: Iterable[Any], length: int | None) -> None:
        """The steps of a run for a subclass overriding :meth:`_complete_step`: PPE's protocol.

        As PPE: each batch's index, batch and observation are queued, and the handler's
        ``eval_step`` gets ``self._complete_step`` as ``complete_fn``; ``_pbar`` (PPE's
        ``_progress_bar`` context) and its updater ``_update`` are set for the override.
        """
        self._idxs: queue.Queue[int] = queue.Queue()
        self._inputs: queue.Queue[Any] = queue.Queue()
        self._observed: queue.Queue[dict[str, Any]] = queue.Queue()
        self._pbar = _progress_bar("validation", self.progress_bar, length)
        self._update = self._pbar.__enter__()
        handler: Any = self.handler
        reporter, complete, profile = self._reporter, self._complete_step, self._profile
        indices = range(length) if length is not None else itertools.count()
        for batch_idx, batch in zip(indices, loader, strict=False):
            observation: dict[str, Any] = {}
            reporter.observation = observation
            self._idxs.put(batch_idx)
            self._inputs.put(batch)
            self._observed.put(observation)
            handler.eval_step(self, batch_idx, batch, complete)
            if profile is not None:
                profile.step()
        self._pbar.__exit__(None, None, None)  # a no-op if the last step closed it

    def _gather_summaries(self) -> None:
        """Combine ``self.summary`` over processes; a single process keeps its own."""

    def run(self, loader: Iterable[Any], *, eval_len: int | None = None) -> dict[str, Any]:
        """Evaluate over ``loader``: ``eval_len`` batches, else all (``len()`` or until it runs
        out, for a loader without ``len()``).

        Returns:
            The mean of every reported value (PPE returns None; the same means are reported
            into the current reporter either way).
        """
        length = self._eval_len = optional_length(loader, eval_len, "eval_len")
        handler: Any = self.handler
        host = get_plugin_host()
        restore_modes = keep_modes(self.models.values())
        self.setup(loader)
        host.evaluator_setup(self)
        error: BaseException | None = None
        # A subclass overriding PPE's _complete_step gets PPE's step protocol (_run_ppe_steps);
        # one overriding _process_metrics gets it called every step. Chosen once per run.
        ppe_steps = type(self)._complete_step is not Evaluator._complete_step
        processes = self._metrics or type(self)._process_metrics is not Evaluator._process_metrics
        bar = make_bar(length) if self.progress_bar and not ppe_steps else None
        summary = self.summary = DictSummary()
        reporter = self._reporter
        # One whole step per batch, whatever the handler (chosen once); metrics run before the
        # handler's post-step reports the outputs.
        step = step_function(handler, "eval", self._finish_step if processes else None)
        profile, unit = self._profile, self._batch_unit
        previous = reporter.observation
        try:
            handler.eval_loop_begin(self)
            # The reporter is current for the whole run; each batch only swaps its observation.
            profiling = profile if profile is not None else contextlib.nullcontext()
            with reporter, torch.no_grad(), profiling:
                if ppe_steps:
                    self._run_ppe_steps(loader, length)
                    unit = self._batch_unit
                else:
                    indices = range(length) if length is not None else itertools.count()
                    for batch_idx, batch in zip(indices, loader, strict=False):
                        observation: dict[str, Any] = {}
                        reporter.observation = observation
                        step(self, batch_idx, batch)
                        unit = add_per_sample(summary, batch_idx, batch, observation, unit)
                        if bar is not None:
                            bar.update(1)
                        if profile is not None:
                            profile.step()
            self._batch_unit = unit
            handler.eval_loop_end(self)
        except BaseException as exc:
            error = exc
            raise
        finally:
            reporter.observation = previous
            if bar is not None:
                bar.close()
            restore_modes()
            host.evaluator_teardown(self, error)
        self._gather_summaries()
        means = self.summary.compute_mean()
        report(means)
        return means


class DistributedEvaluator(Evaluator):
    """An :class:`Evaluator` whose means cover the batches of every ``torch.distributed`` rank.

    Each rank evaluates its own shard (e.g. through a ``DistributedValidationSampler``, which
    neither pads nor repeats samples); the per-key sums, weighted by each batch's number of
    samples, are then all-reduced, so every rank reports the same mean over every sample of
    every rank: a single process's mean over the whole set. The reduction travels on the
    evaluator's device (the handler's entry runtime moves it), as collective backends such as
    NCCL require.

    Raises:
        DistributedNotInitializedError: ``torch.distributed`` is not initialised yet (also a
            ``RuntimeError``, as in PPE).
    """

    _distributed = True

    def _gather_summaries(self) -> None:
        """Sums each key's statistics over all ranks into a new summary.

        Each rank's weights count in units of its first batch's size (see
        :func:`~ppe_core.training._sample_means.add_per_sample`); they are scaled to samples
        before summing, so the result is the mean over every sample of every rank, whatever
        the ranks' batch sizes. The ranks must have reported the same keys; a first small
        reduction checks that (:func:`~ppe_core.training._ranks.check_same_keys`), so a
        mismatch raises on every rank instead of hanging in the collective.
        """
        import torch.distributed as dist

        runtime = getattr(self.handler, "entry_runtime", None)  # a BaseHandler may have none
        move = runtime.move_tensor if runtime is not None else (lambda t: t)
        state = self.summary.state_dict()
        keys = sorted(state)
        unit = self._batch_unit
        with timeouts_explained("all-reducing the evaluation's means"):
            check_same_keys(keys, move)
            flat = [unit * state[k][field] for k in keys for field in ("_x", "_x2", "_n")]
            values = move(torch.tensor(flat, dtype=torch.float64))
            run_collective(dist.all_reduce, values)
        totals = values.tolist()
        self.summary = DictSummary()
        self.summary.load_state_dict(
            {
                k: {"_x": totals[3 * i], "_x2": totals[3 * i + 1], "_n": totals[3 * i + 2]}
                for i, k in enumerate(keys)
            }
        )


def metric_result_error(metric: MetricFn, values: object) -> ArgumentTypeError:
    """The error for an engine Evaluator's metric that returned ``values``, not a dict."""
    name = getattr(metric, "__qualname__", None) or type(metric).__name__
    return ArgumentTypeError(
        f"metric {name} returned {type(values).__name__} {values!r}, but a metric must return a "
        "dict of names to values (reported as val/<name>); return e.g. {'accuracy': acc}"
    )


# For PPE code that imports the old private name.
_Evaluator = Evaluator
