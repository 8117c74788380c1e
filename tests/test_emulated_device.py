"""The emulated device ``ppe_emu``: a real non-CPU device type to PyTorch, bit-equal to the CPU.

The backend can be named once per process and must exist before the process's first backward
pass, so this file enables it when it is collected, for the whole session; what must hold in a
process that never enables it (or enables it too late) runs in a subprocess. The broken
runtimes below pass on the CPU (where a forgotten move is invisible) and fail on the emulated
device, with the kit's messages in runtime-author terms.
"""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist
from ppe_cpu import CPURuntime
from ppe_testing import (
    ConformanceError,
    EmulatedDeviceRuntime,
    EmulatedTensor,
    RuntimeConformance,
    RuntimeTarget,
    check_convert_batch,
    check_grad_scaler_state,
    check_module_move,
    check_snapshot_resume,
    check_training_matches_reference,
    enable_emulated_device,
)

import ppe_core as ppe
from ppe_core.errors import DeviceUnavailableError, EmulatedDeviceError

# Enabled when pytest collects this file, before any test of the session runs a backward pass
# (torch's autograd engine takes no new device type after its first backward).
EMU = enable_emulated_device()


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )


def test_tensors_report_the_device_and_mixing_with_cpu_fails() -> None:
    host = torch.randn(3, 4)
    moved = host.to(EMU)
    assert isinstance(moved, EmulatedTensor) and moved.device == torch.device(EMU, 0)
    assert (moved * 2 + moved).device.type == EMU and torch.equal((moved * 3).cpu(), host * 3)
    assert torch.zeros(2, device=EMU).device.type == EMU  # factories
    assert (moved * torch.tensor(2.0)).device.type == EMU  # a 0-dim CPU tensor is a scalar
    assert torch.zeros_like(moved, device="cpu").device.type == "cpu"
    assert torch.equal(moved.to(torch.float64).cpu(), host.double())
    with pytest.raises(RuntimeError, match=f"at least two devices, {EMU}:0 and cpu"):
        moved + host
    with pytest.raises(RuntimeError, match="at least two devices"):
        torch.nn.Linear(4, 2)(moved)  # a module that was not moved


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.AdamW])
def test_training_on_the_device_is_bit_equal_to_the_cpu(optimizer: Any) -> None:
    cpu_model = _net()
    emu_model = copy.deepcopy(cpu_model).to(EMU)
    assert {p.device.type for p in emu_model.parameters()} == {EMU}
    assert emu_model[1].running_mean.device.type == EMU
    kwargs = {"momentum": 0.9} if optimizer is torch.optim.SGD else {}
    cpu_opt = optimizer(cpu_model.parameters(), lr=0.1, **kwargs)
    emu_opt = optimizer(emu_model.parameters(), lr=0.1, **kwargs)
    for step in range(3):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))
        for model, opt, batch in ((cpu_model, cpu_opt, x), (emu_model, emu_opt, x.to(EMU))):
            opt.zero_grad()
            model(batch).pow(2).mean().backward()
            opt.step()
    expected = cpu_model.state_dict()
    for name, got in emu_model.state_dict().items():
        want = expected[name]
        assert got.device.type == EMU and torch.equal(got.cpu(), want), name
    state = next(iter(emu_opt.state.values()))
    assert {v.device.type for v in state.values() if v.dim() > 0} == {EMU}


def test_save_and_load_honour_map_location() -> None:
    model = _net().to(EMU)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4).to(EMU)).sum().backward()
    opt.step()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    for where, expected in ((None, EMU), ("cpu", "cpu"), ({f"{EMU}:0": "cpu"}, "cpu")):
        buffer.seek(0)
        loaded = torch.load(buffer, map_location=where, weights_only=True)
        assert loaded["model"]["0.weight"].device.type == expected
        assert loaded["opt"]["state"][0]["exp_avg"].device.type == expected
    fresh = _net().to(EMU)
    fresh.load_state_dict(loaded["model"])  # a CPU state_dict loads into the device model
    assert torch.equal(fresh[0].weight.cpu(), model[0].weight.cpu())
    assert fresh[0].weight.device.type == EMU


def test_map_location_onto_the_device_is_refused_with_the_fix_and_indices_remap() -> None:
    enable_emulated_device(device_count=2)  # ppe_emu:0 and ppe_emu:1 for the remap below
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(6.0).to(f"{EMU}:1"), "cpu": torch.ones(2)}, buffer)
    for where in (EMU, f"{EMU}:0", torch.device(EMU, 1)):
        buffer.seek(0)
        with pytest.raises(EmulatedDeviceError, match=r"torch\.load cannot place tensors") as info:
            torch.load(buffer, map_location=where, weights_only=True)
        assert "load with map_location='cpu' and move the result" in str(info.value)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location={f"{EMU}:1": f"{EMU}:0"}, weights_only=True)
    assert loaded["w"].device == torch.device(EMU, 0)
    assert torch.equal(loaded["w"].cpu(), torch.arange(6.0))
    assert loaded["cpu"].device.type == "cpu"
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["w"].device == torch.device(EMU, 1)


