"""What extensions that read LogReport's entries share: finding it and a new-entries trigger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ppe_core.errors import ConfigurationError, ExtensionNameError
from ppe_core.training.triggers import Trigger, next_due
from ppe_extensions._log_report import LogReport

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = ["LogReader", "NewEntriesTrigger", "find_log_report"]


class LogReader(Protocol):
    """What :class:`NewEntriesTrigger` asks of the extension it triggers."""

    @property
    def scheduled_log_report(self) -> LogReport | None: ...

    def has_new_entries(self, manager: ManagerView) -> bool: ...


class NewEntriesTrigger(Trigger):
    """Fires when its owner's LogReport has entries the owner has not read yet.

    ``next_check`` forwards the schedule of the LogReport's entry trigger, so the manager
    only consults it at the iterations where an entry can appear: a reader costs nothing on
    the steps in between.
    """

    def __init__(self, owner: LogReader) -> None:
        self._owner = owner

    def __call__(self, manager: ManagerView) -> bool:
        return self._owner.has_new_entries(manager)

    @property
    def fires_every_iteration(self) -> bool:  # type: ignore[override]
        """Whether the LogReport emits an entry at every iteration.

        The manager then calls the owner on its fast path at every step, without consulting
        this trigger, instead of running the slow path (every due trigger, every next due
        iteration) at each step for one reader; the owner reads nothing on a step without a
        new entry. Known once the owner found its LogReport (trackers find it when they
        initialize); until then the trigger is consulted as usual.
        """
        source = self._owner.scheduled_log_report
        return getattr(source and source.entry_trigger, "fires_every_iteration", False) is True

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        source = self._owner.scheduled_log_report
        if source is None:
            return iteration + 1
        return next_due(source.entry_trigger, iteration, iters_per_epoch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def find_log_report(manager: ManagerView, name: str, reader: str) -> LogReport:
    """The LogReport registered as ``name`` in ``manager``, for the extension ``reader``.

    Raises:
        ExtensionNameError: No extension has that name (the message lists the registered
            ones and how to add a LogReport).
        ConfigurationError: The manager cannot look extensions up, or ``name`` is not a
            LogReport.
    """
    get_extension: Any = getattr(manager, "get_extension", None)
    if get_extension is None:
        raise _no_get_extension(name, reader)
    try:
        extension = get_extension(name)
    except ExtensionNameError:
        names = sorted(n for n, _ in getattr(manager, "extensions", ()))
        raise ExtensionNameError(
            f"{reader} reads the log of the LogReport registered as {name!r}, but no "
            f"extension has that name (registered: {names}). Register a LogReport too, e.g. "
            f"extensions=[LogReport(), {reader}(...)], or pass {reader}(log_report='<its name>')."
        ) from None
    if not isinstance(extension, LogReport):
        raise ConfigurationError(
            f"{reader} log_report {name!r} names a {type(extension).__name__}, not a LogReport"
        )
    return extension


def _no_get_extension(name: str, reader: str) -> ConfigurationError:
    return ConfigurationError(
        f"{reader} needs a manager with get_extension() to find the LogReport "
        f"{name!r}; pass the LogReport instance instead"
    )
