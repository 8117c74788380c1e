"""``OnceTrigger``: fires on its first call (and again after a resume, if asked)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ppe_core.training.triggers._base import NEVER, Trigger

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView


class OnceTrigger(Trigger):
    """Fires the first time it is called, i.e. at the first iteration the manager completes.

    Args:
        call_on_resume: Also fire once more after :meth:`load_state_dict` restored a snapshot,
            so an extension can re-initialise itself in the resumed run.

    Attributes:
        call_on_resume: As given.
    """

    def __init__(self, call_on_resume: bool = False) -> None:
        self.call_on_resume = call_on_resume
        self._flag_first = True
        self._flag_resumed = call_on_resume

    @property
    def finished(self) -> bool:
        """Whether the trigger will not fire again (until a resume re-arms it)."""
        return not (self._flag_first or self._flag_resumed)

    def __call__(self, manager: ManagerView) -> bool:
        """Returns ``True`` on the first call (or first after a resume), then ``False``."""
        fire = not self.finished
        self._flag_first = self._flag_resumed = False
        return fire

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        """Returns ``iteration + 1`` while armed, then :data:`NEVER`."""
        return NEVER if self.finished else iteration + 1

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        """Returns whether the next call fires (PPE returned the opposite)."""
        return not self.finished

    def state_dict(self) -> dict[str, Any]:
        """Returns ``{'_flag_first': bool}`` (PPE's key)."""
        return {"_flag_first": self._flag_first}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores whether the first call happened, and re-arms if ``call_on_resume``."""
        self._flag_first = bool(to_load["_flag_first"])
        self._flag_resumed = self.call_on_resume

    def __repr__(self) -> str:
        return f"{type(self).__name__}(call_on_resume={self.call_on_resume!r})"
