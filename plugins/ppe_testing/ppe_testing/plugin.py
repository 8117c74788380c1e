"""ppe-core hook implementations of ppe-testing (cheap: neither the kit nor the device loads).

The kit registers no runtime: the emulated device is opt-in (``enable_emulated_device``) and
its runtime is passed as ``runtime_class``, so installing ppe-testing changes no device
resolution. The plugin only reports itself in ``python -m ppe_core info``.
"""

from __future__ import annotations

import sys

from ppe_core import hookimpl

# The ppe-core hook API this plugin was written for (checked when the plugin registers).
PPE_CORE_HOOK_API = (1, 0)


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "(not installed, imported from source)"


@hookimpl
def ppe_environment_info() -> list[str]:
    """The kit's version, and the emulated device's name once a process enabled it."""
    # Read only if already imported: reporting must not load the device module.
    emulated = sys.modules.get("ppe_testing._emulated")
    name = emulated.emulated_device_type() if emulated is not None else None
    return [
        f"testing: ppe-testing {_distribution_version('ppe-testing')}, emulated device "
        + (f"enabled as {name!r}" if name else "not enabled")
    ]
