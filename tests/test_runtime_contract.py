"""The runtime contract's seams: one runtime per model and device, options given once, the
public grad-scaler hook, and first-party status and device providers read from metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import PluginConflictWarning, PluginLoadWarning, RuntimeNotFoundError
from ppe_core.plugins import PluginHost, PluginSettings


class ConvNet(torch.nn.Module):
    """A small CNN that records the memory format of the images it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append(x.is_contiguous(memory_format=torch.channels_last))
        out = self.conv(x).mean(dim=(1, 2, 3))
        return {"loss": torch.nn.functional.mse_loss(out, t)}


def images(n: int = 2) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(2, 3, 8, 8, generator=g), "t": torch.randn(2, generator=g)}] * n


# One runtime per model and device ----------------------------------------------------------


def test_ppe_to_then_create_trainer_use_one_runtime_with_the_options_given_once() -> None:
    model = ppe.to(ConvNet(), "cpu", options={"channels_last": True})
    runtime = ppe.runtime.get_runtime(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    evaluator = ppe.engine.create_evaluator(model, device="cpu")
    trainer = ppe.engine.create_trainer(model, optimizer, 1, device="cpu", evaluator=evaluator)
    assert trainer.handler.entry_runtime is runtime
    assert evaluator.handler.entry_runtime is runtime
    trainer.run(images(2), images(1))
    assert trainer.handler.runtimes == [runtime]
    # The batch option reached the runtime that converts batches: every image arrived in
    # channels-last memory format, in training and in evaluation.
    assert model.seen == [True, True, True]


def test_ppe_to_again_on_the_same_device_keeps_the_runtime() -> None:
    model = ppe.to(ConvNet(), "cpu")
    runtime = ppe.runtime.get_runtime(model)
    assert ppe.runtime.get_runtime(ppe.to(model, "cpu")) is runtime
    # Other options, another class or another device make a new runtime, as asked.
    other = ppe.runtime.get_runtime(ppe.to(model, "cpu", options={"channels_last": True}))
    assert other is not runtime and other is not None and other.options["channels_last"]
    plain = ppe.to(model, "cpu", runtime_class=ppe.runtime.PyTorchRuntime)
    assert type(ppe.runtime.get_runtime(plain)) is ppe.runtime.PyTorchRuntime


def test_runtime_options_that_differ_from_the_models_make_the_trainers_own_runtime() -> None:
    model = ppe.to(ConvNet(), "cpu", options={"channels_last": True})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # channels_last acts on the model too, so it must equal the model's (else it is refused);
    # num_threads (set to what it is) makes the options differ.
    options = {"channels_last": True, "num_threads": torch.get_num_threads()}
    trainer = ppe.engine.create_trainer(model, optimizer, 1, runtime_options=options)
    assert trainer.handler.entry_runtime is not ppe.runtime.get_runtime(model)
    trainer.run(images(1))
    assert model.seen == [True]  # the trainer's runtime converts the batches


# The public grad-scaler hook ------------------------------------------------------------------


def test_a_device_runtime_sets_its_grad_scaler_through_the_public_hook() -> None:
    from ppe_cpu import CPURuntime

    class ScalingCPURuntime(CPURuntime):
        def __init__(self, device_spec: Any, options: Any = None) -> None:
            super().__init__(device_spec, options)
            if self.grad_scaler is None:
                self.grad_scaler = torch.amp.GradScaler("cpu")

    model = ppe.to(ConvNet(), "cpu", runtime_class=ScalingCPURuntime)
    runtime = ppe.runtime.get_runtime(model)
    assert isinstance(runtime, ScalingCPURuntime)
    scaler = runtime.grad_scaler
    assert scaler is not None and runtime.options["grad_scaler"] is scaler
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    trainer.run(images(1))
    # The Handler offered the runtime's scaler to the Logic, which scaled the loss with it.
    assert trainer.handler.state_dict() == {"grad_scaler": scaler.state_dict()}
    runtime.grad_scaler = None
    assert "grad_scaler" not in runtime.options


# First-party status and device providers from metadata --------------------------------------


def _dist(site: Path, name: str, requires: tuple[str, ...] = (), entry_points: str = "") -> None:
    """An installed distribution's metadata (no code) in ``site``."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"]
    lines += [f"Requires-Dist: {r}\n" for r in requires]
    (info / "METADATA").write_text("".join(lines))
    (info / "entry_points.txt").write_text(entry_points)


def test_first_party_is_what_ppe_cores_metadata_pins_in_an_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    # ppe-core's own metadata (shadowing the installed one) vouches for ppe-npu; ppe-claims
    # declares itself a provider of "cpu" and pins ppe-core, which vouches for nothing.
    _dist(
        site,
        "ppe-core",
        ('ppe-npu==1.0; extra == "npu"', 'pytest>=8; extra == "dev"', "torch>=2.1"),
    )
    _dist(site, "ppe-npu", ("ppe-core==1.0",), "[ppe_core]\nppe_npu = ppe_npu_plugin\n")
    _dist(
        site,
        "ppe-claims",
        ("ppe-core==1.0",),
        "[ppe_core]\nppe_claims = ppe_claims_plugin\n[ppe_core.devices]\ncpu = ppe_claims_plugin\n",
    )
    monkeypatch.syspath_prepend(str(site))
    from ppe_core.plugins import first_party_distributions

    assert first_party_distributions() == {"ppe-core", "ppe-npu"}
    assert {"ppe-core", "ppe-npu"} == ppe.plugins.FIRST_PARTY_DISTRIBUTIONS
    settings = PluginSettings(plugins=("ppe_npu", "ppe_claims"), autoload=False)
    with pytest.warns(PluginLoadWarning) as caught:  # neither has code to import
        host = PluginHost(settings)
    assert len(caught) == 2
    assert host.records["ppe_npu"].first_party
    assert not host.records["ppe_claims"].first_party


def test_a_failed_plugins_declared_device_type_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _dist(
        site,
        "ppe-npu7",
        entry_points="[ppe_core]\nppe_npu7 = ppe_npu7_missing\n[ppe_core.devices]\nnpu7 = x\n",
    )
    monkeypatch.syspath_prepend(str(site))
    with pytest.warns(PluginLoadWarning, match="ppe_npu7"):
        host = PluginHost(PluginSettings(plugins=("ppe_npu7",), autoload=False))
    with pytest.raises(RuntimeNotFoundError) as info:
        host.runtimes.get_runtime_class_for_device_spec("npu7:0")
    message = str(info.value)
    assert "Its plugin plugin 'ppe_npu7'" in message and "ppe-npu7 1.0" in message
    assert "No module named 'ppe_npu7_missing'" in message


def test_a_self_declared_provider_does_not_take_a_first_party_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ppe_cpu

    site = tmp_path / "site"
    _dist(
        site,
        "ppe-claims",
        ("ppe-core==0.1.0",),
        "[ppe_core]\nppe_claims = ppe_claims_plugin\n[ppe_core.devices]\ncpu = ppe_claims_plugin\n",
    )
    module = tmp_path / "code"
    module.mkdir()
    (module / "ppe_claims_plugin.py").write_text(
        "from ppe_core import hookimpl\n"
        "from ppe_core.runtime import PyTorchRuntime\n\n"
        "@hookimpl\n"
        "def ppe_register_runtimes(registry):\n"
        "    registry.register('cpu', PyTorchRuntime, replace=True)\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(module))
    settings = PluginSettings(plugins=("ppe_claims", "ppe_cpu"), autoload=False)
    with pytest.warns(PluginConflictWarning, match="plugin 'ppe_claims' .*runtime 'cpu'"):
        host = PluginHost(settings)
    assert host.runtimes.get("cpu") is ppe_cpu.CPURuntime
