"""PPE 0.9 runtime and code-block API, used as a PPE script would (only the import changed)."""

from __future__ import annotations

import collections
import copy
from typing import Any, NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe
from ppe_core.errors import ConfigurationError


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t), "y": self.fc(x)}


def regressor(seed: int = 0) -> Regressor:
    torch.manual_seed(seed)
    return Regressor()


def batches(n: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [{"x": torch.randn(2, 3, generator=g), "t": torch.randn(2, 1, generator=g)}] * n


def hand_trained(model: torch.nn.Module, data: list[dict[str, torch.Tensor]]) -> torch.nn.Module:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in data:
        opt.zero_grad()
        model(**batch)["loss"].backward()
        opt.step()
    return model


def same_params(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.allclose(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


class MoveOnly(ppe.runtime.BaseRuntime):
    """A third-party runtime in PPE style: only the data movement, counting moved tensors."""

    moved = 0

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to("cpu")

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        MoveOnly.moved += 1
        return tensor.to("cpu")


# BaseRuntime defaults ---------------------------------------------------------------------------
def test_runtime_with_only_move_methods_trains_with_create_trainer() -> None:
    ppe.runtime.runtime_registry.register("mydev", MoveOnly)
    model = regressor()
    expected = hand_trained(copy.deepcopy(model), batches())
    ppe.to(model, "mydev")
    MoveOnly.moved = 0
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, device="mydev"
    )
    trainer.run(batches())
    assert same_params(model, expected)
    assert MoveOnly.moved == 2 * 4  # convert_batch moved x and t of each batch


class Pair(NamedTuple):
    a: torch.Tensor
    b: Any


def test_default_convert_batch_maps_move_tensor_over_nested_batches() -> None:
    class ToMeta(ppe.runtime.BaseRuntime):
        def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to("meta")

    runtime = ToMeta("meta", {})
    out = runtime.convert_batch(
        {
            "x": torch.ones(1),
            "nested": [torch.ones(1), (torch.ones(1), "label")],
            "pair": Pair(torch.ones(1), {"deep": torch.ones(1)}),
            "ordered": collections.OrderedDict(t=torch.ones(1)),
            "n": 3,
        }
    )
    assert out["x"].is_meta and out["nested"][0].is_meta and out["nested"][1][0].is_meta
    assert isinstance(out["nested"][1], tuple) and out["nested"][1][1] == "label"
    assert isinstance(out["pair"], Pair) and out["pair"].a.is_meta and out["pair"].b["deep"].is_meta
    assert isinstance(out["ordered"], collections.OrderedDict) and out["ordered"]["t"].is_meta
    assert out["n"] == 3
    assert runtime.convert_batch(torch.ones(1)).is_meta
    assert runtime._convert_batch_dict({"x": torch.ones(1), "n": 1})["x"].is_meta  # PPE helper
    marker = object()
    assert runtime.convert_batch(marker) is marker
    # Where PPE moves a tensor, ppe-core moves it too (PPE stops at the first level).
    import pytorch_pfn_extras as real_ppe

    class RealToMeta(real_ppe.runtime.BaseRuntime):
        def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to("meta")

    for batch in ({"x": torch.ones(1), "n": 1}, [torch.ones(1), 2], Pair(torch.ones(1), 1)):
        theirs, ours = RealToMeta("meta", {}).convert_batch(batch), runtime.convert_batch(batch)
        items = zip(
            theirs.values() if isinstance(theirs, dict) else theirs,
            ours.values() if isinstance(ours, dict) else ours,
            strict=True,
        )
        for t, o in items:
            assert type(t) is type(o) and (not isinstance(t, torch.Tensor) or o.is_meta)


def test_step_callbacks_default_to_no_ops_and_trace_is_a_context_manager() -> None:
    runtime = MoveOnly("cpu", {})
    module = torch.nn.Linear(1, 1)
    runtime.initialize_module(module, None)
    runtime.train_epoch_begin(module)
    runtime.train_pre_step(None, module, 0, {})
    runtime.train_post_step(None, module, 0, {}, {})
    runtime.eval_pre_step(None, module, 0, {})
    runtime.eval_post_step(None, module, 0, {}, {})
    runtime.train_validation_begin(module)
    runtime.train_validation_end(module)
    runtime.train_epoch_end(module)
    runtime.train_cleanup(module)
    assert runtime.device_spec == "cpu" and runtime.options == {}
    with ppe.runtime.BaseRuntime.trace("event", None):
        pass
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with (
        torch.profiler.profile(activities=cpu) as prof,
        ppe.runtime.PyTorchRuntime.trace("ppe_core_traced_region", None),
    ):
        torch.ones(2) + 1
    assert "ppe_core_traced_region" in {e.key for e in prof.key_averages()}


# ppe.to ------------------------------------------------------------------------------------
class Recording(ppe.runtime.BaseRuntime):
    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module


def test_to_passes_options_and_the_older_config_to_the_runtime() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    ppe.to(model[1], "dummy", runtime_class=Recording, options={"opt": 1})
    runtime = ppe.runtime._runtime._module_runtime_tag(model[1])
    assert isinstance(runtime, Recording) and runtime.options["opt"] == 1
    assert runtime.device_spec == "dummy"
    assert ppe.runtime._runtime._module_runtime_tag(model[0]) is None
    ppe.to(model, "dummy", runtime_class=Recording, config={"opt": 2})
    assert ppe.runtime.get_runtime(model).options == {"opt": 2}  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="both options= and config="):
        ppe.to(model, "dummy", runtime_class=Recording, options={}, config={})
    with pytest.raises(ValueError):
        ppe.to(object(), "cpu")  # type: ignore[call-overload]


def test_named_runtime_modules_follows_ppe() -> None:
    def split() -> torch.nn.Module:
        module = torch.nn.Module()
        module.layer1 = torch.nn.Linear(2, 2)
        module.layer2 = ppe.to(torch.nn.Linear(2, 2), "dummy", runtime_class=Recording)
        return module

    named = ppe.runtime._runtime.named_runtime_modules
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert list(named(plain)) == []
    inner = split()
    assert list(named(inner)) == [("layer2", inner.layer2)]
    outer = torch.nn.Module()
    outer.a, outer.b = split(), split()
    assert list(named(outer)) == [("layer2", outer.a.layer2), ("layer2", outer.b.layer2)]
    assert list(named(outer, recursive=False)) == []


# Runtime registry --------------------------------------------------------------------------
def test_registering_over_a_device_type_replaces_it_with_a_warning() -> None:
    registry = ppe.runtime.runtime_registry
    original = registry.get_runtime_class_for_device_spec("cpu")

    class MyCPURuntime(ppe.runtime.PyTorchRuntime):
        pass

    with pytest.warns(ppe.runtime.RuntimeReplacedWarning) as record:
        registry.register("cpu", MyCPURuntime)
    message = str(record[0].message)
    assert "MyCPURuntime" in message and original.__qualname__ in message
    assert registry.get_runtime_class_for_device_spec(torch.device("cpu")) is MyCPURuntime
    assert type(ppe.runtime.get_runtime(ppe.to(torch.nn.Linear(1, 1), "cpu"))) is MyCPURuntime
    registry.register("cpu", MyCPURuntime)  # the same class again: no warning, no change
    registry.unregister("cpu")
    assert registry.get_runtime_class_for_device_spec("cpu") is original
    registry.register("cpu", MyCPURuntime, replace=True)  # on purpose: no warning
    assert registry.entries()["cpu"].registrant.plugin == f"<code in module {__name__}>"


def test_ppe_style_private_registry_falls_back() -> None:
    class Fallback(ppe.runtime.BaseRuntime):
        pass

    registry = ppe.runtime._registry._RuntimeRegistry(Fallback)
    registry.register("dummy_device", ppe.runtime.PyTorchRuntime)
    assert (
        registry.get_runtime_class_for_device_spec("dummy_device:0") is ppe.runtime.PyTorchRuntime
    )
    assert registry.get_runtime_class_for_device_spec("unknown") is Fallback


# Code blocks -------------------------------------------------------------------------------
def test_update_parameters_step_equals_a_hand_written_step() -> None:
    data = batches(3)
    expected = hand_trained(regressor(), data)
    model = ppe.to(regressor(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in data:
        out = ppe.handler.update_parameters(model, [opt], backprop_from="loss")(batch)
    assert same_params(model, expected)
    assert set(out) == {"loss", "y"}
    # The same step with PPE itself lands on the same weights.
    import pytorch_pfn_extras as real_ppe

    theirs = real_ppe.to(regressor(), "cpu")
    real_opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for batch in data:
        real_ppe.handler.update_parameters(theirs, [real_opt], "loss")(batch)
    assert same_params(model, theirs)


def test_forward_block_and_code_block_state() -> None:
    model = ppe.to(regressor(), "cpu")
    block = ppe.handler.forward(model)
    assert isinstance(block, ppe.handler.CodeBlock) and not block.backprop
    assert block.runtime is ppe.runtime.get_runtime(model)
    batch = batches(1)[0]
    torch.testing.assert_close(block(batch)["loss"], model(**batch)["loss"])
    block.state["counter"] = 3
    block.state["opt"] = torch.optim.SGD(model.parameters(), lr=0.5)
    saved = block.state_dict()
    assert saved["counter"] == 3 and saved["opt"]["param_groups"][0]["lr"] == 0.5
    saved["opt"]["param_groups"][0]["lr"] = 0.25
    block.load_state_dict({**saved, "new": 1})
    assert block.state["opt"].param_groups[0]["lr"] == 0.25 and block.state["new"] == 1


def test_code_block_misuse_is_explained() -> None:
    with pytest.raises(RuntimeError, match=r"ppe\.to\(model, device\)"):
        ppe.handler.forward(regressor())
    model = ppe.to(regressor(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="already updates parameters"):
        ppe.handler.update_parameters(ppe.handler.update_parameters(model, [opt]), [opt])
    with torch.no_grad(), pytest.raises(ValueError, match="nothing to backpropagate"):
        ppe.handler.update_parameters(model, [opt])(batches(1)[0])
    with pytest.raises(ValueError, match="'missing'"):
        ppe.handler.update_parameters(model, [opt], "missing")(batches(1)[0])


def test_code_block_logic_trains_like_the_default_logic() -> None:
    data = batches()
    expected = hand_trained(regressor(), data)
    for logic in (ppe.handler.CodeBlockLogic(), "codeblock"):
        model = ppe.to(regressor(), "cpu")
        trainer = ppe.engine.create_trainer(
            model, torch.optim.SGD(model.parameters(), lr=0.1), 1, logic=logic
        )
        trainer.run(data)
        assert same_params(model, expected)
    evaluator = ppe.engine.create_evaluator(model, logic=ppe.handler.CodeBlockLogic())
    evaluator.run(DataLoader(data, batch_size=None))
    with pytest.raises(ConfigurationError, match="one output key"):
        ppe.handler.CodeBlockLogic(options={"backward_outputs": ["a", "b"]})


def test_runtime_autocast_and_grad_scaler_options_apply_to_code_blocks() -> None:
    class Matmul(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            y = self.fc(x)
            return {"y": y, "loss": y.float().pow(2).mean()}

    model = ppe.to(Matmul(), "cpu", options={"autocast": {"dtype": torch.bfloat16}})
    assert ppe.handler.forward(model)({"x": torch.ones(2, 3)})["y"].dtype == torch.bfloat16
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    model = ppe.to(regressor(), "cpu", options={"grad_scaler": scaler})
    expected = hand_trained(regressor(), batches(1))
    ppe.handler.update_parameters(model, [torch.optim.SGD(model.parameters(), lr=0.1)], "loss")(
        batches(1)[0]
    )
    assert same_params(model, expected)  # the scale is undone before the step
    with pytest.raises(RuntimeError, match=r"torch\.amp\.GradScaler"):
        ppe.to(regressor(), "cpu", options={"grad_scaler": object()})


# ppe.map and ppe.compile ----------------------------------------------------------------------
class Doubler(torch.nn.Module):
    def output(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": x * 2, "z": x + 1}


def test_map_applies_a_module_method_lazily_through_its_runtime() -> None:
    module = ppe.to(torch.nn.Sequential(Doubler()), "cpu")
    data = [{"x": torch.ones(1)}, {"x": torch.ones(2)}]
    out = list(ppe.map(module[0].output, data))
    assert len(out) == 2 and set(out[1]) == {"y", "z"}
    torch.testing.assert_close(out[1]["y"], torch.full((2,), 2.0))
    only_y = list(ppe.map(module[0].output, data, out_keys={"y"}))
    assert [set(o) for o in only_y] == [{"y"}, {"y"}]
    import pytorch_pfn_extras as real_ppe

    theirs = real_ppe.to(torch.nn.Sequential(Doubler()), "cpu")
    for t, o in zip(real_ppe.map(theirs[0].output, data), out, strict=True):
        assert t.keys() == o.keys() and all(torch.equal(t[k], o[k]) for k in t)


def test_compile_with_an_optimizer_runs_a_whole_training_step() -> None:
    class Summed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x).sum() * 5.0

    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(4)
    eager, compiled = Summed(), Summed()
    compiled.load_state_dict(eager.state_dict())
    opt = torch.optim.SGD(eager.parameters(), lr=0.5, momentum=0.01)
    opt.zero_grad()
    y = eager(x)
    y.backward()
    opt.step()
    step = ppe.compile(compiled, torch.optim.SGD(compiled.parameters(), lr=0.5, momentum=0.01))
    torch.testing.assert_close(step(x), y)
    assert same_params(eager, compiled)
    step(x)
    assert not same_params(eager, compiled)
    with pytest.raises(ValueError, match="generate_backward=False"):
        ppe.compile(compiled, torch.optim.SGD(compiled.parameters()), generate_backward=False)
