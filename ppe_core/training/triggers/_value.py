"""Triggers driven by a reported value: best/min/max value and early stopping.

A check that finds no mean of its key says why (PPE: ``KeyError`` from the min/max triggers, a
bare warning from early stopping); the arguments are checked with messages naming the fix.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ppe_core._reporting import DictSummary
from ppe_core.errors import ConfigurationError, MissingObservationWarning, TriggerTypeError
from ppe_core.training.triggers._base import Trigger, TriggerLike, check_callable
from ppe_core.training.triggers._early_stopping_state import EarlyStoppingState
from ppe_core.training.triggers._factory import get_trigger

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

_F = TypeVar("_F")


class _MonitorTrigger(Trigger):
    """The value triggers' shared part: one key's running summary, read at each check."""

    def __init__(self, trigger: TriggerLike) -> None:
        self._interval_trigger = get_trigger(trigger)
        self._summary = DictSummary()

    def _accumulate(self, manager: ManagerView, key: str) -> bool:
        """Adds this iteration's value of ``key`` (if reported); returns whether it was."""
        observation = manager.observation
        if key not in observation:
            return False
        self._summary.add({key: observation[key]})
        return True

    def _checked_mean(self, manager: ManagerView, key: str, present: bool) -> float | None:
        """The interval's mean as a float (the triggers' one host sync; the summary starts
        again), or ``None`` with a warning when ``key`` was not reported.

        Raises:
            ConfigurationError: ``key`` was reported, but never as a scalar.
        """
        means = self._summary.compute_mean() if present else {}
        if key in means:
            self._summary = DictSummary()
            return float(means[key])
        explain_unread_value(type(self).__name__, key, manager, present)
        return None

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Delegates to the check trigger."""
        return self._interval_trigger.may_fire(iteration, epoch_length)


class BestValueTrigger(_MonitorTrigger):
    """Fires at a check when the interval's mean of a value is better than every earlier one.

    As in PPE, the trigger adds ``manager.observation[key]`` to a running summary at every
    iteration it is called, and at the iterations where ``trigger`` fires compares the mean
    over the interval with the best so far. It therefore needs a call every iteration
    (:meth:`next_check` is ``None``); the per-step cost is a dictionary lookup and, when the
    key was reported, one append to a buffer (tensors stay on their device; the one host copy
    is at the check). A check at which the key was never reported warns with
    :class:`MissingObservationWarning` and does not fire (PPE raised ``KeyError``).

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
        self._compare = check_compare(compare, owner)
        super().__init__(trigger)
        self._best_value: float | None = None

    @property
    def key(self) -> str:
        """The monitored observation key."""
        return self._key

    @property
    def best_value(self) -> float | None:
        """The best interval mean so far (``None`` before the first check)."""
        return self._best_value

    def __call__(self, manager: ManagerView) -> bool:
        """Accumulates this iteration's value; at a check, returns whether the mean improved."""
        self._accumulate(manager, self._key)
        if not self._interval_trigger(manager):
            return False
        mean = self._checked_mean(manager, self._key, True)
        if mean is None:
            return False
        if self._best_value is None or self._compare(self._best_value, mean):
            self._best_value = mean
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """Returns PPE's keys: the check trigger, the interval's summary and the best value."""
        return {
            "interval_trigger": self._interval_trigger.state_dict(),
            "_summary": self._summary.state_dict(),
            "_best_value": self._best_value,
        }

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output (also PPE's, and ours without ``_summary``)."""
        self._interval_trigger.load_state_dict(to_load["interval_trigger"])
        self._summary.load_state_dict(to_load.get("_summary") or {})
        best = to_load["_best_value"]
        self._best_value = None if best is None else float(best)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._key!r}, trigger={self._interval_trigger!r})"


class MaxValueTrigger(BestValueTrigger):
    """Fires at a check when the interval's mean is the largest so far (``'val/accuracy'``).

    See :class:`BestValueTrigger` for how the value is accumulated.
    """

    def __init__(self, key: str, trigger: TriggerLike = (1, "epoch")) -> None:
        super().__init__(key, operator.lt, trigger)  # best < new


class MinValueTrigger(BestValueTrigger):
    """Fires at a check when the interval's mean is the smallest so far (e.g. ``'val/loss'``).

    See :class:`BestValueTrigger` for how the value is accumulated.
    """

    def __init__(self, key: str, trigger: TriggerLike = (1, "epoch")) -> None:
        super().__init__(key, operator.gt, trigger)  # best > new


