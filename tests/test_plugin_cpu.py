"""ppe_cpu: the CPU runtime's options (autocast, num_threads, channels_last, compile), its
environment lines, and the runtime conformance kit."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from ppe_cpu import CPU_OPTIONS, CPURuntime
from ppe_testing import RuntimeConformance
from torch.utils.data import DataLoader, TensorDataset

import ppe_core as ppe
from ppe_core.errors import RuntimeOptionError
from ppe_core.runtime import BaseRuntime, RuntimeOptionTypeError, get_runtime


# The example's model and data (examples/quickstart.py), small -------------------------------
class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(y, t)}


class DictDataset(TensorDataset):
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x, t = super().__getitem__(index)
        return {"x": x, "t": t}


def make_loader(n: int = 256, seed: int = 0) -> DataLoader[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    t = ((x[:, 0] + x[:, 1] * x[:, 2]) > 0).long()
    return DataLoader(DictDataset(x, t), batch_size=32, shuffle=False)


def epoch_losses(options: dict[str, Any], epochs: int = 4) -> list[float]:
    torch.manual_seed(0)
    model = ppe.to(Model(), "cpu", options=options)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    log = ppe.training.extensions.LogReport(trigger=(1, "epoch"), filename=None)
    trainer = ppe.engine.create_trainer(
        model, optimizer, epochs, extensions=[log], runtime_options=options
    )
    trainer.run(make_loader(128))
    return [float(entry["train/loss"]) for entry in log.log]


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# autocast -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_bf16_autocast_trains_the_example_model_close_to_fp32() -> None:
    fp32 = epoch_losses({})
    bf16 = epoch_losses({"autocast": True})
    # Tolerance: each epoch's mean loss within 0.01 (absolute) of fp32's (measured: < 1e-3);
    # bf16 keeps ~3 significant digits, so the curves differ by rounding, not by learning.
    assert bf16 == pytest.approx(fp32, abs=0.01)
    assert bf16 != fp32  # it really ran in bfloat16
    assert bf16[-1] < 0.8 * bf16[0]  # and it learned


def test_autocast_runs_the_forward_in_bf16_whichever_way_the_module_is_called() -> None:
    model = ppe.to(torch.nn.Linear(4, 2), "cpu", options={"autocast": True})
    assert model(torch.ones(1, 4)).dtype == torch.bfloat16
    runtime = get_runtime(model)
    assert isinstance(runtime, CPURuntime)
    assert runtime.autocast == {"device_type": "cpu", "dtype": torch.bfloat16}
    # the dict form the core's code-block path (PyTorchRuntime.execute) uses
    assert runtime.options["autocast"] == {"device_type": "cpu", "dtype": torch.bfloat16}
    with torch.no_grad():
        assert model(torch.ones(1, 4)).dtype == torch.bfloat16


def test_autocast_accepts_a_dtype_or_a_dict_and_off_restores_fp32() -> None:
    model = ppe.to(torch.nn.Linear(4, 2), "cpu", options={"autocast": torch.float16})
    assert model(torch.ones(1, 4)).dtype == torch.float16
    ppe.to(model, "cpu", options={"autocast": {"enabled": False}})
    assert model(torch.ones(1, 4)).dtype == torch.float32


class DtypeRecorder(Model):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.net(x)
        self.seen.append(y.dtype)
        return {"loss": torch.nn.functional.cross_entropy(y.float(), t)}


def test_autocast_applies_to_code_blocks_executed_by_the_runtime() -> None:
    model = ppe.to(DtypeRecorder(), "cpu")  # the module itself is not autocast
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    block = ppe.handler.update_parameters(model, [optimizer])
    before = model.net[0].weight.detach().clone()
    CPURuntime("cpu", {"autocast": True}).execute(block, next(iter(make_loader(32))))
    assert model.seen == [torch.bfloat16]
    assert not torch.equal(before, model.net[0].weight)


# num_threads --------------------------------------------------------------------------------
def test_num_threads_is_set_when_the_runtime_is_created(restore_threads: None) -> None:
    torch.set_num_threads(2)
    CPURuntime("cpu", {"num_threads": 1})
    assert torch.get_num_threads() == 1
    CPURuntime("cpu")  # absent: torch's setting is left alone
    assert torch.get_num_threads() == 1


def test_importing_and_registering_ppe_cpu_changes_no_threads_and_imports_no_dynamo() -> None:
    code = (
        "import sys, torch; torch.set_num_threads(1)\n"
        "import ppe_core as ppe, ppe_cpu\n"
        "ppe.runtime.runtime_registry.get_runtime_class_for_device_spec('cpu')\n"
        "m = ppe.to(torch.nn.Linear(2, 2), 'cpu', options={'channels_last': True})\n"
        "print(torch.get_num_threads(), 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False"]


# channels_last ------------------------------------------------------------------------------
class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.conv(x).relu().mean(dim=(2, 3))
        return {"loss": torch.nn.functional.mse_loss(self.head(y), t)}


def conv_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [{"x": torch.randn(4, 3, 6, 6, generator=g), "t": torch.randn(4, 1, generator=g)}]


class Images(NamedTuple):
    x: torch.Tensor
    meta: list[torch.Tensor]


def test_channels_last_converts_the_module_and_4d_batch_tensors() -> None:
    model = ppe.to(ConvNet(), "cpu", options={"channels_last": True})
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.conv.weight.is_contiguous()
    runtime = get_runtime(model)
    assert runtime is not None
    batch = runtime.convert_batch(
        {"a": torch.ones(2, 3, 4, 4), "n": Images(torch.ones(1, 3, 2, 2), [torch.ones(3)])}
    )
    assert batch["a"].is_contiguous(memory_format=torch.channels_last)
    assert isinstance(batch["n"], Images)
    assert batch["n"].x.is_contiguous(memory_format=torch.channels_last)
    assert batch["n"].meta[0].shape == (3,)
    moved = ppe.to(torch.ones(1, 2, 3, 3), "cpu", options={"channels_last": True})
    assert moved.is_contiguous(memory_format=torch.channels_last)


def test_a_model_tagged_with_options_survives_torch_save_and_deepcopy() -> None:
    model = ppe.to(ConvNet(), "cpu", options={"channels_last": True, "autocast": True})
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for copied in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        runtime = get_runtime(copied)
        assert isinstance(runtime, CPURuntime) and runtime is not get_runtime(model)
        batch = runtime.convert_batch([torch.ones(1, 3, 4, 4)])
        assert batch[0].is_contiguous(memory_format=torch.channels_last)
        assert copied.conv(torch.ones(1, 3, 4, 4)).dtype == torch.float32
        assert copied.forward.module is copied  # the autocast forward follows the copy


def test_default_cpu_runtime_keeps_the_inline_batch_conversion() -> None:
    runtime = CPURuntime("cpu")
    assert "convert_batch" not in vars(runtime) and "move_tensor" not in vars(runtime)
    assert runtime.convert_batch({"x": torch.ones(1, 3, 2, 2)})["x"].is_contiguous()


def train_conv(options: dict[str, Any]) -> tuple[torch.nn.Module, float]:
    torch.manual_seed(0)
    model = ppe.to(ConvNet(), "cpu", options=options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ppe.engine.create_trainer(model, optimizer, 3, runtime_options=options)
    trainer.run(conv_batches())
    with torch.no_grad():
        loss = model(**conv_batches()[0])["loss"]
    return model, float(loss)


def test_channels_last_training_matches_contiguous_training() -> None:
    plain, plain_loss = train_conv({})
    fast, fast_loss = train_conv({"channels_last": True})
    assert fast.conv.weight.is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(plain.parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert fast_loss == pytest.approx(plain_loss, abs=1e-5)


# compile -------------------------------------------------------------------------------------
class CountingBackend:
    """A torch.compile backend that runs the captured graph eagerly and counts compilations."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


