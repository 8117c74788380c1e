"""ProgressBar's displays beyond PPE's terminal bar: plain lines for logs, nothing off rank 0.

PPE's ProgressBar writes terminal control codes wherever it writes. Off a terminal (a file, a
pipe, a CI log) ppe-core prints one self-contained line per update instead, at most one every
``min_interval`` seconds, and under torch.distributed only rank 0 shows anything.
"""

from __future__ import annotations

import datetime
import math
import sys
import time
from collections.abc import Callable
from typing import IO, Protocol

from ppe_core.errors import ConfigurationError

__all__ = [
    "DEFAULT_MIN_INTERVAL",
    "NoDisplay",
    "PlainDisplay",
    "ProgressLike",
    "plain_min_interval",
]

#: ProgressBar's default ``min_interval``: seconds between plain (non-terminal) lines.
DEFAULT_MIN_INTERVAL = 5.0


def plain_min_interval(min_interval: float | None, out: IO[str] | None) -> float:
    """ProgressBar's ``min_interval`` (see there) resolved and checked."""
    if min_interval is None:
        own = out is None or out is sys.stdout or out is sys.stderr
        min_interval = DEFAULT_MIN_INTERVAL if own else 0.0
    if (
        isinstance(min_interval, bool)
        or not isinstance(min_interval, (int, float))
        or not min_interval >= 0
    ):
        raise ConfigurationError(
            f"ProgressBar min_interval must be a number of seconds >= 0, got "
            f"{min_interval!r}; e.g. min_interval=5.0, or 0 for a line at every update"
        )
    return float(min_interval)


class ProgressLike(Protocol):
    """What a display reads of ProgressBar's progress (totals and the speed estimate)."""

    total: int | None
    iters_per_epoch: int | None
    length: tuple[float, str] | None

    def speed(self, iteration: int) -> float: ...

    def rebase(self, iteration: int) -> None: ...


def _format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


def _format_speed(speed: float) -> str:
    return f"{speed:.4g}" if math.isfinite(speed) else "?"


class PlainDisplay:
    """One self-contained line per update: for logs, pipes and files (no ``\\r``, no ANSI).

    The line starts with PPE's status phrase (``2 iter, 0 epoch / 5 epochs``) so that
    anything matching PPE's output still finds it.
    """

    def __init__(
        self,
        out: IO[str],
        progress: ProgressLike,
        min_interval: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._clock = clock
        self._out = out
        self._progress = progress
        self._min_interval = min_interval
        self._last = -1
        self._last_time = -math.inf

    def update(self, iteration: int, epoch_detail: float, final: bool = False) -> None:
        if iteration == self._last:
            return
        if not final:
            # Like tqdm's ``mininterval``: a line every few seconds keeps CI logs and
            # redirected output readable however short the update interval is.
            now = self._clock()
            if now - self._last_time < self._min_interval:
                return
            self._last_time = now
        self._last = iteration
        progress = self._progress
        speed = progress.speed(iteration)
        total = progress.total
        per_epoch = progress.iters_per_epoch
        status = f"{iteration} iter, {iteration // per_epoch if per_epoch else 0} epoch"
        if total and per_epoch:
            if progress.length is not None:
                amount, unit = progress.length
                status += f" / {amount:g} {unit}s"
            left = total - iteration
            eta = left / speed if speed > 0 else (0.0 if left <= 0 else math.inf)
            line = (
                f"{status} | {iteration}/{total} iters ({min(iteration / total, 1.0):.2%}), "
                f"epoch {epoch_detail:.2f}/{total / per_epoch:g}, "
                f"{_format_speed(speed)} iters/sec, ETA {_format_eta(eta)}\n"
            )
        elif per_epoch:
            line = f"{status} | epoch {epoch_detail:.2f}, {_format_speed(speed)} iters/sec\n"
        else:
            line = f"{status} | epoch length not known yet, {_format_speed(speed)} iters/sec\n"
        self._out.write(line)
        flush = getattr(self._out, "flush", None)
        if flush is not None:
            flush()

    def rebase(self, iteration: int) -> None:
        self._progress.rebase(iteration)

    def close(self) -> None:
        pass


class NoDisplay:
    """What ranks other than 0 show under torch.distributed: nothing."""

    def update(self, iteration: int, epoch_detail: float, final: bool = False) -> None:
        pass

    def rebase(self, iteration: int) -> None:
        pass

    def close(self) -> None:
        pass
