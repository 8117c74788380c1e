"""The ``Trigger`` base class, the ``next_check`` contract and shared argument checks."""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeAlias

from ppe_core.errors import ConfigurationError, TriggerTypeError

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

NEVER: int = sys.maxsize
"""What :meth:`Trigger.next_check` returns for "this trigger will never fire again"."""

UNITS = ("epoch", "iteration")


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
    if next_check is None:
        return iteration + 1
    due = next_check(iteration, iters_per_epoch)
    if due is None or due <= iteration:
        return iteration + 1
    return min(int(due), NEVER)


# Fractional periods are read as the nearest fraction with at most this denominator, so that
# 0.1 or 1/3 of an epoch mean exactly a tenth or a third despite float rounding.
_MAX_DENOMINATOR = 1_000_000


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


class _NeverTrigger(Trigger):
    """What ``get_trigger(None)`` returns: never fires, never needs a call."""

    def __call__(self, manager: ManagerView) -> bool:
        return False

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        return NEVER

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        return False

    def __repr__(self) -> str:
        return "get_trigger(None)"


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
        method = getattr(self.func, "may_fire", None)
        return True if method is None else bool(method(iteration, epoch_length))

    def state_dict(self) -> dict[str, Any]:
        method = getattr(self.func, "state_dict", None)
        return {} if method is None else dict(method())

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        method = getattr(self.func, "load_state_dict", None)
        if method is not None:
            method(to_load)

    def __repr__(self) -> str:
        return f"get_trigger({self.func!r})"


def check_unit(unit: object, owner: str) -> str:
    """Validates a trigger unit, naming the owner and the accepted values in the error."""
    example = f"e.g. {owner}(1, 'epoch')"
    if not isinstance(unit, str):
        raise TriggerTypeError(
            f"{owner} unit must be the string 'epoch' or 'iteration', got "
            f"{type(unit).__name__} {unit!r}; the arguments are (period, unit), {example}"
        )
    if unit not in UNITS:
        stem = unit.lower().rstrip("s")
        hint = f"; did you mean {stem!r}?" if stem in UNITS else f"; {example}"
        raise ConfigurationError(f"{owner} unit must be 'epoch' or 'iteration', got {unit!r}{hint}")
    return unit


def check_amount(value: object, unit: str, what: str, owner: str) -> Fraction:
    """Validates a positive period or point and returns it as an exact fraction.

    Args:
        value: The user's number.
        unit: The already validated unit; ``'iteration'`` amounts must be whole numbers.
        what: The argument's name for messages (``'period'``, ``'point'``).
        owner: The trigger class name for messages.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TriggerTypeError(
            f"{owner} {what} must be a positive int or float, got {type(value).__name__} "
            f"{value!r}; the arguments are ({what}, unit), e.g. {owner}(1, 'epoch')"
        )
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigurationError(
            f"{owner} {what} must be a finite number > 0, got {value!r}; use e.g. 1 or 0.5"
        )
    if unit == "iteration":
        if not number.is_integer():
            raise ConfigurationError(
                f"{owner} {what} in 'iteration' units must be a whole number, got {value!r}; "
                "round it, or use unit='epoch' for fractions of an epoch"
            )
        return Fraction(int(number))
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    exact = Fraction(number)
    close = exact.limit_denominator(_MAX_DENOMINATOR)
    return close if close > 0 and abs(close - exact) <= exact * Fraction(1, 10**6) else exact


def check_key(key: object, owner: str, what: str = "key") -> str:
    """Validates an observation key such as ``'val/loss'``."""
    if not isinstance(key, str):
        raise TriggerTypeError(
            f"{owner} {what} must be the str name of a reported value such as 'val/loss', "
            f"got {type(key).__name__} {key!r}"
        )
    return key
