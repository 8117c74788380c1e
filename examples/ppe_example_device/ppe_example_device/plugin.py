"""ppe-core hook implementations of ppe-example-device (cheap to import: classes load lazily)."""

from __future__ import annotations

from typing import Any

from ppe_core import hookimpl

#: The ppe-core hook API these hooks were written for: a ppe-core without it skips the plugin
#: with a PluginLoadWarning naming both versions, instead of failing inside a hook.
PPE_CORE_HOOK_API = (1, 0)


@hookimpl
def ppe_register_runtimes(registry: Any) -> None:
    """``device="exampledev"`` (and ``"exampledev:N"``) uses :class:`ExampleDeviceRuntime`."""
    from ppe_example_device._runtime import ExampleDeviceRuntime

    registry.register("exampledev", ExampleDeviceRuntime)


@hookimpl
def ppe_register_extensions(registry: Any) -> None:
    """``ppe_core.training.extensions.CopyStats`` becomes available."""
    from ppe_example_device._extension import CopyStats

    registry.register("CopyStats", CopyStats)


@hookimpl
def ppe_environment_info() -> list[str]:
    """A line for ``python -m ppe_core info``."""
    return ["exampledev: simulated device in host memory (ppe-example-device)"]
