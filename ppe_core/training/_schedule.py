"""The schedule of registered extensions: which are due when, and running the due ones."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ppe_core._record import record
from ppe_core.training._extension import ExtensionEntry
from ppe_core.training._manager_checks import unknown_extension_error
from ppe_core.training.triggers import NEVER, next_due

if TYPE_CHECKING:
    from ppe_core.training._extension import Extension
    from ppe_core.training._protocols import ManagerView

__all__ = ["Schedule", "Slot"]


class Slot:
    """A registered extension with the first iteration at which its trigger may fire."""

    __slots__ = ("due", "entry", "every", "name")

    def __init__(self, name: str, entry: ExtensionEntry) -> None:
        self.name = name
        self.entry = entry
        self.due = -1
        self.every = False  # called directly every step (see Schedule.every)


class Schedule:
    """The extensions in invocation order, with each one's next due iteration cached.

    Every trigger tells through ``next_check`` (read by :func:`next_due`) the next iteration
    at which it may fire, so the manager only walks the schedule at :meth:`rebuild`'s or
    :meth:`run_due`'s returned iteration; on the other steps it calls only the
    every-iteration extensions in :attr:`every`. Extensions with ``runs_last`` run after every
    other due trigger of their iteration was consulted.

    Args:
        profile: Record each extension call as PPE's section
            ``ppe.training.ExtensionsManager.run_extensions:<name>`` with
            ``ppe.profiler.record`` (a ``torch.profiler`` range; the every-iteration shortcut
            is then off, so each call is recorded).
        time: Also add each call's duration to the TimeSummary (``enable_profile``).
        trace: Also add each call to the tracer (``enable_trace``).
    """

    def __init__(self, *, profile: bool = False, time: bool = False, trace: bool = False) -> None:
        self._profile = profile
        self._time = time
        self._trace = trace
        #: The entries by name, in registration order.
        self.entries: dict[str, ExtensionEntry] = {}
        self._slots: list[Slot] = []
        #: Extensions called directly on steps where nothing else is due (LogReport
        #: accumulating, ...). The list object never changes, so the manager may keep it.
        self.every: list[Callable[[Any], object]] = []
        #: Whether the schedule must be rebuilt before it is used again.
        self.dirty = True
        #: The first iteration at which an extension declaring ``needs_model_state`` is due.
        self.state_due = -1
        #: False while extensions run in an iteration where no ``needs_model_state`` one is
        #: due: the manager's ``models`` then refuses reads.
        self.model_available = True

    # ----------------------------------------------------------------- registration

    def unique_name(self, name: str, base: str) -> str:
        """``name``, or ``<base>_1``, ``<base>_2``, ... : the first name not registered.

        The manager passes its ``name`` argument as ``base``, as PPE derives the renamed names
        from it.
        """
        names = itertools.chain([name], (f"{base}_{n}" for n in itertools.count(1)))
        return next(unique for unique in names if unique not in self.entries)

    def add(self, name: str, entry: ExtensionEntry) -> None:
        """Registers ``entry`` under the (unused) ``name``, in descending-priority order.

        The caller invalidates the schedule.
        """
        self.entries[name] = entry
        # sorted() is stable: equal priorities keep registration order.
        self._slots = sorted([*self._slots, Slot(name, entry)], key=lambda s: -s.entry.priority)

    def get(self, name: str) -> Extension:
        """The extension registered as ``name``.

        Raises:
            ExtensionNameError: No extension has that name (a ``ValueError``, as in PPE).
        """
        entry = self.entries.get(name)
        if entry is None:
            raise unknown_extension_error(name, self.entries)
        return entry.extension

    def slots(self) -> Iterator[Slot]:
        """The slots in invocation order, over a copy (extensions may register others)."""
        return iter(list(self._slots))

    # ----------------------------------------------------------------- due iterations

    def invalidate(self) -> None:
        """Forces a :meth:`rebuild` before the schedule is used again."""
        self.dirty = True
        self.state_due = -1

    def rebuild(self, iteration: int, iters_per_epoch: int) -> int:
        """Recomputes every due iteration after ``iteration``; returns the earliest one.

        The every-iteration extensions are not counted in the result: :attr:`every` lists
        them.
        """
        state_due = NEVER
        earliest = NEVER
        every: list[Callable[[Any], object]] = []
        for slot in self._slots:
            entry = slot.entry
            due = slot.due = next_due(entry.trigger, iteration, iters_per_epoch)
            slot.every = (
                getattr(entry.trigger, "fires_every_iteration", False) is True
                and not entry.needs_model_state
                and not entry.runs_last
                and not self._profile
            )
            if slot.every:
                every.append(entry.extension)
                continue
            earliest = min(earliest, due)
            if entry.needs_model_state:
                state_due = min(state_due, due)
        self.every[:] = every
        self.state_due = state_due
        self.dirty = False
        return earliest

    def needs_model_state(self, iteration: int, current: int, iters_per_epoch: int) -> bool:
        """Whether a ``needs_model_state`` extension may run at ``iteration``.

        Args:
            iteration: The completed-iteration count asked about.
            current: The manager's current count (the cached answer covers ``current + 1``).
            iters_per_epoch: Iterations in one epoch.
        """
        if not self.dirty and iteration == current + 1:
            return iteration >= self.state_due
        return any(
            entry.needs_model_state
            and next_due(entry.trigger, iteration - 1, iters_per_epoch) <= iteration
            for entry in self.entries.values()
        )

    # ----------------------------------------------------------------- running

    def call(self, manager: ManagerView, slot: Slot) -> None:
        """Runs one extension (inside a profiler range when profiling)."""
        if self._profile:
            tag = f"ppe.training.ExtensionsManager.run_extensions:{slot.name}"
            with record(tag, enable=self._time, trace=self._trace):
                slot.entry.extension(manager)
        else:
            slot.entry.extension(manager)

    def run_every(self, manager: ManagerView, iteration: int) -> None:
        """Calls the every-iteration extensions: the step where nothing else is due."""
        self.model_available = iteration >= self.state_due
        try:
            for extension in self.every:
                extension(manager)
        finally:
            self.model_available = True

    def run_due(self, manager: ManagerView, iteration: int, iters_per_epoch: int) -> int:
        """Runs the extensions whose trigger fires at ``iteration``; returns the next due one.

        ``runs_last`` extensions run after every due trigger was consulted, so the trigger
        states they save already account for this iteration. When an extension changed the
        registrations (:attr:`dirty`), the caller must rebuild before the next step.
        """
        self.model_available = iteration >= self.state_due
        earliest = NEVER
        state_due = NEVER
        deferred: list[Slot] = []
        try:
            for slot in self._slots:
                due = slot.due
                if due <= iteration:
                    trigger = slot.entry.trigger
                    if trigger(manager):
                        if slot.entry.runs_last:
                            deferred.append(slot)
                        else:
                            self.call(manager, slot)
                    due = slot.due = next_due(trigger, iteration, iters_per_epoch)
                if slot.every:
                    continue
                if due < earliest:
                    earliest = due
                if slot.entry.needs_model_state and due < state_due:
                    state_due = due
            for slot in deferred:
                self.call(manager, slot)
        finally:
            self.model_available = True
        if not self.dirty:
            self.state_due = state_due
        return earliest
