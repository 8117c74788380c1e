"""``TimeTrigger``: fires every ``period`` seconds of the manager's elapsed time."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ppe_core.training.triggers._base import Trigger, _positive_number

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView


class TimeTrigger(Trigger):
    """Fires at the first call after each multiple of ``period`` seconds of elapsed time.

    Time cannot be predicted from the iteration, so :meth:`next_check` is ``None`` (the manager
    calls it every iteration; the call is a float comparison). If one iteration spans several
    periods, it fires once and the missed periods are skipped rather than fired on later calls.

    Args:
        period: Interval in seconds, > 0.

    Raises:
        TriggerTypeError: ``period`` is not a number.
        ConfigurationError: ``period`` is not a finite number > 0.
    """

    def __init__(self, period: float) -> None:
        self.period: float = check_seconds(period)
        self._next_time: float = self.period

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether ``manager.elapsed_time`` reached the next multiple of the period."""
        elapsed = manager.elapsed_time
        if elapsed < self._next_time:
            return False
        missed = math.floor((elapsed - self._next_time) / self.period)
        self._next_time += self.period * (missed + 1)
        return True

    def state_dict(self) -> dict[str, Any]:
        """Returns ``{'next_time': float}`` (PPE's key)."""
        return {"next_time": self._next_time}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the time of the next firing."""
        self._next_time = float(to_load["next_time"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.period!r})"


def check_seconds(period: object) -> float:
    """``TimeTrigger``'s ``period`` as a float; raises unless a finite number of seconds > 0."""
    return _positive_number(
        period,
        f"TimeTrigger period must be a number of seconds, got {type(period).__name__} "
        f"{period!r}; e.g. TimeTrigger(600) for every 10 minutes",
        f"TimeTrigger period must be a finite number of seconds > 0, got {period!r}",
    )