def test_compile_option_compiles_in_place_and_keeps_state_dict_keys(tmp_path: Path) -> None:
    backend = CountingBackend()
    torch.manual_seed(0)
    model = ppe.to(Model(), "cpu", options={"compile": {"backend": backend}})
    reference = Model()
    assert sorted(model.state_dict()) == sorted(reference.state_dict())
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    snapshot = ppe.training.extensions.snapshot(filename="snap")
    trainer = ppe.engine.create_trainer(
        model, optimizer, 1, extensions=[snapshot], out_dir=str(tmp_path)
    )
    trainer.run(make_loader(64))
    assert backend.graphs >= 1  # the forward went through torch.compile
    # The snapshot loads into an uncompiled model.
    state = torch.load(tmp_path / "snap", weights_only=False)
    plain = Model()
    plain.load_state_dict(state["models"]["main"])
    torch.testing.assert_close(plain.net[0].weight, model.net[0].weight)


def test_compiled_training_matches_eager_training() -> None:
    def run(options: dict[str, Any]) -> torch.nn.Module:
        torch.manual_seed(0)
        model = ppe.to(Model(), "cpu", options=options)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ppe.engine.create_trainer(model, optimizer, 1).run(make_loader(64))
        return model

    eager = run({})
    compiled = run({"compile": {"backend": "eager"}, "autocast": False})
    for a, b in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_compile_and_autocast_together_trace_the_autocast_forward() -> None:
    backend = CountingBackend()
    model = ppe.to(
        torch.nn.Linear(4, 2), "cpu", options={"autocast": True, "compile": {"backend": backend}}
    )
    out = model(torch.ones(3, 4))
    assert out.dtype == torch.bfloat16 and backend.graphs == 1
    out.float().sum().backward()
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float32


