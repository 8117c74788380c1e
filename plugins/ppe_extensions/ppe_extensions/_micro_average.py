"""MicroAverage: the ratio of two reported sums over an interval (e.g. correct / total)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.training.extension import PRIORITY_EDITOR, Extension
from ppe_core.training.triggers import DueCheck, EveryIteration, get_trigger

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["MicroAverage"]


def _plain(value: Any) -> Any:
    # Snapshots hold plain numbers; this is the only place the running sums reach the host
    # besides the report itself.
    return value.item() if isinstance(value, torch.Tensor) else value


class MicroAverage(Extension):
    """Reports ``sum(numerators) / sum(denominators)`` over each interval.

    With per-batch counts ``n_i`` (e.g. correct predictions) and ``d_i`` (examples), this is
    the micro-average ``sum(n_i) / sum(d_i)``, which weighs every example equally, whereas the
    mean of the per-batch ratios weighs every batch equally. Report both counts each
    iteration, e.g. ``ppe.reporting.report({'correct': correct, 'total': len(t)}, model)``.

    The extension runs every iteration (it must see every batch's counts) but does not
    synchronize with the device there: tensor counts are summed on their device, and one
    transfer happens when the result is reported. Iterations without both keys are skipped.

    Args:
        numerator_key: Observation key of the numerator, e.g. ``'main/correct'``.
        denominator_key: Observation key of the denominator, e.g. ``'main/total'``.
        result_key: Observation key the ratio is written to, e.g. ``'main/accuracy'``.
        trigger: When to report the ratio and restart the sums; once per epoch by default.
            This is not the extension's own trigger, which fires every iteration.
    """

    priority = PRIORITY_EDITOR

    def __init__(
        self,
        numerator_key: str,
        denominator_key: str,
        result_key: str,
        trigger: TriggerLike = (1, "epoch"),
    ) -> None:
        self._numerator_key = numerator_key
        self._denominator_key = denominator_key
        self._result_key = result_key
        self.trigger = EveryIteration()  # it must see every iteration's counts
        self._trigger = DueCheck(get_trigger(trigger))
        self._numerator: Any = 0
        self._denominator: Any = 0

    def __call__(self, manager: ManagerView) -> None:
        """Adds this iteration's counts and reports the ratio when the interval ends."""
        observation = manager.observation
        if self._numerator_key in observation and self._denominator_key in observation:
            self._numerator = self._numerator + observation[self._numerator_key]
            self._denominator = self._denominator + observation[self._denominator_key]
        if not self._trigger(manager):
            return
        numerator, denominator = self._numerator, self._denominator
        self._numerator = self._denominator = 0
        if isinstance(numerator, torch.Tensor) or isinstance(denominator, torch.Tensor):
            ratio = float(torch.as_tensor(numerator) / torch.as_tensor(denominator))
        elif denominator == 0:
            ratio = float("nan")  # nothing counted in this interval
        else:
            ratio = float(numerator) / float(denominator)
        observation[self._result_key] = ratio

    def state_dict(self) -> dict[str, Any]:
        """Returns the running sums as plain numbers (PPE's layout)."""
        return {"_numerator": _plain(self._numerator), "_denominator": _plain(self._denominator)}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the running sums from :meth:`state_dict`."""
        self._numerator = to_load["_numerator"]
        self._denominator = to_load["_denominator"]
