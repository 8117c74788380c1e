"""Accumulate extensions: the mean, extremes or spread of one reported key over an interval.

``AverageAccumulate(('loss', 'loss/epoch_mean'))`` reads ``loss`` from every iteration's
observation and, when its trigger fires, writes the accumulated value under the second key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ppe_core.distributed import gather_objects, require_group
from ppe_core.errors import ArgumentTypeError, MissingObservationError
from ppe_core.training.extension import PRIORITY_EDITOR, Extension
from ppe_core.training.triggers import DueCheck, get_trigger

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = [
    "AccumulateBase",
    "AverageAccumulate",
    "MaxAccumulate",
    "MinAccumulate",
    "MissingObservationError",
    "StandardDeviationAccumulate",
    "UnbiasedStandardDeviationAccumulate",
]


def _plain(value: Any) -> Any:
    """A reported value ready to accumulate: tensors detached (kept on their device)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    try:
        return float(value)  # Python and NumPy numbers, other float-likes
    except (TypeError, ValueError):
        raise _not_a_number(value) from None


def _not_a_number(value: object) -> ArgumentTypeError:
    return ArgumentTypeError(
        f"accumulate extensions take numbers or tensors, got {type(value).__name__} {value!r}"
    )


def _sqrt(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.sqrt(torch.clamp(value, min=0.0))
    return math.sqrt(value) if value > 0.0 else 0.0


class _Summary:
    """What an accumulate extension keeps between reports; tensors stay on their device."""

    def add(self, value: Any) -> None:
        raise NotImplementedError

    def compute(self) -> Any:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def absorb(self, state: Mapping[str, Any]) -> None:
        """Adds what another summary's :meth:`state_dict` holds."""
        raise NotImplementedError

    @classmethod
    def merged(cls, states: Iterable[Mapping[str, Any]]) -> _Summary:
        """The summary of :meth:`state_dict` outputs (several processes', or one to restore)."""
        summary = cls()
        for state in states:
            summary.absorb(state)
        return summary


class _AverageSummary(_Summary):
    def __init__(self) -> None:
        self._sum: Any = 0.0
        self._n = 0

    def add(self, value: Any) -> None:
        self._sum = self._sum + value
        self._n += 1

    def compute(self) -> Any:
        return self._sum / self._n if self._n else float("nan")

    def state_dict(self) -> dict[str, Any]:
        # PPE's layout: the running mean and the count.
        return {"_x": float(self.compute()) if self._n else 0.0, "_n": self._n}

    def absorb(self, state: Mapping[str, Any]) -> None:
        n = int(state["_n"])
        self._sum += float(state["_x"]) * n
        self._n += n


class _MomentsSummary(_Summary):
    """Sums of values and squares, for the (biased or unbiased) standard deviation."""

    unbiased: ClassVar[bool] = False

    def __init__(self) -> None:
        self._x: Any = 0.0
        self._x2: Any = 0.0
        self._n = 0.0

    def add(self, value: Any) -> None:
        self._x = self._x + value
        self._x2 = self._x2 + value * value
        self._n += 1.0

    def compute(self) -> Any:
        n = self._n
        if n <= (1.0 if self.unbiased else 0.0):
            return float("nan")
        mean = self._x / n
        variance = self._x2 / n - mean * mean
        if self.unbiased:
            variance = variance * (n / (n - 1.0))
        return _sqrt(variance)

    def state_dict(self) -> dict[str, Any]:
        return {"_x": float(self._x), "_x2": float(self._x2), "_n": float(self._n)}

    def absorb(self, state: Mapping[str, Any]) -> None:
        self._x += float(state["_x"])
        self._x2 += float(state["_x2"])
        self._n += float(state["_n"])


class _UnbiasedMomentsSummary(_MomentsSummary):
    unbiased = True


class _ExtremeSummary(_Summary):
    """The running maximum (``largest``) or minimum of the values."""

    largest: ClassVar[bool] = True
    key: ClassVar[str] = "_max_x"

    def __init__(self) -> None:
        self._value: Any = None

    def add(self, value: Any) -> None:
        current = self._value
        if current is None:
            self._value = value
        elif isinstance(current, torch.Tensor) or isinstance(value, torch.Tensor):
            a, b = torch.as_tensor(current), torch.as_tensor(value)
            self._value = torch.maximum(a, b) if self.largest else torch.minimum(a, b)
        else:
            self._value = max(current, value) if self.largest else min(current, value)

    def compute(self) -> Any:
        if self._value is None:
            return -math.inf if self.largest else math.inf
        return self._value

    def state_dict(self) -> dict[str, Any]:
        return {self.key: float(self.compute())}

    def absorb(self, state: Mapping[str, Any]) -> None:
        value = float(state[self.key])
        if not math.isinf(value):  # an empty summary's -inf (+inf for the minimum)
            self.add(value)


class _MinSummary(_ExtremeSummary):
    largest = False
    key = "_min_x"


class AccumulateBase(Extension):
    """Accumulates the values of one observation key and reports the result periodically.

    The extension runs every iteration (its own trigger, ``(1, 'iteration')``) and adds the
    value of ``conversion_key_pair[0]`` from the observation; when ``trigger`` fires it writes
    the accumulated value under ``conversion_key_pair[1]`` and starts over. Tensor values stay
    on their device: nothing synchronises until the value is read (a log, a snapshot).

    Args:
        conversion_key_pair: ``(source key, destination key)``, e.g.
            ``('main/loss', 'main/loss/mean')``.
        trigger: When to report and restart; once per epoch by default.
        distributed: Combine the values of all ``torch.distributed`` ranks when reporting
            (every rank must run the extension on the same schedule).

    Raises:
        ArgumentTypeError: ``conversion_key_pair`` is not a pair of keys.
        DistributedNotInitializedError: ``distributed=True`` without an initialised
            ``torch.distributed`` (a ``RuntimeError``, as in PPE).
    """

    priority = PRIORITY_EDITOR
    _summary_class: ClassVar[type[_Summary]] = _Summary

    def __init__(
        self,
        conversion_key_pair: tuple[str, str],
        trigger: TriggerLike = (1, "epoch"),
        distributed: bool = False,
    ) -> None:
        pair = conversion_key_pair
        self._check_pair(pair)
        self._conversion_key_pair: tuple[str, str] = (pair[0], pair[1])
        self._trigger = get_trigger(trigger)
        self._due = DueCheck(self._trigger)
        self._distributed = distributed
        if distributed:
            require_group(f"{type(self).__name__}(distributed=True)")
        self._summary = self._summary_class()

    def __call__(self, manager: ManagerView) -> None:
        """Adds this iteration's value and reports the accumulation when the trigger fires."""
        observation = manager.observation
        source, destination = self._conversion_key_pair
        try:
            value = observation[source]
        except KeyError:
            raise self._missing_error(source, manager) from None
        self._summary.add(_plain(value))
        if self._due(manager):
            summary = self._summary
            if self._distributed:
                # Looked up on the module at call time, so tests can stand in for other ranks.
                summary = self._summary_class.merged(gather_objects(summary.state_dict()))
            observation[destination] = summary.compute()
            self._summary = self._summary_class()

    def _check_pair(self, pair: object) -> None:
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(isinstance(key, str) and key for key in pair)
        ):
            raise ArgumentTypeError(
                f"{type(self).__name__} conversion_key_pair must be (source key, destination "
                f"key), e.g. ('main/loss', 'main/loss/mean'); got {pair!r}"
            )

    def _missing_error(self, source: str, manager: ManagerView) -> MissingObservationError:
        return MissingObservationError(
            f"{type(self).__name__} found no {source!r} in the observation of iteration "
            f"{manager.iteration} (keys: {sorted(manager.observation) or 'none'}); report it "
            "every iteration the extension runs, or register the extension with the trigger "
            "on which it is reported, e.g. manager.extend(ext, trigger=(1, 'epoch'))"
        )

    def state_dict(self) -> dict[str, Any]:
        """Returns the trigger's state and the running summary (PPE's keys)."""
        return {"_trigger": self._trigger.state_dict(), "_summary": self._summary.state_dict()}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the state :meth:`state_dict` returned."""
        if to_load.get("_trigger") is not None:
            self._trigger.load_state_dict(to_load["_trigger"])
        self._summary = self._summary_class.merged([to_load["_summary"]])


class AverageAccumulate(AccumulateBase):
    """Reports the mean of a key's values over each interval (see :class:`AccumulateBase`)."""

    _summary_class = _AverageSummary


class StandardDeviationAccumulate(AccumulateBase):
    """Reports the population standard deviation of a key's values over each interval."""

    _summary_class = _MomentsSummary


class UnbiasedStandardDeviationAccumulate(AccumulateBase):
    """Reports the sample (``n - 1``) standard deviation; NaN for fewer than two values."""

    _summary_class = _UnbiasedMomentsSummary


class MaxAccumulate(AccumulateBase):
    """Reports the largest of a key's values over each interval."""

    _summary_class = _ExtremeSummary


class MinAccumulate(AccumulateBase):
    """Reports the smallest of a key's values over each interval."""

    _summary_class = _MinSummary