def test_cpu_runtime_adds_no_per_step_callbacks() -> None:
    # The Handler calls a runtime's step callbacks only when its class overrides them.
    for name in ("train_pre_step", "train_post_step", "eval_pre_step", "eval_post_step"):
        assert getattr(CPURuntime, name) is getattr(BaseRuntime, name)


def test_compile_rejects_arguments_torch_compile_does_not_take() -> None:
    with pytest.raises(RuntimeOptionTypeError, match=r"torch\.compile does not take"):
        ppe.to(Model(), "cpu", options={"compile": {"bogus": 1}})


# validation ---------------------------------------------------------------------------------
def test_unknown_cpu_option_lists_the_accepted_ones() -> None:
    with pytest.raises(RuntimeOptionError, match="'non_blocking'") as info:
        ppe.to(Model(), "cpu", options={"non_blocking": True})
    for name in ("autocast", "grad_scaler", "num_threads", "channels_last", "compile"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("options", "wanted"),
    [
        ({"num_threads": 1.5}, "must be int"),
        ({"channels_last": "yes"}, "must be bool"),
        ({"compile": "inductor"}, "must be bool or dict"),
        ({"autocast": "bf16"}, "must be bool, torch.dtype or dict"),
        ({"grad_scaler": object()}, "must be torch.amp.GradScaler"),
    ],
)
def test_wrong_cpu_option_types_name_the_type_wanted(options: dict[str, Any], wanted: str) -> None:
    with pytest.raises(TypeError, match=wanted):
        CPURuntime("cpu", options)


def test_spec_and_accepted_options_agree() -> None:
    assert CPURuntime.accepted_options == CPU_OPTIONS.names
    assert {s.name for s in CPU_OPTIONS} == set(CPU_OPTIONS.names)
    assert all(s.doc for s in CPU_OPTIONS)


# environment lines ----------------------------------------------------------------------------
def test_environment_info_names_versions_cores_and_threads() -> None:
    import ppe_cpu.plugin

    lines = ppe_cpu.plugin.ppe_environment_info()
    assert all(line.startswith("cpu: ") for line in lines)
    text = "\n".join(lines)
    assert f"torch {torch.__version__}" in text and "ppe-cpu" in text
    assert f"torch uses {torch.get_num_threads()} intra-op" in text
    assert "logical cores" in text


# the conformance kit -------------------------------------------------------------------------
class TestCPURuntimeConformance(RuntimeConformance):
    device = "cpu"
    runtime_class = CPURuntime


class TestCPURuntimeChannelsLastConformance(RuntimeConformance):
    device = "cpu"
    runtime_class = CPURuntime
    options = {"channels_last": True}  # noqa: RUF012
    skip_checks = frozenset({"snapshot_resume"})  # the default class above covers it
