"""``TimelineTrace``: writes the events of a ``ppe.profiler`` tracer as a timeline file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ppe_core.training.extension import Extension
from ppe_core.training.triggers import DueCheck, Trigger, TriggerLike, get_trigger
from ppe_core.writing import WriterLike

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = ["TimelineTrace"]


class TimelineTrace(Extension):
    """Flushes the profiler's tracer (Chrome trace format by default) to a file.

    Sections are recorded with ``ppe.profiler.record(...)`` and friends into the tracer;
    this extension runs every iteration, turns tracing on or off when ``enable`` or
    ``disable`` fires (from the next iteration on, since extensions run at the end of one),
    and writes the collected events when ``trigger`` fires and when training ends. Open the
    file in ``chrome://tracing`` or Perfetto.

    Args:
        trigger: When to write the trace; once per epoch by default.
        filename: File under the output directory; ``'chrome_trace.json'`` when None.
        enable: Trigger that turns tracing on; tracing keeps the tracer's state when None.
        disable: Trigger that turns tracing off.
        tracer: The tracer to flush; the process's global one (``ppe.profiler.get_tracer()``)
            when None.
        writer: Writer to save through instead of the manager's.
    """

    def __init__(
        self,
        trigger: TriggerLike = (1, "epoch"),
        filename: str | os.PathLike[str] | None = None,
        enable: TriggerLike = None,
        disable: TriggerLike = None,
        tracer: Any = None,
        *,
        writer: WriterLike | None = None,
    ) -> None:
        if tracer is None:
            from ppe_core.profiler import get_tracer

            tracer = get_tracer()
        self._tracer = tracer
        self._enable: Trigger | None = None if enable is None else get_trigger(enable)
        self._disable: Trigger | None = None if disable is None else get_trigger(disable)
        self._trigger = get_trigger(trigger)
        self._due = DueCheck(self._trigger)
        # A Path names the file its str form does.
        self._filename = "chrome_trace.json" if filename is None else os.fspath(filename)
        self._writer = writer

    def _chosen_writer(self, manager: ManagerView) -> Any:
        writer = self._writer if self._writer is not None else getattr(manager, "writer", None)
        if writer is None:
            from ppe_core.writing import SimpleWriter

            writer = self._writer = SimpleWriter(out_dir=manager.out)
        return writer

    def initialize(self, manager: ManagerView) -> None:
        """Lets the tracer start its file (e.g. the opening bracket of an appended trace)."""
        self._tracer.initialize_writer(self._filename, self._chosen_writer(manager))

    def __call__(self, manager: ManagerView) -> None:
        """Applies ``enable``/``disable``; writes the trace when ``trigger`` fires."""
        if self._enable is not None and self._enable(manager):
            self._tracer.enable(True)
        if self._disable is not None and self._disable(manager):
            self._tracer.enable(False)
        if not manager.is_before_training and self._due(manager):
            self._tracer.flush(self._filename, self._chosen_writer(manager))

    def finalize(self, manager: ManagerView) -> None:
        """Writes the remaining events and finalizes the tracer (and a given writer)."""
        self._tracer.flush(self._filename, self._chosen_writer(manager))
        if self._writer is not None:
            self._writer.finalize()
        self._tracer.finalize()

    def state_dict(self) -> dict[str, Any]:
        """Returns the trigger's and the tracer's state (PPE's ``_trigger``/``_tracer``)."""
        return {"_trigger": self._trigger.state_dict(), "_tracer": self._tracer.state_dict()}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output."""
        if to_load.get("_trigger") is not None:
            self._trigger.load_state_dict(to_load["_trigger"])
        self._tracer.load_state_dict(dict(to_load["_tracer"]))
