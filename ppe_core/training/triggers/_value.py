"""Triggers driven by a reported value: best/min/max value and early stopping."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ppe_core.errors import ConfigurationError, PPEWarning
from ppe_core.training.triggers._base import Trigger, TriggerLike, TriggerTypeError, check_key
from ppe_core.training.triggers._factory import get_trigger

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView


class MissingObservationWarning(PPEWarning):
    """A value trigger reached a check but the monitored key was not in the observation."""


def _read_value(manager: ManagerView, key: str, owner: str) -> float | None:
    # The only host sync of these triggers, and only at check iterations.
    observation = manager.observation
    if key not in observation:
        return None
    value = observation[key]
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ConfigurationError(
            f"{owner} monitors {key!r}, but its reported value {value!r} is not a scalar "
            "number; report a float or a one-element tensor under that key"
        ) from error


def _combined_next_check(
    first: Trigger, second: Trigger, iteration: int, length: int
) -> int | None:
    a = first.next_check(iteration, length)
    b = second.next_check(iteration, length)
    if a is None or b is None:
        return None
    return min(a, b)


class BestValueTrigger(Trigger):
    """Fires at a check when the monitored value is better than every earlier checked value.

    The value is read from ``manager.observation[key]`` at the iterations where ``trigger``
    fires (so that the manager need not call it in between); it is therefore the value present
    at that iteration, typically an evaluator's result (``'val/loss'``) or a mean that a log
    extension put there, not a mean the trigger builds itself as PPE's did. A check at which
    the key is absent does not fire and does not change the best value.

    Args:
        key: The observation key to monitor, e.g. ``'val/loss'``.
        compare: ``compare(best_so_far, new)`` returns whether ``new`` is better.
        trigger: When to check; once per epoch by default.

    Raises:
        TriggerTypeError: ``key`` is not a str, ``compare`` is not callable, or ``trigger`` is
            not trigger-like.
    """

    def __init__(
        self,
        key: str,
        compare: Callable[[float, float], bool],
        trigger: TriggerLike = (1, "epoch"),
    ) -> None:
        owner = type(self).__name__
        self._key = check_key(key, owner)
        if not callable(compare):
            raise TriggerTypeError(
                f"{owner} compare must be a callable compare(best, new) -> bool, got "
                f"{type(compare).__name__} {compare!r}; e.g. lambda best, new: new < best"
            )
        self._compare = compare
        self._interval_trigger = get_trigger(trigger)
        self._best_value: float | None = None

    @property
    def key(self) -> str:
        """The monitored observation key."""
        return self._key

    @property
    def best_value(self) -> float | None:
        """The best value checked so far (``None`` before the first check)."""
        return self._best_value

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether this check's value improved on the best one (the first always does)."""
        if not self._interval_trigger(manager):
            return False
        value = _read_value(manager, self._key, type(self).__name__)
        if value is None:
            return False
        if self._best_value is None or self._compare(self._best_value, value):
            self._best_value = value
            return True
        return False

    def next_check(self, iteration: int, iters_per_epoch: int) -> int | None:
        """Delegates to the check trigger."""
        return self._interval_trigger.next_check(iteration, iters_per_epoch)

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Delegates to the check trigger."""
        return self._interval_trigger.may_fire(iteration, epoch_length)

    def state_dict(self) -> dict[str, Any]:
        """Returns the best value and the check trigger's state."""
        return {
            "interval_trigger": self._interval_trigger.state_dict(),
            "_best_value": self._best_value,
        }

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the best value and the check trigger's state."""
        self._interval_trigger.load_state_dict(to_load["interval_trigger"])
        best = to_load["_best_value"]
        self._best_value = None if best is None else float(best)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._key!r}, trigger={self._interval_trigger!r})"


class MaxValueTrigger(BestValueTrigger):
    """Fires at a check when the monitored value is the largest so far (e.g. ``'val/accuracy'``).

    See :class:`BestValueTrigger` for when the value is read.
    """

    def __init__(self, key: str, trigger: TriggerLike = (1, "epoch")) -> None:
        super().__init__(key, operator.lt, trigger)  # best < new


class MinValueTrigger(BestValueTrigger):
    """Fires at a check when the monitored value is the smallest so far (e.g. ``'val/loss'``).

    See :class:`BestValueTrigger` for when the value is read.
    """

    def __init__(self, key: str, trigger: TriggerLike = (1, "epoch")) -> None:
        super().__init__(key, operator.gt, trigger)  # best > new


