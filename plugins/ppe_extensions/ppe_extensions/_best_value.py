"""BestValue, MaxValue and MinValue: remember the best reported value of a key and when."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ppe_core.errors import BestValueKeyError, NoBestValueError
from ppe_core.training.extension import Extension
from ppe_core.training.triggers import BestValueTrigger, get_trigger

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["BestValue", "BestValueKeyError", "MaxValue", "MinValue", "NoBestValueError"]


class BestValue(Extension):
    """Tracks the best value reported under ``key`` and the iteration and epoch it was seen.

    The extension runs on ``trigger`` and reads ``manager.observation[key]`` there, like the
    value triggers: the value present at that iteration, typically an evaluator's result
    (``'val/loss'``). PPE averaged the key over the interval instead; for evaluator results
    the two agree. A run where the key is absent raises :class:`BestValueKeyError`, as PPE
    does.

    Args:
        key: The observation key to track, e.g. ``'val/loss'``.
        compare: ``compare(best_so_far, new)`` returns whether ``new`` is better.
        trigger: When to compare; once per epoch by default.
    """

    def __init__(
        self,
        key: str,
        compare: Callable[[float, float], bool],
        trigger: TriggerLike = (1, "epoch"),
    ) -> None:
        self.trigger = get_trigger(trigger)
        # The extension's own trigger decides when to compare; the inner trigger compares at
        # every call it gets (every completed iteration) and keeps the best value.
        self._best_trigger = BestValueTrigger(key, compare, (1, "iteration"))
        self._best_it: int | None = None
        self._best_epoch: int | None = None

    default_name = "best_value"

    @property
    def key(self) -> str:
        """The tracked observation key."""
        return self._best_trigger.key

    def __call__(self, manager: ManagerView) -> None:
        """Compares the current value of ``key`` with the best so far."""
        observation = manager.observation
        if self.key not in observation:
            raise BestValueKeyError(
                f'Key "{self.key}" not found in the observation at iteration '
                f"{manager.iteration} (reported: {sorted(observation)}); check the key, or run "
                f"{type(self).__name__} when the value is reported (e.g. after an evaluator)"
            )
        if self._best_trigger(manager):
            self._best_it = manager.iteration
            self._best_epoch = manager.epoch

    def _require_value(self) -> float:
        value = self._best_trigger.best_value
        if value is None:
            raise NoBestValueError(
                f"{type(self).__name__} has not observed {self.key!r} yet: it is known after the "
                "extension ran at least once with the value reported"
            )
        return value

    @property
    def best_value(self) -> float:
        """The best value so far.

        Raises:
            NoBestValueError: No value was observed yet.
        """
        return self._require_value()

    @property
    def best_iteration(self) -> int:
        """The iteration at which the best value was observed.

        Raises:
            NoBestValueError: No value was observed yet.
        """
        self._require_value()
        assert self._best_it is not None
        return self._best_it

    @property
    def best_epoch(self) -> int:
        """The epoch (completed epochs) at which the best value was observed.

        Raises:
            NoBestValueError: No value was observed yet.
        """
        self._require_value()
        assert self._best_epoch is not None
        return self._best_epoch

    def state_dict(self) -> dict[str, Any]:
        """Returns the best value with its iteration and epoch (PPE's layout, plain types)."""
        return {
            "_best_trigger": self._best_trigger.state_dict(),
            "_best_it": self._best_it,
            "_best_epoch": self._best_epoch,
        }

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        self._best_trigger.load_state_dict(to_load["_best_trigger"])
        best_it = to_load["_best_it"]
        best_epoch = to_load["_best_epoch"]
        self._best_it = None if best_it is None else int(best_it)
        self._best_epoch = None if best_epoch is None else int(best_epoch)


class MaxValue(BestValue):
    """Tracks the largest value reported under ``key`` (e.g. ``'val/accuracy'``).

    See :class:`BestValue` for when the value is read.

    Args:
        key: The observation key to track.
        trigger: When to compare; once per epoch by default.
    """

    def __init__(self, key: str, trigger: TriggerLike = (1, "epoch")) -> None:
        super().__init__(key, operator.lt, trigger)  # best < new

    default_name = "max_value"


class MinValue(BestValue):
    """Tracks the smallest value reported under ``key`` (e.g. ``'val/loss'``).

    See :class:`BestValue` for when the value is read.

    Args:
        key: The observation key to track.
        trigger: When to compare; once per epoch by default.
    """

    def __init__(self, key: str, trigger: TriggerLike = (1, "epoch")) -> None:
        super().__init__(key, operator.gt, trigger)  # best > new

    default_name = "min_value"
