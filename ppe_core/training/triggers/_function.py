"""``FunctionTrigger``: asks a user function, at the iterations an inner trigger selects."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ppe_core.training.triggers._base import Trigger, TriggerLike, check_callable
from ppe_core.training.triggers._factory import get_trigger

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView


class FunctionTrigger(Trigger):
    """Fires when ``trigger`` fires and ``fn(*args, **kwargs)`` returns a true value.

    ``fn`` does not receive the manager (as in PPE); bind what it needs through ``args``.

    Args:
        fn: The condition.
        args: Positional arguments for ``fn``.
        kwargs: Keyword arguments for ``fn``.
        trigger: When to ask ``fn``; every iteration by default.

    Raises:
        TriggerTypeError: ``fn`` is not callable, or ``trigger`` is not trigger-like.
    """

    def __init__(
        self,
        fn: Callable[..., bool],
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        trigger: TriggerLike = (1, "iteration"),
    ) -> None:
        self._fn = check_callable(fn, "FunctionTrigger fn must be callable")
        self._args = tuple(args or ())
        self._kwargs = dict(kwargs or {})
        self._interval_trigger = get_trigger(trigger)

    def __call__(self, manager: ManagerView) -> bool:
        """Returns ``fn(...)`` at the inner trigger's iterations, ``False`` elsewhere."""
        return self._interval_trigger(manager) and bool(self._fn(*self._args, **self._kwargs))

    def next_check(self, iteration: int, iters_per_epoch: int) -> int | None:
        """Delegates to the inner trigger."""
        return self._interval_trigger.next_check(iteration, iters_per_epoch)

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Delegates to the inner trigger; ``fn`` is not called (PPE called it here)."""
        return self._interval_trigger.may_fire(iteration, epoch_length)

    def state_dict(self) -> dict[str, Any]:
        """Returns ``{'interval_trigger': ...}``, the inner trigger's state."""
        return {"interval_trigger": self._interval_trigger.state_dict()}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the inner trigger's state."""
        self._interval_trigger.load_state_dict(to_load["interval_trigger"])
