"""Runtimes: batch conversion, tagging, the generic runtime and the first-party plugins."""

from __future__ import annotations

import collections
import subprocess
import sys
from typing import Any, ClassVar, NamedTuple

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import ConfigurationError
from ppe_core.runtime import BaseRuntime, PyTorchRuntime, get_runtime, iter_runtime_modules

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Pair(NamedTuple):
    a: torch.Tensor
    b: list[torch.Tensor]


def test_convert_batch_moves_nested_structures_and_keeps_types() -> None:
    runtime = PyTorchRuntime("meta")
    batch = {
        "x": torch.ones(2),
        "pair": Pair(torch.zeros(1), [torch.ones(3), "label"]),
        "ordered": collections.OrderedDict(t=torch.ones(1)),
        "tuple": (torch.ones(1), 3),
        "text": "unchanged",
    }
    out = runtime.convert_batch(batch)
    assert out["x"].device.type == "meta"
    assert isinstance(out["pair"], Pair)
    assert out["pair"].a.device.type == "meta" and out["pair"].b[0].device.type == "meta"
    assert out["pair"].b[1] == "label"
    assert isinstance(out["ordered"], collections.OrderedDict)
    assert isinstance(out["tuple"], tuple) and out["tuple"][1] == 3
    assert out["text"] == "unchanged"
    assert batch["x"].device.type == "cpu"  # the input is not modified


def test_base_runtime_rejects_unknown_options_and_lists_accepted() -> None:
    class Opt(PyTorchRuntime):
        accepted_options = frozenset({"fast"})

    Opt("cpu", {"fast": True})
    with pytest.raises(ConfigurationError, match=r"'slow'.*accepted options: fast"):
        Opt("cpu", {"slow": True})


def test_base_runtime_requires_data_movement_methods() -> None:
    runtime = BaseRuntime("cpu")
    with pytest.raises(NotImplementedError, match="move_module"):
        runtime.move_module(torch.nn.Linear(1, 1))
    with pytest.raises(NotImplementedError, match="move_tensor"):
        runtime.convert_batch({"x": torch.ones(1)})
    assert runtime.convert_batch({"n": 3}) == {"n": 3}  # nothing to move: no call
    with runtime.trace("step", None):
        pass


def test_undeclared_options_reach_the_runtime_as_in_ppe() -> None:
    class Loose(PyTorchRuntime):  # declares no accepted_options of its own
        pass

    assert Loose("cpu", {"anything": 1}).options == {"anything": 1}
    assert BaseRuntime("cpu", {"x": 2}).options == {"x": 2}
    with pytest.raises(ConfigurationError, match="accepted options: autocast, grad_scaler"):
        PyTorchRuntime("cpu", {"pin_memory": True})


def test_to_moves_tensors_without_tagging() -> None:
    t = ppe.to(torch.ones(2), "meta")
    assert t.device.type == "meta"
    with pytest.raises(TypeError, match=r"torch\.nn\.Module or torch\.Tensor"):
        ppe.to([torch.ones(1)], "cpu")  # type: ignore[call-overload]


def test_to_with_explicit_runtime_class_and_options() -> None:
    class Mine(PyTorchRuntime):
        accepted_options = frozenset({"tag"})

    model = ppe.to(torch.nn.Linear(2, 2), "cpu", runtime_class=Mine, options={"tag": 1})
    runtime = get_runtime(model)
    assert isinstance(runtime, Mine) and runtime.options == {"tag": 1}


def test_iter_runtime_modules_yields_top_most_tag_per_branch() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert list(iter_runtime_modules(model)) == []
    ppe.to(model, "cpu")
    (top,) = list(iter_runtime_modules(model))
    assert top[0] == "" and top[1] is model
    ppe.to(model[1], "meta")  # a branch moved elsewhere gets its own runtime
    found = [(name, type(rt).__name__) for name, _, rt in iter_runtime_modules(model)]
    assert found == [("", "CPURuntime"), ("1", "PyTorchRuntime")]


def test_cpu_runtime_is_registered_and_checks_its_device() -> None:
    from ppe_cpu import CPURuntime

    assert ppe.runtime.runtime_registry.get_runtime_class_for_device_spec("cpu") is CPURuntime
    with pytest.raises(ValueError, match="'cpu' devices"):
        CPURuntime("meta")
    model = ppe.to(torch.nn.Linear(2, 2), "cpu")
    assert isinstance(get_runtime(model), CPURuntime)