def test_dtype_and_layout_changes_after_the_move_train_like_the_cpu() -> None:
    # module.double() and .to(memory_format=...) set .data on the moved parameters: the
    # host data must follow, or the device would keep computing with the old values.
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.Flatten())
    emu_model = copy.deepcopy(cpu_model).to(EMU)
    for model in (cpu_model, emu_model):
        model.double().to(memory_format=torch.channels_last)
    weight = emu_model[0].weight
    assert isinstance(weight, EmulatedTensor) and weight.data_on_host.dtype == torch.float64
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    cpu_model(x).sum().backward()
    emu_model(x.to(EMU)).sum().backward()
    assert torch.equal(weight.grad.cpu(), cpu_model[0].weight.grad)


def test_setting_data_across_cpu_and_the_device_gets_a_clear_error() -> None:
    moved = torch.nn.Linear(2, 2).to(EMU)
    with pytest.raises(EmulatedDeviceError, match=r"cannot set \.data of a tensor on ppe_emu:0"):
        moved.weight.data = torch.zeros(2, 2)
    moved.weight.data = torch.ones(2, 2).to(EMU)  # within the device it swaps
    assert torch.equal(moved.weight.cpu(), torch.ones(2, 2))
    host = torch.nn.Linear(2, 2)
    # The other direction cannot be intercepted (torch checks only the tensor being set):
    # torch's own error, which docs/emulated-device.md lists.
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        host.weight.data = host.weight.data.to(EMU)


def test_a_second_name_in_the_same_process_is_refused() -> None:
    assert enable_emulated_device() == EMU  # idempotent
    with pytest.raises(EmulatedDeviceError, match=f"already enabled as '{EMU}'") as info:
        enable_emulated_device("otherdev")
    assert isinstance(info.value, DeviceUnavailableError)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_nothing_changes_in_a_process_that_does_not_enable_it() -> None:
    result = _python(
        "import torch, ppe_core, ppe_testing\n"
        "assert torch._C._get_privateuse1_backend_name() == 'privateuseone'\n"
        "try:\n    torch.device('ppe_emu')\nexcept RuntimeError:\n    print('unknown')\n"
    )
    assert result.stdout.strip() == "unknown", result.stderr


def test_enabling_it_after_a_backward_pass_gets_a_clear_error() -> None:
    result = _python(
        "import torch\nx = torch.ones(1, requires_grad=True)\n(x * 2).sum().backward()\n"
        "from ppe_testing import enable_emulated_device\nenable_emulated_device()\n"
    )
    assert "EmulatedDeviceError: the emulated device 'ppe_emu' was enabled after" in result.stderr
    assert "def pytest_configure(config): enable_emulated_device()" in result.stderr


def test_training_stays_bit_equal_after_the_thread_count_changes() -> None:
    """autograd's device worker keeps the thread count of its first parallel kernel; the ops
    follow the main thread's (torch.set_num_threads after the first backward, as CPURuntime's
    num_threads option does), so the sums run in the CPU's order."""
    result = _python(
        "import copy, torch\ntorch.set_num_threads(2)\n"
        "from ppe_testing import enable_emulated_device\nEMU = enable_emulated_device()\n"
        "def net():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),"
        " torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
        # autograd's device worker fixes its count at its first parallel kernel (BatchNorm's
        # backward here), while the main thread runs at one thread
        "torch.set_num_threads(1)\nnet().to(EMU)(torch.randn(5, 4).to(EMU)).sum().backward()\n"
        "torch.set_num_threads(2)\ntorch.manual_seed(0)\n"
        "cpu = net()\nemu = copy.deepcopy(cpu).to(EMU)\n"
        "for step in range(3):\n"
        "    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))\n"
        "    for model, batch in ((cpu, x), (emu, x.to(EMU))):\n"
        "        model.zero_grad()\n        model(batch).pow(2).mean().backward()\n"
        "print([torch.equal(a.grad, b.grad.cpu()) for a, b in"
        " zip(cpu.parameters(), emu.parameters(), strict=True)])\n"
    )
    assert result.stdout.strip() == str([True] * 6), result.stdout + result.stderr


def test_a_torch_without_the_hooks_gets_a_clear_error() -> None:
    result = _python(
        "import torch\ntorch.__version__ = '2.1.0'\n"
        "from ppe_testing import enable_emulated_device\nenable_emulated_device()\n"
    )
    assert "EmulatedDeviceError: the emulated device needs torch >= 2.13" in result.stderr
    assert "upgrade torch" in result.stderr


