"""The extension-style evaluators (PPE's ``extensions.Evaluator`` and its variants).

They run inside an ``ExtensionsManager`` loop (``manager.extend(Evaluator(loader, model))``)
and report the means of what the evaluation reported, prefixed by the extension name. The
engine-style evaluator of ``create_evaluator`` lives in ``ppe_core.training._evaluator``.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

import torch

from ppe_core.distributed import gather_objects as _dist_gather
from ppe_core.distributed import get_rank, require_group
from ppe_core.errors import (
    ArgumentTypeError,
    DistributedNotInitializedError,
    IgnoredArgumentWarning,
    MissingEvalTargetError,
    OptionalDependencyError,
)
from ppe_core.handler import keep_modes
from ppe_core.logging import is_terminal
from ppe_core.reporting import DictSummary, Reporter, get_current_reporter, report
from ppe_core.training import named_models
from ppe_core.training.extension import PRIORITY_WRITER, Extension
from ppe_core.training.metrics import check_metric, check_metrics, takes_last_iteration

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = [
    "DistributedEvaluator",
    "DistributedNotInitializedError",
    "Evaluator",
    "IgniteEvaluator",
    "MissingEvalTargetError",
    "TextProgressBar",
]

#: ``metric(batch, outputs, last_iteration)``, PPE's signature; ``metric(batch, outputs)``
#: returning a dict is accepted too.
MetricFn = Callable[..., Any]

# Keyword arguments Evaluator understands (PPE reads exactly these from ``**kwargs``).
_KNOWN_OPTIONS = frozenset({"progress_bar", "metrics"})


class TextProgressBar:
    """A text progress bar drawn in place on a terminal, as plain lines anywhere else.

    The public base of PPE's ``extensions.util.ProgressBar``: subclasses implement
    :meth:`get_lines`; :meth:`update` draws them. On a terminal the bar is redrawn over its
    previous lines with ANSI cursor control; on files, pipes and captured output the lines are
    written one after another, without control sequences.

    Args:
        out: The stream to draw on; ``sys.stdout`` (at construction time) when None.
    """

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out: IO[str] = sys.stdout if out is None else out
        self._recent_timing: collections.deque[tuple[int, float, float]] = collections.deque(
            maxlen=100
        )
        self._redraw = is_terminal(self._out)

    def update_speed(self, iteration: int, epoch_detail: float) -> tuple[float, float]:
        """Records a point and returns (iterations/s, epochs/s) over the recent window."""
        now = time.perf_counter()
        self._recent_timing.append((iteration, epoch_detail, now))
        old_iteration, old_epoch, old_time = self._recent_timing[0]
        span = now - old_time
        if span <= 0:
            return float("inf"), float("inf")
        return (iteration - old_iteration) / span, (epoch_detail - old_epoch) / span

    def get_lines(self) -> list[str]:
        """The lines to draw, each ending with a newline; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lines()")

    def update(self, manager: ManagerView | None = None) -> None:
        """Draws the current lines (over the previous ones on a terminal)."""
        self.erase_console()
        lines = self.get_lines()
        for line in lines:
            self._out.write(line)
        self.move_cursor_up(len(lines))
        self.flush()

    def close(self) -> None:
        """Clears the bar from a terminal; elsewhere the last lines stay."""
        self.erase_console()
        self.flush()

    def erase_console(self) -> None:
        """Erases from the cursor to the end of the screen (terminals only)."""
        if self._redraw:
            self._out.write("\033[J")

    def move_cursor_up(self, n: int) -> None:
        """Moves the cursor up ``n`` lines, to the head of the bar (terminals only)."""
        if self._redraw and n > 0:
            self._out.write(f"\033[{n:d}A")

    def flush(self) -> None:
        """Flushes the stream when it can be flushed."""
        flush = getattr(self._out, "flush", None)
        if flush is not None:
            flush()


