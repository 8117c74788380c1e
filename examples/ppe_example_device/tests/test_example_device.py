"""ppe-example-device's tests: ppe-core's conformance kit, then the plugin's own features.

Run after ``pip install -e examples/ppe_example_device``: the tests find the runtime through
the installed ``ppe_core`` entry point, exactly as users' training scripts do.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from ppe_example_device import ExampleDeviceRuntime, bytes_copied, reset_stats
from ppe_testing import RuntimeConformance, enable_emulated_device

import ppe_core as ppe
from ppe_core.errors import ConfigurationError

# The runtime's tensors live on ppe-core's emulated device, which must exist before the test
# process's first backward pass (torch's autograd engine takes no new device type later), so
# it is enabled when pytest collects this file, not when the first runtime is created.
enable_emulated_device()


class TestExampleDeviceConformance(RuntimeConformance):
    """Every check of the kit, on the runtime the entry point registers for ``exampledev``."""

    device = "exampledev"
    tensor_device = "ppe_emu"  # the emulated device ppe-core's testing module provides
    options: ClassVar[Mapping[str, Any]] = {"count_copies": True}


def test_the_entry_point_registers_the_runtime_and_the_extension() -> None:
    names = {ep.name: ep.value for ep in entry_points(group="ppe_core")}
    assert names["ppe_example_device"] == "ppe_example_device.plugin"
    registry = ppe.runtime.runtime_registry
    assert registry.get_runtime_class_for_device_spec("exampledev:1") is ExampleDeviceRuntime
    assert ppe.training.extensions.CopyStats.__module__ == "ppe_example_device._extension"


def test_copy_stats_reports_the_bytes_each_epoch_copied(tmp_path: Path) -> None:
    reset_stats()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)

    class Regression(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.net(x), t)}

    wrapped = ppe.to(Regression(), "exampledev")
    log = ppe.training.extensions.LogReport(filename=None)
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.1),
        2,
        device="exampledev",
        out_dir=str(tmp_path),
        extensions=[ppe.training.extensions.CopyStats(), log],
    )
    batches = [{"x": torch.randn(8, 4), "t": torch.randn(8, 1)} for _ in range(3)]
    trainer.run(batches)
    per_epoch = 3 * (8 * 4 + 8 * 1) * 4  # three float32 batches of x and t
    assert [entry["exampledev/bytes_copied"] for entry in log.log] == [per_epoch, per_epoch]
    assert bytes_copied() == 2 * per_epoch


def test_tensors_live_on_the_emulated_device_and_a_missed_move_fails() -> None:
    runtime = ExampleDeviceRuntime("exampledev", {"count_copies": False})
    model = runtime.move_module(torch.nn.Linear(4, 1))
    batch = runtime.convert_batch({"x": torch.ones(2, 4)})
    assert model.weight.device.type == batch["x"].device.type == "ppe_emu"
    assert model(batch["x"]).device.type == "ppe_emu"
    with pytest.raises(RuntimeError, match="at least two devices, ppe_emu:0 and cpu"):
        model(torch.ones(2, 4))  # a batch the runtime did not convert


def test_counting_can_be_switched_off() -> None:
    reset_stats()
    runtime = ExampleDeviceRuntime("exampledev", {"count_copies": False})
    runtime.convert_batch({"x": torch.ones(4)})
    assert bytes_copied() == 0


@pytest.mark.parametrize(
    ("device", "options", "message"),
    [
        ("exampledev", {"count_copies": "yes"}, "'count_copies' must be bool, got str 'yes'"),
        (
            "exampledev",
            {"count_copie": True},
            r"'count_copie'; accepted options: count_copies \(bool\)",
        ),
        ("exampledev:x", {}, "has no valid index"),
    ],
)
def test_bad_options_and_devices_name_the_problem(
    device: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ExampleDeviceRuntime(device, options)
