"""Helpers shared by the reporting extensions (LogReport, PrintReport, ProgressBar)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

from ppe_core.errors import ArgumentTypeError, PPEError
from ppe_core.training.triggers import Trigger

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

__all__ = ["EveryIteration", "OptionalDependencyError", "in_notebook", "is_terminal", "key_tuple"]


class OptionalDependencyError(PPEError, ImportError):
    """A feature needs a package that is not installed; the message says what to install."""


class EveryIteration(Trigger):
    """Fires after every iteration, and says so through ``next_check``.

    Cheaper than ``IntervalTrigger(1, 'iteration')`` for extensions that must see every
    observation: the manager's check is a constant ``True``.
    """

    fires_every_iteration = True

    def __call__(self, manager: ManagerView) -> bool:
        return True

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        return iteration + 1

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def is_terminal(out: IO[Any]) -> bool:
    """Whether ``out`` is an interactive terminal (so cursor control is allowed)."""
    isatty = getattr(out, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where tqdm's notebook widget works).

    Only looks at already imported modules, so it never imports IPython itself.
    """
    return "ipykernel.zmqshell" in sys.modules


def key_tuple(keys: object, owner: str, argument: str) -> tuple[str, ...]:
    """``keys`` as a tuple of observation keys, rejecting a bare string.

    A string is iterable, so ``LogReport(keys="loss")`` would otherwise track the keys
    ``"l"``, ``"o"``, ``"s"`` and never report anything.

    Raises:
        ArgumentTypeError: ``keys`` is a string, not iterable, or holds a non-string.
    """
    if isinstance(keys, str):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got the string {keys!r}; wrap it in a "
            f"list: {owner}({argument}=[{keys!r}])"
        )
    if not isinstance(keys, Iterable):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got {type(keys).__name__} {keys!r}"
        )
    result = tuple(keys)
    wrong = [key for key in result if not isinstance(key, str)]
    if wrong:
        raise ArgumentTypeError(
            f"{owner} {argument} must hold observation keys (strings) such as 'train/loss', "
            f"got {wrong!r}"
        )
    return result