def test_cuda_plugin_registers_without_touching_the_driver() -> None:
    code = (
        "import torch, ppe_core as ppe\n"
        "cls = ppe.runtime.runtime_registry.get_runtime_class_for_device_spec('cuda:0')\n"
        "print(cls.__name__, torch.cuda.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["CUDARuntime", "False"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_runtime_without_cuda_explains_why_and_what_to_do() -> None:
    from ppe_cuda import CUDAUnavailableError

    with pytest.raises(CUDAUnavailableError, match=r"device='cpu'") as info:
        ppe.to(torch.nn.Linear(2, 2), "cuda")
    assert "cuda" in str(info.value)


@pytest.mark.gpu
@cuda
def test_cuda_runtime_moves_modules_and_batches() -> None:
    model = ppe.to(torch.nn.Linear(2, 2), "cuda:0")
    assert model.weight.device.type == "cuda"
    runtime: Any = get_runtime(model)
    batch = runtime.convert_batch({"x": torch.ones(2)})
    assert batch["x"].device.type == "cuda"


@pytest.mark.gpu
@cuda
def test_cuda_runtime_rejects_a_missing_device_index() -> None:
    from ppe_cuda import CUDAUnavailableError

    with pytest.raises(CUDAUnavailableError, match="does not exist"):
        ppe.to(torch.nn.Linear(2, 2), f"cuda:{torch.cuda.device_count()}")


def test_to_auto_uses_the_default_device_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = ppe.to(torch.nn.Linear(2, 2), "auto")
    assert type(get_runtime(model)).__name__ == "CPURuntime"


# The runtime contract: each method is called where its docstring says -----------------------
class _Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def _batches(n: int) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [{"x": torch.randn(4, 3), "t": torch.randn(4, 1)} for _ in range(n)]


class Recording(PyTorchRuntime):
    """Records the contract calls the framework makes (instances share ``calls``)."""

    accepted_options = None
    calls: ClassVar[list[tuple[Any, ...]]] = []

    def initialize_module(self, module: Any, loader_or_batch: Any, optimizer: Any = None) -> None:
        self.calls.append(("initialize_module", module, loader_or_batch, optimizer))

    def execute(self, code_block: Any, batch: Any) -> Any:
        self.calls.append(("execute", len(code_block.optimizers), code_block.backprop))
        return super().execute(code_block, batch)

    def map(self, func: Any, iterable: Any, out_keys: Any = None, device: Any = "cpu") -> Any:
        self.calls.append(("map", out_keys))
        return super().map(func, iterable, out_keys, device)

    @classmethod
    def trace(cls, event_name: str | None, arg: Any) -> Any:
        cls.calls.append(("trace", event_name, arg))
        return super().trace(event_name, arg)


@pytest.fixture
def recording() -> Any:
    Recording.calls = []
    return Recording


def _kinds(calls: list[tuple[Any, ...]]) -> list[str]:
    return [call[0] for call in calls]


def test_initialize_module_gets_each_modules_loader_and_optimizer(recording: Any) -> None:
    gen, dis = _Regressor(), _Regressor()
    ppe.to(gen, "cpu", runtime_class=recording)
    ppe.to(dis, "cpu", runtime_class=recording)
    optimizers = {
        "gen": torch.optim.SGD(gen.parameters(), lr=0.1),
        "dis": torch.optim.Adam(dis.parameters()),
    }
    train, val = _batches(2), _batches(1)
    evaluator = ppe.engine.create_evaluator(
        {"gen": gen, "dis": dis}, logic=ppe.handler.Logic(model_name="gen")
    )
    trainer = ppe.engine.create_trainer(
        {"gen": gen, "dis": dis},
        optimizers,
        1,
        evaluator=evaluator,
        logic=ppe.handler.Logic(model_name="gen"),
    )
    trainer.run(train, val)
    inits = [c[1:] for c in recording.calls if c[0] == "initialize_module"]
    assert [(m, loader, opt) for m, loader, opt in inits[:2]] == [
        (gen, train, optimizers["gen"]),
        (dis, train, optimizers["dis"]),
    ]
    # The evaluator's first run initialises its modules with the validation loader, no optimizer.
    assert inits[2:] == [(gen, val, None), (dis, val, None)]


def test_initialize_module_gets_the_only_optimizer_for_a_submodule(recording: Any) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), _Regressor())
    ppe.to(model[1], "cpu", runtime_class=recording)  # only a branch is tagged
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            return self.net[1](self.net[0](x), t)  # type: ignore[no-any-return]

    ppe.engine.create_trainer(Wrapper(), optimizer, 1).run(_batches(1))
    (init,) = [c for c in recording.calls if c[0] == "initialize_module"]
    assert init[1] is model[1] and init[3] is optimizer


