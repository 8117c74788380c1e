"""``ProgressBar``: a tqdm progress bar (plain lines when not on a terminal) for training."""

from __future__ import annotations

import collections
import importlib
import math
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from ppe_core.distributed import group_world
from ppe_core.errors import ConfigurationError
from ppe_core.logging import in_notebook, is_terminal
from ppe_core.training.extension import PRIORITY_READER, Extension
from ppe_core.training.triggers import Trigger
from ppe_extensions._progress_plain import (
    DEFAULT_MIN_INTERVAL as DEFAULT_MIN_INTERVAL,
)
from ppe_extensions._progress_plain import (
    NoDisplay,
    PlainDisplay,
    plain_min_interval,
)

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = ["ProgressBar"]

# Updates per run the bar aims for at least: short runs update more often than
# `update_interval` so that they show progress at all.
_MIN_UPDATES = 100


class _EveryN(Trigger):
    """Fires at multiples of ``interval`` iterations; the interval is settled at initialize."""

    def __init__(self, interval: int) -> None:
        self.interval = interval

    def __call__(self, manager: ManagerView) -> bool:
        return manager.iteration % self.interval == 0

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        return (max(iteration, 0) // self.interval + 1) * self.interval

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        return iteration > 0 and iteration % self.interval == 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.interval})"


class _Progress:
    """What every display needs: totals and a recent-window speed estimate."""

    def __init__(
        self,
        total: int | None,
        iters_per_epoch: int | None,
        start: int,
        length: tuple[float, str] | None = None,
    ) -> None:
        self.total = total
        #: None while the first epoch over a loader without ``len()`` runs.
        self.iters_per_epoch = iters_per_epoch
        # The training length as given, for PPE's "N iter, E epoch / L epochs" status.
        self.length = length
        # (iteration, time) of recent updates; the speed is measured over this window.
        self.recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=100)
        self.recent.append((start, time.perf_counter()))

    def speed(self, iteration: int) -> float:
        """Iterations per second over the recent window (NaN before two points exist)."""
        now = time.perf_counter()
        self.recent.append((iteration, now))
        old_iteration, old_time = self.recent[0]
        span = now - old_time
        if iteration == old_iteration:
            return math.nan
        return (iteration - old_iteration) / span if span > 0 else math.inf

    def rebase(self, iteration: int) -> None:
        """Measures the speed from ``iteration`` now: a resumed run's first update (a snapshot
        loaded after the bar started moved the count, and those iterations took no time)."""
        self.recent.clear()
        self.recent.append((iteration, time.perf_counter()))


class _TqdmDisplay:
    """A tqdm bar: the console bar on terminals, the widget in Jupyter."""

    def __init__(
        self, tqdm_class: Any, out: IO[str], progress: _Progress, start: int, bar_length: int
    ) -> None:
        total = progress.total
        bar_format = None
        if total:
            bar_format = (
                f"{{desc}} {{percentage:3.0f}}%|{{bar:{bar_length}}}| {{n_fmt}}/{{total_fmt}} "
                "iters [{elapsed}<{remaining}, {rate_fmt}]"
            )
        per_epoch = progress.iters_per_epoch
        self._epochs = f"/{total / per_epoch:g}" if total and per_epoch else ""
        self._bar = tqdm_class(
            desc=f"epoch {start / per_epoch:.2f}{self._epochs}" if per_epoch else "epoch 0",
            total=total,
            initial=start,
            file=out,
            unit="it",
            bar_format=bar_format,
            dynamic_ncols=False,
            leave=True,
        )

    def update(self, iteration: int, epoch_detail: float, final: bool = False) -> None:
        bar = self._bar
        bar.set_description_str(f"epoch {epoch_detail:.2f}{self._epochs}", refresh=False)
        delta = iteration - bar.n
        if delta > 0:
            bar.update(delta)
        else:
            bar.refresh()

    def rebase(self, iteration: int) -> None:
        """Counts from ``iteration``: ``reset`` restarts tqdm's clock and rate averages, and
        ``initial`` makes its rate ``(n - initial) / elapsed`` count the resumed iterations."""
        bar = self._bar
        bar.reset(total=bar.total)
        bar.n = bar.last_print_n = bar.initial = iteration

    def close(self) -> None:
        self._bar.close()