class EarlyStoppingTrigger(EarlyStoppingState, _MonitorTrigger):
    """Stop trigger: fires when the monitored value stopped improving, or at ``max_trigger``.

    As in PPE, every iteration's ``manager.observation[monitor]`` goes into a running summary;
    at each ``check_trigger`` iteration the mean over the interval is compared with the best
    mean so far. An improvement resets the count of checks without improvement; otherwise the
    count grows, and the trigger fires once it reaches ``patience``. A check at which
    ``monitor`` is not in the observation warns with :class:`MissingObservationWarning` and
    changes nothing (the values collected so far stay for the next check).

    The trigger needs a call every iteration (:meth:`next_check` is ``None``); the per-step
    cost is a dictionary lookup and one buffer append (device tensors are not synchronized;
    the single host copy is at the check).

    Its ``state_dict`` holds the best mean, the count of checks without improvement and the
    inner states, so a resumed run resumes the count (PPE saved nothing for this trigger and
    restarted it; see ``_early_stopping_state.py``).

    Args:
        check_trigger: When to compare; once per epoch by default.
        monitor: The observation key to monitor.
        patience: Checks without improvement tolerated before stopping.
        mode: ``'min'``, ``'max'``, or ``'auto'`` (``'max'`` when ``monitor`` contains
            ``'accuracy'``, else ``'min'``).
        verbose: Print the comparison chosen, and a line when stopping early.
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
        self.monitor = check_key(monitor, "EarlyStoppingTrigger", "monitor")
        check_early_stopping(patience, mode)
        if mode == "auto":
            mode = "max" if "accuracy" in monitor else "min"
        self.mode = mode
        self.patience = patience
        self.verbose = verbose
        self.already_warning = False  # PPE's attribute (unused there too)
        self._compare = operator.gt if mode == "max" else operator.lt
        if verbose:
            print(f"early stopping: operator is {'greater' if mode == 'max' else 'less'}")
        self.best = float("-inf") if mode == "max" else float("inf")
        self.count = 0
        super().__init__(check_trigger)
        self._max_trigger = get_trigger(max_trigger)

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether training should stop after the iteration just completed."""
        present = self._accumulate(manager, self.monitor)
        if self._max_trigger(manager):
            return True
        if not self._interval_trigger(manager):
            return False
        mean = self._checked_mean(manager, self.monitor, present)
        if mean is None:
            return False
        if self._compare(mean, self.best):
            self.best = mean
            self.count = 0
        else:
            self.count += 1
        stop = self._stop_condition()
        if stop and self.verbose:
            print(f"Epoch {manager.epoch}: early stopping")
        return stop

    def _stop_condition(self) -> bool:
        return self.count >= self.patience

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Returns whether the check or the max trigger may fire."""
        fires = super().may_fire(iteration, epoch_length)
        return fires or self._max_trigger.may_fire(iteration, epoch_length)

    def get_training_length(self) -> tuple[float, str]:
        """Returns ``max_trigger``'s ``(period, unit)``, the longest the training can run.

        Raises:
            ConfigurationError: ``max_trigger`` does not define a length.
        """
        length: tuple[float, str] = check_training_length(self._max_trigger).get_training_length()
        return length

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(check_trigger={self._interval_trigger!r}, "
            f"monitor={self.monitor!r}, patience={self.patience}, mode={self.mode!r}, "
            f"max_trigger={self._max_trigger!r})"
        )


def check_key(key: object, owner: str, what: str = "key") -> str:
    """Validates an observation key such as ``'val/loss'``."""
    if not isinstance(key, str):
        raise TriggerTypeError(
            f"{owner} {what} must be the str name of a reported value such as 'val/loss', "
            f"got {type(key).__name__} {key!r}"
        )
    return key


def check_compare(compare: _F, owner: str) -> _F:
    """A value trigger's ``compare``; raises unless it is callable."""
    must = f"{owner} compare must be a callable compare(best, new) -> bool"
    return check_callable(compare, must, "; e.g. lambda best, new: new < best")


def check_early_stopping(patience: object, mode: object) -> None:
    """Raises unless ``patience`` is an int >= 0 and ``mode`` is 'auto', 'min' or 'max'."""
    owner = "EarlyStoppingTrigger"
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


def check_training_length(max_trigger: object) -> Any:
    """Returns ``EarlyStoppingTrigger``'s ``max_trigger``; raises unless it defines a training
    length (PPE's is always an interval trigger; ours may be any trigger)."""
    if getattr(max_trigger, "get_training_length", None) is None:
        raise ConfigurationError(
            f"EarlyStoppingTrigger max_trigger {max_trigger!r} has no training "
            "length; pass a (period, unit) pair such as (100, 'epoch')"
        )
    return max_trigger


def explain_unread_value(owner: str, key: str, manager: ManagerView, present: bool) -> None:
    """At a value trigger's check that found no mean of ``key``: warns with
    :class:`MissingObservationWarning` that it was not reported.

    Raises:
        ConfigurationError: ``key`` was reported this iteration (``present``), but never as a
            scalar.
    """
    if present and key in manager.observation:
        raise ConfigurationError(
            f"{owner} monitors {key!r}, but its reported value "
            f"{manager.observation[key]!r} is not a scalar "
            "number; report a float or a zero-dimensional tensor under that key"
        )
    warnings.warn(
        MissingObservationWarning(
            f"{owner} monitors {key!r}, which is not in the observation at iteration "
            f"{manager.iteration} (keys: {sorted(manager.observation)}); check the key "
            "or the check trigger"
        ),
        stacklevel=4,
    )