def test_the_benchmark_workload_trains_like_the_cpu_runtime() -> None:
    """The suite's ``emulated`` section compares equal work (nothing here is timed)."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    try:
        import suite
    finally:
        sys.path.pop(0)
    data = suite.batches(6)
    _, on_cpu = suite.trainer(suite.ppe, extensions=False)(data, 2)
    _, on_device = suite.emulated_trainer(data, 2)
    assert {p.device.type for p in on_device.parameters()} == {EMU}
    for name, value in on_cpu.state_dict().items():
        assert torch.equal(on_device.state_dict()[name].cpu(), value), name


# The kit on the emulated device ------------------------------------------------------------
class TestEmulatedDeviceRuntimeConformance(RuntimeConformance):
    """Every check, with tensors on ppe_emu (no tensor_device='cpu')."""

    device = EMU
    runtime_class = EmulatedDeviceRuntime


class TestEmulatedDeviceRuntimeBF16AutocastConformance(RuntimeConformance):
    """bf16 autocast on the device: the tolerances of CPU autocast's conformance class."""

    device = EMU
    runtime_class = EmulatedDeviceRuntime
    options: ClassVar[Mapping[str, Any]] = {"autocast": True}
    atol = rtol = 5e-2


def test_bf16_autocast_is_bit_equal_to_cpu_autocast() -> None:
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(64, 5)
    )
    emu_model = copy.deepcopy(cpu_model).to(EMU)
    x, t = torch.randn(2, 3, 6, 6), torch.tensor([1, 3])
    losses = []
    for model, device in ((emu_model, EMU), (cpu_model, "cpu")):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = model(x.to(device))
            loss = torch.nn.functional.cross_entropy(out, t.to(device))
        assert (out.dtype, loss.dtype) == (torch.bfloat16, torch.float32)  # lists as on the CPU
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == losses[1]
    for got, want in zip(emu_model.parameters(), cpu_model.parameters(), strict=True):
        assert torch.equal(got.grad.cpu(), want.grad)


class MovesOnlyParameters(EmulatedDeviceRuntime):
    """Moves parameters but leaves buffers (BatchNorm statistics, registered buffers) behind."""

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        for sub in module.modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                setattr(sub, name, torch.nn.Parameter(param.detach().to(self.device)))
        return module


class ForgetsNamedtuples(EmulatedDeviceRuntime):
    """Rebuilds dicts, lists and tuples, but returns namedtuples as they came."""

    def convert_batch(self, args: Any) -> Any:
        if isinstance(args, tuple) and hasattr(args, "_fields"):
            return args
        if isinstance(args, dict):
            return {k: self.convert_batch(v) for k, v in args.items()}
        if isinstance(args, (list, tuple)):
            return type(args)(self.convert_batch(v) for v in args)
        return self.move_tensor(args) if isinstance(args, torch.Tensor) else args


def _optimizer_state_to_host(trainer: Any) -> None:
    """The mistake the next runtimes make: the optimizer state's tensors moved to the host."""
    for optimizer in trainer.optimizers.values():
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    state[key] = value.cpu()


class OffloadsOptimizerState(EmulatedDeviceRuntime):
    """Keeps optimizer state in host memory between steps and forgets to bring it back."""

    def train_pre_step(
        self, trainer: Any, module: torch.nn.Module, batch_idx: int, batch: Any
    ) -> None:
        _optimizer_state_to_host(trainer)


class CPUOffloadsOptimizerState(CPURuntime):
    """The same mistake on the CPU, where it is invisible."""

    train_pre_step = OffloadsOptimizerState.train_pre_step


def _fails(check: Any, runtime: type[Any], tmp_path: Path) -> str:
    with pytest.raises(ConformanceError) as info:
        check(RuntimeTarget(EMU, runtime), tmp_path)
    return str(info.value)


def test_buffers_left_behind_fail_module_move_on_the_device(tmp_path: Path) -> None:
    message = _fails(check_module_move, MovesOnlyParameters, tmp_path)
    assert message.startswith(f"move_module left buffer 'scale' on cpu; expected {EMU}")
    assert "move every parameter AND buffer" in message


def test_a_forgotten_namedtuple_field_fails_convert_batch_on_the_device(tmp_path: Path) -> None:
    message = _fails(check_convert_batch, ForgetsNamedtuples, tmp_path)
    assert message.startswith(
        "convert_batch left tensor at batch['pair'].first (a namedtuple field) in a dict batch "
        f"on cpu; expected {EMU}"
    )