def test_execute_runs_every_code_block_step_of_trainer_and_evaluator(recording: Any) -> None:
    model = ppe.to(_Regressor(), "cpu", runtime_class=recording)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.fc.weight.detach().clone()
    evaluator = ppe.engine.create_evaluator(model, logic="codeblock")
    trainer = ppe.engine.create_trainer(model, optimizer, 1, evaluator=evaluator, logic="codeblock")
    trainer.run(_batches(3), _batches(2))
    executed = [c[1:] for c in recording.calls if c[0] == "execute"]
    # Three training steps (one optimizer, backward), then two forward-only evaluation steps.
    assert executed == [(1, True)] * 3 + [(0, False)] * 2
    assert not torch.equal(before, model.fc.weight)  # the runtime's execute stepped it


def test_the_default_logic_runs_steps_itself_without_execute(recording: Any) -> None:
    model = ppe.to(_Regressor(), "cpu", runtime_class=recording)
    ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1).run(
        _batches(2)
    )
    assert _kinds(recording.calls) == ["initialize_module"]


def test_ppe_map_goes_through_the_runtimes_map_and_execute(recording: Any) -> None:
    model = ppe.to(_Regressor(), "cpu", runtime_class=recording)
    outputs = list(ppe.map(model, _batches(2), out_keys={"loss"}))
    assert [sorted(out) for out in outputs] == [["loss"], ["loss"]]
    assert recording.calls == [("map", {"loss"}), ("execute", 0, False), ("execute", 0, False)]


def test_profiled_training_and_record_enter_the_device_runtimes_trace(recording: Any) -> None:
    from ppe_core.testing import plugin_host

    class Plugin:
        @ppe.hookimpl
        def ppe_register_runtimes(self, registry: Any) -> None:
            registry.register("cpu", recording)

    with plugin_host(Plugin()):
        with ppe.profiler.record("by_hand", device="cpu:0"):
            pass
        model = ppe.to(_Regressor(), "cpu")
        trainer = ppe.engine.create_trainer(
            model, torch.optim.SGD(model.parameters(), lr=0.1), 1, enable_profile=True
        )
        trainer.run(_batches(2))
    traced = [c[1:] for c in recording.calls if c[0] == "trace"]
    assert traced[0] == ("by_hand", None)
    assert traced.count(("ppe.training.Trainer:train_step", None)) == 2


def test_record_uses_a_torch_profiler_range_for_the_generic_runtimes() -> None:
    with torch.profiler.profile() as prof, ppe.profiler.record("ppe_core_generic_region"):
        torch.ones(1).add_(1)
    assert "ppe_core_generic_region" in {event.name for event in prof.events()}


def test_resolve_runtime_is_shared_by_to_and_the_factories(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppe_core.plugins import resolve_runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # "auto" is the CPU here
    runtime = resolve_runtime("auto")
    assert type(runtime).__name__ == "CPURuntime" and runtime.device_spec == "cpu"
    mine = resolve_runtime("cpu", {"tag": 1}, Recording)
    assert isinstance(mine, Recording) and mine.options == {"tag": 1}
    with pytest.raises(TypeError, match="runtime_class must be a subclass"):
        resolve_runtime("cpu", runtime_class=Recording("cpu"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="runtime_class must be a subclass"):
        ppe.to(torch.nn.Linear(1, 1), "cpu", runtime_class=object)  # type: ignore[arg-type]
    model = ppe.to(_Regressor(), "auto")
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    assert type(trainer.handler.entry_runtime) is type(get_runtime(model))


def test_default_logic_scales_losses_with_the_runtime_options_grad_scaler() -> None:
    # A runtime that owns a GradScaler (ppe_cuda creates one for fp16 autocast) needs no
    # trainer option: the default Logic adopts it, and the handler saves its state.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    model = ppe.to(_Regressor(), "cpu", options={"grad_scaler": scaler})
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.01), 1, device="cpu"
    )
    trainer.run(_batches(3))
    assert scaler._scale is not None  # scale() was called: the loss went through the scaler
    saved = trainer.state_dict()["_ppe_core"]["handler"]["grad_scaler"]
    assert saved["scale"] == scaler.get_scale()  # the runtime's scaler is what is snapshotted


def test_explicit_grad_scaler_option_wins_over_the_runtimes() -> None:
    runtime_scaler = torch.amp.GradScaler("cpu")
    own = torch.amp.GradScaler("cpu", init_scale=2.0**3)
    model = ppe.to(_Regressor(), "cpu", options={"grad_scaler": runtime_scaler})
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        1,
        device="cpu",
        options={"grad_scaler": own},
    )
    trainer.run(_batches(2))
    assert own._scale is not None and runtime_scaler._scale is None
