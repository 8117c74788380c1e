"""ppe-example-device: an example ppe-core runtime plugin for the simulated device ``exampledev``.

Names load on first access, so ppe-core importing the plugin module at discovery stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppe_example_device._device import bytes_copied, reset_stats
    from ppe_example_device._extension import CopyStats
    from ppe_example_device._runtime import ExampleDeviceRuntime

__all__ = ["CopyStats", "ExampleDeviceRuntime", "bytes_copied", "reset_stats"]

_WHERE = {
    "CopyStats": "ppe_example_device._extension",
    "ExampleDeviceRuntime": "ppe_example_device._runtime",
    "bytes_copied": "ppe_example_device._device",
    "reset_stats": "ppe_example_device._device",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