class ProgressBar(Extension):
    """Shows training progress: iterations, epoch, percentage, iterations/sec and ETA.

    On a terminal it draws a tqdm bar; in a Jupyter kernel (with ``out`` left as stdout) it
    uses tqdm's notebook widget; on anything else (a file, a pipe, a CI log) it prints one
    plain line per update, without carriage returns or cursor control.

    It runs only every ``update_interval`` iterations (through its trigger, so other steps
    cost nothing), but at least about 100 times per run:
    the effective interval is ``max(1, min(update_interval, total_iterations // 100))``, so
    a 10-iteration run updates every iteration. The final state is drawn when training ends.

    Args:
        training_length: ``(length, 'epoch' | 'iteration')``; read from the manager's stop
            trigger (``(max_epochs, 'epoch')`` by default) when None. When unknown, the bar
            shows counts and speed without a total.
        update_interval: Iterations between updates (an upper bound, see above).
        bar_length: Width of the bar in characters.
        out: Text stream to draw on; ``sys.stdout`` (at construction time) when None.
        min_interval: Off a terminal, the fewest seconds between two plain lines (tqdm's
            ``mininterval`` for logs): a line every few seconds plus the final one, however
            fast training is; ``0`` prints at every update. ``None`` (default):
            :data:`DEFAULT_MIN_INTERVAL` when writing to the process's own stdout/stderr
            redirected to a file or pipe (CI logs), ``0`` for a stream you pass (every update,
            as in PPE).

    Under ``torch.distributed`` only rank 0 draws; the other ranks show nothing.

    Raises:
        ConfigurationError: ``update_interval`` or ``bar_length`` is not a positive integer,
            or ``min_interval`` is negative.
    """

    priority = PRIORITY_READER

    def __init__(
        self,
        training_length: tuple[float, str] | None = None,
        update_interval: int = 100,
        bar_length: int = 50,
        out: IO[str] | None = None,
        *,
        min_interval: float | None = None,
    ) -> None:
        _check_positive(update_interval=update_interval, bar_length=bar_length)
        self._min_interval = plain_min_interval(min_interval, out)
        if training_length is not None:
            _check_length(training_length)
        self._training_length = training_length
        self._update_interval = update_interval
        self._bar_length = bar_length
        self._out: IO[str] = sys.stdout if out is None else out
        self.trigger = self._schedule = _EveryN(update_interval)
        self._display: PlainDisplay | _TqdmDisplay | NoDisplay | None = None
        #: Whether the display was made before the epoch length was known (no total).
        self._length_unknown = False
        #: The iteration at initialize until the first update (then None).
        self._initial: int | None = None

    def initialize(self, manager: ManagerView) -> None:
        """Works out the total and the update interval, and shows the bar at its start."""
        length = self._training_length
        if length is None:
            # Not part of ManagerView (PPE's managers lack it): an ExtensionsManager has it.
            announced = getattr(manager, "training_length", None)
            length = None if announced is None else _check_length(announced)
        known = _length_known(manager)
        total: int | None = None  # counts without a total until the loader runs out
        if length is not None and length[1] == "iteration":
            total = int(length[0])
        elif length is not None and known:
            total = math.ceil(length[0] * manager.iters_per_epoch)
        if total:
            self._schedule.interval = max(1, min(self._update_interval, total // _MIN_UPDATES))
        start = self._initial = manager.iteration
        self._length_unknown = not known
        progress = _Progress(total, manager.iters_per_epoch if known else None, start, length)
        out = self._out
        if group_world()[1] != 0:
            self._display = NoDisplay()
        elif (notebook := out is sys.stdout and in_notebook()) or is_terminal(out):
            tqdm: Any = importlib.import_module("tqdm.auto" if notebook else "tqdm")
            self._display = _TqdmDisplay(tqdm.tqdm, out, progress, start, self._bar_length)
        else:
            # The clock ProgressBar's speed estimate reads too.
            self._display = PlainDisplay(out, progress, self._min_interval, time.perf_counter)

    def __call__(self, manager: ManagerView) -> None:
        """Redraws the bar (or prints a line) for the current iteration."""
        if self._length_unknown and _length_known(manager):
            self._restart()
        if self._display is None:
            self.initialize(manager)
        assert self._display is not None
        iteration = manager.iteration
        self._rebase_after_resume(self._display, iteration)
        self._display.update(iteration, manager.epoch_detail)

    def _rebase_after_resume(
        self, display: PlainDisplay | _TqdmDisplay | NoDisplay, iteration: int
    ) -> None:
        """At the first update since initialize (or at the end, when none came): more than one
        interval since initialize means an autoloading snapshot (initialized after the bar)
        resumed the run there, and the loaded iterations took no time here; the rate counts
        this process's iterations only (none, for a resumed run with nothing left to train)."""
        if self._initial is not None:
            if iteration - self._initial > self._schedule.interval:
                display.rebase(iteration)
            self._initial = None

    def _restart(self) -> None:
        """The first epoch over a loader without ``len()`` ran out: the bar is closed, to be
        made again with its total."""
        if self._display is not None:
            self._display.close()
        self._display = None

    def finalize(self, manager: ManagerView) -> None:
        """Draws the final state and closes the bar."""
        display = self._display
        if display is None:
            return
        self._display = None
        try:
            self._rebase_after_resume(display, manager.iteration)
            display.update(manager.iteration, manager.epoch_detail, final=True)
        finally:
            display.close()


def _length_known(manager: ManagerView) -> bool:
    # Not part of ManagerView (PPE's managers always know it): an ExtensionsManager has it.
    return getattr(manager, "epoch_length_known", True) is not False


def _check_positive(**values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(
                f"ProgressBar {name} must be a positive integer, got {value!r}"
            )


def _check_length(length: Any) -> tuple[float, str]:
    if (
        not isinstance(length, (tuple, list))
        or len(length) != 2
        or length[1] not in ("epoch", "iteration")
        or isinstance(length[0], bool)
        or not isinstance(length[0], (int, float))
        or length[0] <= 0
    ):
        raise ConfigurationError(
            "ProgressBar training_length must be (length, 'epoch' | 'iteration') with a "
            f"positive length, e.g. (10, 'epoch'); got {length!r}"
        )
    return float(length[0]), str(length[1])