class _EvaluationBar(TextProgressBar):
    """PPE's evaluation bar: ``name [###...] 50.00%``, the count, the speed and the ETA."""

    def __init__(self, name: str, total: int | None, out: IO[str] | None = None) -> None:
        super().__init__(out)
        self._name = name
        self._total = total
        self._done = 0
        self._bar_length = 50
        # Off a terminal each draw is three more lines: draw about 100 times per pass at most.
        self._every = 1 if self._redraw or not total else max(1, total // 100)

    def advance(self, done: int) -> None:
        """Records that ``done`` batches are finished and draws when due."""
        self._done = done
        if done % self._every == 0 or done == self._total:
            self.update()

    def get_lines(self) -> list[str]:
        done, total, width = self._done, self._total, len(self._name)
        rate = min(done / total, 1.0) if total else 0.0
        marks = "#" * int(rate * self._bar_length)
        speed, epoch_speed = self.update_speed(done, rate)
        lines = [
            f"{self._name} [{marks}{'.' * (self._bar_length - len(marks))}] {rate:6.2%}\n",
            f"{done:{width}} iterations\n",
        ]
        if total:
            remaining = (1.0 - rate) / epoch_speed if epoch_speed > 0 else float("inf")
            eta = str(datetime.timedelta(seconds=remaining)) if remaining < 1e9 else "unknown"
            lines.append(f"{speed:{width}.5g} iters/sec. Estimated time to finish: {eta}.\n")
        else:
            lines.append(f"{speed:{width}.5g} iters/sec.\n")
        return lines


def _batches(iterator: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """Yields ``(batch, is_last)``, looking one batch ahead (so loaders without ``len`` work)."""
    sentinel = object()
    for current, following in itertools.pairwise(itertools.chain(iterator, (sentinel,))):
        yield current, following is sentinel


class Evaluator(Extension):
    """Evaluates models on a validation set and reports the means of what was reported.

    Each call runs ``eval_func`` (by default the target named ``'main'``) on every batch of
    the iterator named ``'main'``, in eval mode and under ``torch.no_grad``, with a fresh
    :class:`~ppe_core.reporting.Reporter` on which every target is an observer named
    ``<evaluator name>/<target name>``: a model calling ``report({'loss': l}, self)`` is
    reported as ``validation/main/loss``, a plain ``report({'val/loss': l})`` as
    ``val/loss``. The per-batch observations are averaged and the means are reported to the
    current reporter (the manager's observation) and returned. Batches are passed as PPE does:
    a tuple or list as ``eval_func(*batch)``, a dict as ``eval_func(**batch)``, a namedtuple
    or anything else as ``eval_func(batch)``. Training modes are restored afterwards.

    Args:
        iterator: The validation loader (any iterable, with or without ``len``), or a dict of
            loaders; a single one is registered as ``'main'``.
        target: A module or a dict of modules to evaluate; a single one is ``'main'``.
        eval_hook: Called with the evaluator before each evaluation (e.g. to reset state).
        eval_func: Called with each batch; the ``'main'`` target when None.
        **kwargs: ``progress_bar`` (bool, default False): draw PPE's text bar while
            evaluating; ``metrics`` (list): callables ``metric(batch, outputs,
            last_iteration)`` that report what they compute (a callable of ``(batch,
            outputs)`` returning a dict is accepted too; the dict is reported as it is).
            Anything else is ignored with an ``IgnoredArgumentWarning``.

    Attributes:
        eval_hook: The function called before each evaluation.
        name: The registered name (``'validation'`` by default); ``None`` outside a manager.
    """

    trigger = (1, "epoch")
    priority = PRIORITY_WRITER
    default_name = "validation"
    needs_model_state = True  # it runs the models

    def __init__(
        self,
        iterator: Iterable[Any] | Mapping[str, Iterable[Any]],
        target: torch.nn.Module | Mapping[str, torch.nn.Module],
        eval_hook: Callable[[Evaluator], object] | None = None,
        eval_func: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._check_arguments(iterator, eval_func, kwargs)
        self._iterators: dict[str, Iterable[Any]] = (
            dict(iterator) if isinstance(iterator, Mapping) else {"main": iterator}
        )
        # The shared validator; pass {} as target when eval_func does all the work.
        self._targets: dict[str, torch.nn.Module] = named_models(target, "target")
        self.name = None
        self.eval_hook = eval_hook
        self._eval_func = eval_func
        self._progress_bar = bool(kwargs.get("progress_bar", False))
        self._metrics: list[MetricFn] = check_metrics(
            kwargs.get("metrics"), "metric(batch, outputs, last_iteration)"
        )

    def _check_arguments(
        self, iterator: object, eval_func: object, kwargs: Mapping[str, Any]
    ) -> None:
        """Warns about keyword arguments it ignores, and refuses an iterator that is neither a
        loader nor a dict of loaders, and an eval_func that is not callable."""
        unknown = sorted(set(kwargs) - _KNOWN_OPTIONS)
        if unknown:
            warnings.warn(
                IgnoredArgumentWarning(
                    f"{type(self).__name__} ignores the keyword arguments {unknown} (it "
                    "understands progress_bar= and metrics=); move batches to the device in "
                    "eval_func if that was the intent"
                ),
                stacklevel=3,
            )
        if not isinstance(iterator, Iterable):  # a dict of loaders is one too
            raise ArgumentTypeError(
                f"{type(self).__name__} iterator must be a loader (an iterable of batches) or "
                f"a dict of loaders, got {type(iterator).__name__}"
            )
        if eval_func is not None and not callable(eval_func):
            raise ArgumentTypeError(
                f"eval_func must be callable with a batch, got {type(eval_func).__name__}"
            )

    def eval_func(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluates one batch: calls ``eval_func`` (or the ``'main'`` target) with it."""
        func = self._eval_func
        if func is None:
            func = self._targets.get("main")
            if func is None:
                raise self._missing_target_error()
        return func(*args, **kwargs)

    def _missing_target_error(self) -> MissingEvalTargetError:
        return MissingEvalTargetError(
            f"{type(self).__name__} has no eval_func and no target named 'main' (targets: "
            f"{sorted(self._targets) or 'none'}); pass eval_func=..., or the model to "
            "evaluate as target"
        )

    def get_iterator(self, name: str) -> Any:
        """Returns the iterator registered under ``name``."""
        return self._iterators[name]

    def get_all_iterators(self) -> dict[str, Any]:
        """Returns a copy of the dict of iterators."""
        return dict(self._iterators)

    def get_target(self, name: str) -> torch.nn.Module:
        """Returns the target registered under ``name``."""
        return self._targets[name]

    def get_all_targets(self) -> dict[str, torch.nn.Module]:
        """Returns a copy of the dict of targets."""
        return dict(self._targets)

    def add_metric(self, metric_fn: MetricFn) -> None:
        """Adds a metric ``metric_fn(batch, outputs, last_iteration)`` run after every batch."""
        self._metrics.append(check_metric(metric_fn))

    def __call__(self, manager: ManagerView | None = None) -> dict[str, Any]:
        """Evaluates and reports the means to the current reporter; also returns them.

        Usable without a manager: called outside any reporter it only returns the means.
        """
        reporter = Reporter()
        prefix = "" if self.name is None else self.name + "/"
        for name, target in self._targets.items():
            reporter.add_observer(prefix + name, target)
            reporter.add_observers(prefix + name, target.named_modules())
        with reporter, torch.no_grad():
            result = self.evaluate()
        report(result)
        return result

    def _call_eval_func(self, batch: Any) -> Any:
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple: one value
            return self.eval_func(batch)
        if isinstance(batch, (tuple, list)):
            return self.eval_func(*batch)
        if isinstance(batch, dict):
            return self.eval_func(**batch)
        return self.eval_func(batch)

    def _progress(self, iterator: Iterable[Any]) -> _EvaluationBar | None:
        """PPE's bar over ``iterator``, drawn at zero (None without ``progress_bar``)."""
        if not self._progress_bar:
            return None
        try:
            total: int | None = len(iterator)  # type: ignore[arg-type]
        except TypeError:
            total = None
        bar = _EvaluationBar(self.name or self.default_name, total)
        bar.advance(0)
        return bar

    def _gather_summaries(self, summary: DictSummary) -> DictSummary:
        """Combines the summaries of all processes; this process's alone here."""
        return summary

    def evaluate(self) -> dict[str, Any]:
        """Runs the evaluation loop and returns the mean of every reported value.

        Values are collected in the current reporter's scope (one observation per batch), so
        a reporter must be current for observers to resolve; ``__call__`` sets one up. Called
        with no reporter current, a bare one is used.

        Returns:
            ``{key: mean}`` as floats; empty when the loader yielded nothing.
        """
        iterator = self._iterators["main"]
        if self.eval_hook is not None:
            self.eval_hook(self)
        reporter = _current_or_new_reporter()
        metrics = [(m, takes_last_iteration(m)) for m in self._metrics]
        summary = DictSummary()
        bar = self._progress(iterator)
        restore_modes = keep_modes(self._targets.values(), False)
        try:
            for done, (batch, is_last) in enumerate(_batches(iterator), start=1):
                observation: dict[str, Any] = {}
                with reporter.scope(observation):
                    outputs = self._call_eval_func(batch)
                    for metric, takes_last in metrics:
                        args = (batch, outputs, is_last) if takes_last else (batch, outputs)
                        values = metric(*args)
                        if isinstance(values, Mapping):
                            report(values)
                summary.add(observation)
                if bar is not None:
                    bar.advance(done)
        finally:
            restore_modes()
            if bar is not None:
                bar.close()
        return self._gather_summaries(summary).compute_mean()


def _current_or_new_reporter() -> Reporter:
    try:
        return get_current_reporter()
    except IndexError:  # evaluate() called on its own: nothing to report to but the result
        return Reporter()


class DistributedEvaluator(Evaluator):
    """An :class:`Evaluator` whose result averages over all ``torch.distributed`` ranks.

    Each rank evaluates its own share of the validation set (give each a loader with a
    sampler that splits the data, e.g. ``ppe.distributed.DistributedValidationSampler``);
    the per-batch sums of every rank are gathered and combined, so every rank returns and
    reports the same means, weighted by each rank's number of batches. Every rank must run
    the evaluation (same trigger). The progress bar is shown on rank 0 only.

    Raises:
        DistributedNotInitializedError: ``torch.distributed`` is not initialised (a
            ``RuntimeError``, as in PPE).
    """

    def __init__(
        self,
        iterator: Iterable[Any] | Mapping[str, Iterable[Any]],
        target: torch.nn.Module | Mapping[str, torch.nn.Module],
        eval_hook: Callable[[Evaluator], object] | None = None,
        eval_func: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        require_group("DistributedEvaluator", "or use Evaluator")
        if "progress_bar" in kwargs:
            kwargs["progress_bar"] = bool(kwargs["progress_bar"]) and get_rank() == 0
        super().__init__(iterator, target, eval_hook, eval_func, **kwargs)

    def _gather_summaries(self, summary: DictSummary) -> DictSummary:
        # Plain-float sums travel (one device sync here), never tensors of some device.
        merged = DictSummary()
        for part in _dist_gather(summary.state_dict()):  # state dicts (or DictSummaries)
            if not isinstance(part, DictSummary):
                state, part = part, DictSummary()
                part.load_state_dict(state)
            merged += part
        return merged


class IgniteEvaluator(Evaluator):
    """Runs an Ignite evaluator ``Engine`` as an extension and reports its results.

    What the engine's process function reports (e.g. ``report({'x': x}, model)``) is averaged
    like :class:`Evaluator` does; each Ignite metric attached to the engine is reported as
    ``val/<metric name>``. Needs ``pytorch-ignite``.

    Args:
        evaluator: The ``ignite.engine.Engine`` to run over the iterator.
        iterator: The validation loader, or a dict of loaders (``'main'`` is run).
        target: A module or dict of modules (observers, as in :class:`Evaluator`).
        **kwargs: ``progress_bar`` and ``metrics`` as for :class:`Evaluator`.

    Raises:
        OptionalDependencyError: ``pytorch-ignite`` is not installed (an ``ImportError``).
    """

    def __init__(
        self,
        evaluator: Any,
        iterator: Iterable[Any] | Mapping[str, Iterable[Any]],
        target: torch.nn.Module | Mapping[str, torch.nn.Module],
        **kwargs: Any,
    ) -> None:
        super().__init__(iterator, target, None, **kwargs)
        self.evaluator = evaluator
        self.summary = DictSummary()
        self._bar: _EvaluationBar | None = None
        # While an iteration is open: the reporter's observation before it (see Reporter.push).
        self._previous: dict[str, Any] | None = None
        self._reporter = Reporter()
        self.set_evaluator_handlers()

    def set_evaluator_handlers(self) -> None:
        """Attaches the handlers that collect reports and metrics to the engine."""
        try:
            from ignite.engine import Events
        except ImportError as exc:
            raise _ignite_missing() from exc
        self.evaluator.add_event_handler(Events.ITERATION_STARTED, self._open_observation)
        self.evaluator.add_event_handler(Events.ITERATION_COMPLETED, self._close_observation)
        self.evaluator.add_event_handler(Events.EPOCH_COMPLETED, self._add_ignite_metrics)

    def _open_observation(self, engine: Any) -> None:
        self.observation: dict[str, Any] = {}
        self._previous = self._reporter.push(self.observation)

    def _close_observation(self, engine: Any) -> None:
        self._pop()
        self.summary.add(self.observation)
        if self._bar is not None:
            self._bar.advance(int(engine.state.iteration))

    def _pop(self) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            self._reporter.pop(previous)

    def _add_ignite_metrics(self, engine: Any) -> None:
        metrics = engine.state.metrics
        self.summary.add({f"val/{name}": value for name, value in metrics.items()})

    def evaluate(self) -> dict[str, Any]:
        """Runs the engine over the ``'main'`` iterator and returns the means."""
        iterator = self._iterators["main"]
        self.summary = DictSummary()
        self._reporter = _current_or_new_reporter()
        self._bar = self._progress(iterator)
        try:
            self.evaluator.run(iterator)
        finally:
            self._pop()  # the engine raised inside an iteration
            if self._bar is not None:
                self._bar.close()
                self._bar = None
        return self.summary.compute_mean()


def _ignite_missing() -> OptionalDependencyError:
    return OptionalDependencyError(
        "IgniteEvaluator needs pytorch-ignite, which is not installed; install it "
        "with `pip install pytorch-ignite`"
    )
