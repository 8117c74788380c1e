"""``CopyStats``: an extension that reports how much data reached the device."""

from __future__ import annotations

from typing import Any

from ppe_core.reporting import report
from ppe_core.training.extension import PRIORITY_WRITER, Extension
from ppe_example_device import _device

__all__ = ["CopyStats"]


class CopyStats(Extension):
    """Report ``exampledev/bytes_copied``: bytes copied onto the device since the last report.

    Runs once per epoch by default, before LogReport collects the epoch's values.

    Args:
        index: The device index to report.
    """

    trigger = (1, "epoch")
    priority = PRIORITY_WRITER

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self._last = 0

    def __call__(self, manager: Any) -> None:
        total = _device.bytes_copied(self.index)
        report({"exampledev/bytes_copied": total - self._last})
        self._last = total
