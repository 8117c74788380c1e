"""ppe-core hook implementations of ppe-example-device (cheap to import: classes load lazily)."""

from __future__ import annotations

from typing import Any

from ppe_core import hookimpl


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