def test_optimizer_state_left_on_the_host_fails_training_and_resume(tmp_path: Path) -> None:
    # Invisible on the CPU: the same runtime passes there.
    check_training_matches_reference(RuntimeTarget("cpu", CPUOffloadsOptimizerState), tmp_path)
    for check in (check_training_matches_reference, check_snapshot_resume):
        message = _fails(check, OffloadsOptimizerState, tmp_path / check.__name__)
        assert f"at least two devices, {EMU}:0 and cpu" in message
        assert "optimizer state must stay on the parameters' device" in message


class RestoresOptimizerStateOnTheHost(EmulatedDeviceRuntime):
    """Right in a fresh run, wrong after a snapshot load: at a run's first step it rebuilds
    whatever optimizer state exists (only a restored one) from host copies."""

    def __init__(self, device_spec: Any, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        self.rebuilt = False

    def train_pre_step(
        self, trainer: Any, module: torch.nn.Module, batch_idx: int, batch: Any
    ) -> None:
        if not self.rebuilt:
            self.rebuilt = True
            _optimizer_state_to_host(trainer)


def test_optimizer_state_left_on_the_host_after_a_load_fails_resume(tmp_path: Path) -> None:
    # Straight training never meets the bug: the state is empty at the first step.
    check_training_matches_reference(RuntimeTarget(EMU, RestoresOptimizerStateOnTheHost), tmp_path)
    message = _fails(check_snapshot_resume, RestoresOptimizerStateOnTheHost, tmp_path / "resume")
    assert f"at least two devices, {EMU}:0 and cpu" in message
    assert "optimizer state must stay on the parameters' device" in message


class KeepsItsScalerPrivate(EmulatedDeviceRuntime):
    """Takes the grad_scaler option for itself: ppe-core never sees, uses or saves it."""

    def __init__(self, device_spec: Any, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        self.private_scaler = options.pop("grad_scaler", None)
        super().__init__(device_spec, options)


class ResetsItsScalerWhenARunStarts(EmulatedDeviceRuntime):
    """Puts the scaler back to the state it was created with at a run's first step, so the
    state a snapshot restored is lost."""

    def __init__(self, device_spec: Any, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        scaler = self.grad_scaler
        self.initial_state = None if scaler is None else scaler.state_dict()

    def train_pre_step(
        self, trainer: Any, module: torch.nn.Module, batch_idx: int, batch: Any
    ) -> None:
        if self.grad_scaler is not None and self.initial_state is not None:
            self.grad_scaler.load_state_dict(self.initial_state)
            self.initial_state = None


def test_an_unused_or_reset_grad_scaler_fails_the_kit_on_the_device(tmp_path: Path) -> None:
    check_grad_scaler_state(RuntimeTarget(EMU, EmulatedDeviceRuntime), tmp_path / "ok")
    message = _fails(check_grad_scaler_state, KeepsItsScalerPrivate, tmp_path / "private")
    assert message.startswith("the grad_scaler option was never used")
    assert "runtime.options['grad_scaler']" in message
    message = _fails(check_grad_scaler_state, ResetsItsScalerWhenARunStarts, tmp_path / "reset")
    assert message.startswith("after resuming from a snapshot the GradScaler state is")
    assert "do not replace or reset it" in message


# torch.distributed.checkpoint on the device ------------------------------------------------
def test_a_dcp_snapshot_of_a_model_on_the_device_resumes_it_bit_identically(
    tmp_path: Path,
) -> None:
    # DCP's file writer asks the registered device module for streams (current_stream,
    # stream, wait_stream, synchronize); a device module without them failed every DCP save
    # in a process that had enabled the emulated device, CPU models' saves included.
    E = ppe.training.extensions
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0
    )
    try:
        data = [
            {"x": torch.randn(5, 4, generator=torch.Generator().manual_seed(i))} for i in range(6)
        ]

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = _net()

            def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
                return {"loss": self.net(x).pow(2).mean()}

        def train(epochs: int, out: Path) -> torch.nn.Module:
            torch.manual_seed(0)
            model = ppe.to(Net(), EMU, runtime_class=EmulatedDeviceRuntime)
            opt = torch.optim.AdamW(model.parameters(), lr=0.05)
            trainer = ppe.engine.create_trainer(
                model,
                opt,
                epochs,
                device=EMU,
                out_dir=str(out),
                extensions=[
                    E.snapshot(autoload=True, saver_rank=0, snapshot_mode=E.SnapshotMode.DCP)
                ],
            )
            trainer.run(data)
            return model

        straight = train(2, tmp_path / "straight")
        train(1, tmp_path / "resumed")
        assert (tmp_path / "resumed" / "snapshot_iter_6").is_dir()
        resumed = train(2, tmp_path / "resumed")  # loads snapshot_iter_6, trains epoch 2
        assert {p.device.type for p in resumed.parameters()} == {EMU}
        for name, value in straight.state_dict().items():
            assert torch.equal(resumed.state_dict()[name].cpu(), value.cpu()), name
    finally:
        dist.destroy_process_group()
