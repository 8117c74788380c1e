"""``EarlyStoppingTrigger``'s state in snapshots.

PPE saves nothing for this trigger, so a resumed PPE run starts its best value and its count of
checks without improvement again; this state resumes them, with the inner triggers' states and
the values summed since the last check. A state without these keys (PPE's empty one) leaves a
fresh trigger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppe_core._reporting import DictSummary
    from ppe_core.training.triggers._base import Trigger

__all__ = ["EarlyStoppingState"]


class EarlyStoppingState:
    """The snapshot state of ``EarlyStoppingTrigger``, mixed into it."""

    # The trigger's attributes saved here.
    best: float
    count: int
    _interval_trigger: Trigger
    _max_trigger: Trigger
    _summary: DictSummary

    def state_dict(self) -> dict[str, Any]:
        """Returns the best mean, the count of checks without improvement and inner states."""
        return {
            "best": self.best,
            "count": self.count,
            "interval_trigger": self._interval_trigger.state_dict(),
            "max_trigger": self._max_trigger.state_dict(),
            "_summary": self._summary.state_dict(),
        }

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned; PPE's empty state leaves a fresh trigger."""
        if not to_load:  # PPE's state is empty
            return
        self.best = float(to_load["best"])
        self.count = int(to_load["count"])
        self._interval_trigger.load_state_dict(to_load["interval_trigger"])
        self._max_trigger.load_state_dict(to_load["max_trigger"])
        self._summary.load_state_dict(to_load["_summary"])
