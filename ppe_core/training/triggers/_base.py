"""The ``Trigger`` base class, the ``next_check`` contract, and argument checks several
triggers share."""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ppe_core.errors import ConfigurationError, TriggerTypeError

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

NEVER: int = sys.maxsize
"""What :meth:`Trigger.next_check` returns for "this trigger will never fire again"."""

UNITS = ("epoch", "iteration")

_F = TypeVar("_F")


def next_due(trigger: object, iteration: int, iters_per_epoch: int) -> int:
    """The first iteration after ``iteration`` at which ``trigger`` must be consulted.

    The one reading of the :meth:`Trigger.next_check` contract shared by the manager's schedule
    and by every extension that consults an inner trigger itself: a trigger without
    ``next_check``, an answer of ``None`` ("unpredictable") or an answer at or before
    ``iteration`` (a contract breach, handled safely) all mean "consult it next iteration";
    :data:`NEVER` means never.

    Args:
        trigger: Any trigger object (``next_check`` is optional, as for plain callables).
        iteration: The completed-iteration count just processed (0 before training).
        iters_per_epoch: Iterations in one epoch.
    """
    next_check = getattr(trigger, "next_check", None)
    due = None if next_check is None else next_check(iteration, iters_per_epoch)
    if due is None or due <= iteration:
        return iteration + 1
    return min(int(due), NEVER)


class Trigger:
    """Base class of triggers: decide, from the manager's state, whether something runs now.

    Subclasses implement :meth:`__call__`. To spare the manager a call every iteration, they
    should also implement :meth:`next_check` (and :meth:`may_fire`) consistently with it; the
    defaults here are the safe ones for a trigger that cannot predict itself.
    """

    #: True when the trigger fires after every iteration, unconditionally: the manager then
    #: calls its extension directly each step instead of consulting the trigger.
    fires_every_iteration: bool = False

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether the trigger fires at ``manager.iteration`` (completed iterations).

        Args:
            manager: The manager's read-only view; ``iteration`` is already incremented.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(manager)")

    def next_check(self, iteration: int, iters_per_epoch: int) -> int | None:
        """Returns the first completed-iteration count ``j > iteration`` that could fire.

        The manager, having just processed ``iteration``, skips calling this trigger until its
        iteration reaches the returned value, then calls it and trusts its answer. :data:`NEVER`
        means the trigger will not fire again; ``None`` means "unpredictable: call me every
        iteration", which is the default.

        Args:
            iteration: The completed-iteration count just processed (0 before training).
            iters_per_epoch: Iterations in one epoch.
        """
        return None

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Returns whether the trigger may fire at ``iteration``, without changing its state.

        Extensions use it to prepare (e.g. gather model state) only when needed. ``True`` is
        the conservative answer for triggers that cannot tell.
        """
        return True

    def state_dict(self) -> dict[str, Any]:
        """Returns the trigger's state (plain Python values) for snapshots."""
        return {}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the state returned by :meth:`state_dict`."""


TriggerFunc: TypeAlias = Callable[["ManagerView"], bool]
"""A plain function trigger: takes the manager view, returns whether to fire."""

TriggerLike: TypeAlias = Trigger | TriggerFunc | tuple[float, str] | None
"""What :func:`get_trigger` accepts."""


class _CallableTrigger(Trigger):
    """Adapts a user callable (or a foreign trigger object) to :class:`Trigger`.

    ``next_check`` is always ``None``: nothing is known about the callable, so it is called
    every iteration. ``may_fire`` and the state methods are forwarded when the object has them
    (e.g. a PPE trigger instance).
    """

    def __init__(self, func: TriggerFunc) -> None:
        self.func = func

    def __call__(self, manager: ManagerView) -> bool:
        return bool(self.func(manager))

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        return bool(getattr(self.func, "may_fire", super().may_fire)(iteration, epoch_length))

    def state_dict(self) -> dict[str, Any]:
        return dict(getattr(self.func, "state_dict", dict)())

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        getattr(self.func, "load_state_dict", super().load_state_dict)(to_load)

    def __repr__(self) -> str:
        return f"get_trigger({self.func!r})"


# Argument checks shared by the trigger modules (time and interval; function and value).


def _positive_number(value: object, wrong_type: str, not_positive: str) -> float:
    """``value`` as a float; raises ``TriggerTypeError(wrong_type)`` unless it is a real
    number, ``ConfigurationError(not_positive)`` unless it is finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TriggerTypeError(wrong_type)
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigurationError(not_positive)
    return number


def check_callable(function: _F, must: str, example: str = "") -> _F:
    """A function argument (a value trigger's ``compare``, ``FunctionTrigger``'s ``fn``);
    raises ``TriggerTypeError`` saying what it ``must`` be unless it is callable."""
    if not callable(function):
        raise TriggerTypeError(f"{must}, got {type(function).__name__} {function!r}{example}")
    return function