class EarlyStoppingTrigger(Trigger):
    """Stop trigger: fires when the monitored value stopped improving, or at ``max_trigger``.

    At each ``check_trigger`` iteration it reads ``manager.observation[monitor]`` (see
    :class:`BestValueTrigger`). A value better than the best so far resets the count of
    checks without improvement; otherwise the count grows, and the trigger fires once it
    reaches ``patience``. A check without the key warns with
    :class:`MissingObservationWarning` and changes nothing.

    Args:
        check_trigger: When to compare; once per epoch by default.
        monitor: The observation key to monitor.
        patience: Checks without improvement tolerated before stopping.
        mode: ``'min'``, ``'max'``, or ``'auto'`` (``'max'`` when ``monitor`` contains
            ``'accuracy'``, else ``'min'``).
        verbose: Print a line when stopping early.
        max_trigger: Fires (stopping training) regardless of the value; 100 epochs by default.

    Raises:
        TriggerTypeError: An argument has the wrong type.
        ConfigurationError: ``patience`` is negative or ``mode`` is unknown.
    """

    def __init__(
        self,
        check_trigger: TriggerLike = (1, "epoch"),
        monitor: str = "main/loss",
        patience: int = 3,
        mode: str = "auto",
        verbose: bool = False,
        max_trigger: TriggerLike = (100, "epoch"),
    ) -> None:
        owner = "EarlyStoppingTrigger"
        self.monitor = check_key(monitor, owner, "monitor")
        if isinstance(patience, bool) or not isinstance(patience, int):
            raise TriggerTypeError(
                f"{owner} patience must be an int number of checks, got "
                f"{type(patience).__name__} {patience!r}"
            )
        if patience < 0:
            raise ConfigurationError(f"{owner} patience must be >= 0, got {patience}")
        if mode not in ("auto", "min", "max"):
            raise ConfigurationError(
                f"{owner} mode must be 'auto', 'min' or 'max', got {mode!r}; 'min' suits "
                "losses and 'max' accuracies"
            )
        if mode == "auto":
            mode = "max" if "accuracy" in monitor else "min"
        self.mode = mode
        self.patience = patience
        self.verbose = verbose
        self._compare: Callable[[float, float], bool] = (
            operator.gt if mode == "max" else operator.lt
        )
        self.best = float("-inf") if mode == "max" else float("inf")
        self.count = 0
        self._interval_trigger = get_trigger(check_trigger)
        self._max_trigger = get_trigger(max_trigger)

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether training should stop after the iteration just completed."""
        if self._max_trigger(manager):
            return True
        if not self._interval_trigger(manager):
            return False
        value = _read_value(manager, self.monitor, "EarlyStoppingTrigger")
        if value is None:
            warnings.warn(
                MissingObservationWarning(
                    f"EarlyStoppingTrigger monitors {self.monitor!r}, which is not in the "
                    f"observation at iteration {manager.iteration} (keys: "
                    f"{sorted(manager.observation)}); check the key or the check_trigger"
                ),
                stacklevel=2,
            )
            return False
        if self._compare(value, self.best):
            self.best = value
            self.count = 0
        else:
            self.count += 1
        if self.count >= self.patience:
            if self.verbose:
                print(f"Epoch {manager.epoch}: early stopping")
            return True
        return False

    def next_check(self, iteration: int, iters_per_epoch: int) -> int | None:
        """Returns the earlier of the check and max triggers' next checks."""
        return _combined_next_check(
            self._interval_trigger, self._max_trigger, iteration, iters_per_epoch
        )

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Returns whether the check or the max trigger may fire."""
        return self._interval_trigger.may_fire(
            iteration, epoch_length
        ) or self._max_trigger.may_fire(iteration, epoch_length)

    def get_training_length(self) -> tuple[float, str]:
        """Returns ``max_trigger``'s ``(period, unit)``, the longest the training can run.

        Raises:
            ConfigurationError: ``max_trigger`` does not define a length.
        """
        length = getattr(self._max_trigger, "get_training_length", None)
        if length is None:
            raise ConfigurationError(
                f"EarlyStoppingTrigger max_trigger {self._max_trigger!r} has no training "
                "length; pass a (period, unit) pair such as (100, 'epoch')"
            )
        result: tuple[float, str] = length()
        return result

    def state_dict(self) -> dict[str, Any]:
        """Returns the best value, the count of checks without improvement and inner states."""
        return {
            "best": self.best,
            "count": self.count,
            "interval_trigger": self._interval_trigger.state_dict(),
            "max_trigger": self._max_trigger.state_dict(),
        }

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        self.best = float(to_load["best"])
        self.count = int(to_load["count"])
        self._interval_trigger.load_state_dict(to_load["interval_trigger"])
        self._max_trigger.load_state_dict(to_load["max_trigger"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(check_trigger={self._interval_trigger!r}, "
            f"monitor={self.monitor!r}, patience={self.patience}, mode={self.mode!r}, "
            f"max_trigger={self._max_trigger!r})"
        )
