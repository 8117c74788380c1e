"""PPE 0.9 Handler and Logic usage, with only the import changed, on real tiny models.

Where it helps, the same scenario runs with ``pytorch_pfn_extras`` and the results are compared.
"""

from __future__ import annotations

import copy
from collections import namedtuple
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe

F = torch.nn.functional


def make_data(n: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    t = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    return [(x[i : i + 4], t[i : i + 4]) for i in range(0, n, 4)]


class TupleRegressor(torch.nn.Module):
    """Returns ``(loss, prediction)``: PPE backpropagates the scalar, key ``"0"``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return F.mse_loss(y, t), y


def hand_sgd(
    model: torch.nn.Module,
    batches: list[Any],
    loss_of: Callable[[torch.nn.Module, Any], torch.Tensor],
    epochs: int = 1,
    lr: float = 0.1,
) -> dict[str, torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for batch in batches:
            optimizer.zero_grad()
            loss_of(model, batch).backward()
            optimizer.step()
    return model.state_dict()


def assert_same_params(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key])


# Outputs and backward_outputs ----------------------------------------------------------------
def test_tuple_outputs_train_like_a_hand_loop_and_like_ppe() -> None:
    import pytorch_pfn_extras

    data = make_data()
    expected = hand_sgd(TupleRegressor(), data, lambda m, b: m(*b)[0])
    results = []
    for lib in (ppe, pytorch_pfn_extras):
        model = TupleRegressor()
        lib.to(model, "cpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        lib.engine.create_trainer(model, optimizer, 1).run(data)
        results.append(model.state_dict())
    assert_same_params(results[0], expected)
    assert_same_params(results[0], results[1])


def test_tuple_outputs_are_reported_by_index() -> None:
    seen: list[dict[str, Any]] = []

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def record(manager: Any) -> None:
        seen.append(dict(manager.observation))

    model = ppe.to(TupleRegressor(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        extensions=[record],
        options={"train_report_keys": ["0"]},
    )
    trainer.run(make_data())
    assert len(seen) == 4
    assert all("train/0" in s and "train/1" not in s for s in seen)


def test_str_backward_outputs_backpropagates_only_that_key() -> None:
    class TwoLosses(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            y = self.fc(x)
            return {"loss": F.mse_loss(y, t), "l1": F.l1_loss(y, t)}

    data = make_data()
    expected = hand_sgd(TwoLosses(), data, lambda m, b: m(*b)["loss"])
    model = ppe.to(TwoLosses(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        options={"backward_outputs": "loss"},
    )
    trainer.run(data)
    assert_same_params(model.state_dict(), expected)
    # Without the option both scalars are backpropagated: the update differs.
    both = ppe.to(TwoLosses(), "cpu")
    ppe.engine.create_trainer(both, torch.optim.SGD(both.parameters(), lr=0.1), 1).run(data)
    assert not torch.equal(both.fc.weight, model.fc.weight)


def test_namedtuple_outputs_are_keyed_by_field() -> None:
    Out = namedtuple("Out", ["loss", "y"])

    class Named(TupleRegressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            loss, y = super().forward(x, t)
            return Out(loss, y)

    logic = ppe.handler.Logic(options={"backward_outputs": ["loss"]})
    model = Named()
    x, t = make_data()[0]
    logic.train_step({"main": model}, {"main": torch.optim.SGD(model.parameters(), 0.1)}, 0, (x, t))
    assert model.fc.weight.grad is not None


# Custom logics -------------------------------------------------------------------------------
class StepInsideLogic(ppe.handler.BaseLogic):
    """PPE's custom-logic pattern: the optimizer steps inside train_step."""

    def train_step(self, models: Any, optimizers: Any, batch_idx: int, batch: Any) -> Any:
        model, optimizer = models["main"], optimizers["main"]
        optimizer.zero_grad()
        loss = F.mse_loss(model.fc(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return {"loss": loss}


def test_custom_logic_stepping_in_train_step_steps_once() -> None:
    data = make_data()
    expected = hand_sgd(TupleRegressor(), data, lambda m, b: m(*b)[0], epochs=2)
    model = ppe.to(TupleRegressor(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps: list[int] = []
    optimizer.register_step_post_hook(lambda *a: steps.append(1))
    ppe.engine.create_trainer(model, optimizer, 2, logic=StepInsideLogic()).run(data)
    assert len(steps) == 8
    assert_same_params(model.state_dict(), expected)


def test_base_logic_train_step_optimizers_does_nothing() -> None:
    model = torch.nn.Linear(3, 1)
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    ppe.handler.BaseLogic().train_step_optimizers({"main": model}, {"main": optimizer}, 0)
    assert_same_params(model.state_dict(), before)


def test_subclass_uses_ppe_helpers_forward_backward_autocast() -> None:
    dtypes: list[torch.dtype] = []

    class Custom(ppe.handler.Logic):
        def train_step(self, models: Any, optimizers: Any, batch_idx: int, batch: Any) -> Any:
            optimizers[self.model_name].zero_grad()
            with self._autocast.autocast():
                outs = self._forward(models[self.model_name], batch)
                dtypes.append(outs[1].dtype)
            self._backward({"loss": outs[0].float()})
            return outs

    model = ppe.to(TupleRegressor(), "cpu")
    logic = Custom(options={"autocast": {"device_type": "cpu", "dtype": torch.bfloat16}})
    ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, logic=logic
    ).run(make_data())
    assert dtypes == [torch.bfloat16] * 4
    assert logic.model_name == "main" and logic.backward_outputs is None


def test_trainer_options_add_to_the_logic_constructor_options() -> None:
    calls: list[torch.Tensor] = []

    def backward(loss: torch.Tensor) -> None:
        calls.append(loss)
        loss.backward()

    logic = ppe.handler.Logic(options={"backward_function": backward})
    model = ppe.to(TupleRegressor(), "cpu")
    ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        logic=logic,
        options={"backward_outputs": ["0"]},
    ).run(make_data())
    assert len(calls) == 4  # the constructor's backward_function survived create_trainer
    assert logic.backward_outputs == ["0"]


# AMP -----------------------------------------------------------------------------------------
def test_autocast_dict_with_device_type_runs_bfloat16_on_cpu() -> None:
    dtypes: list[torch.dtype] = []

    class Probe(TupleRegressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            y = self.fc(x)
            dtypes.append(y.dtype)
            return {"loss": F.mse_loss(y.float(), t)}

    model = ppe.to(Probe(), "cpu")
    before = model.fc.weight.detach().clone()
    options = {"autocast": {"device_type": "cpu", "dtype": torch.bfloat16}}
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        options=options,
        evaluator=ppe.engine.create_evaluator(model, options=options),
    )
    trainer.run(make_data(), make_data(seed=1))
    assert dtypes == [torch.bfloat16] * 8  # 4 training and 4 evaluation steps
    assert not torch.equal(before, model.fc.weight)


def test_autocast_false_and_disabled_dict_run_in_float32() -> None:
    for autocast in (False, {"device_type": "cpu", "enabled": False}):
        logic = ppe.handler.Logic(options={"autocast": autocast})
        model = TupleRegressor()
        outs = logic.eval_step({"main": model}, 0, make_data()[0])
        assert outs[1].dtype == torch.float32


def test_grad_scaler_state_is_in_the_handler_state_dict() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    model = ppe.to(TupleRegressor(), "cpu")
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, options={"grad_scaler": scaler}
    )
    trainer.run(make_data())
    state = trainer.handler.state_dict()
    assert state == {"grad_scaler": scaler.state_dict()}
    assert state["grad_scaler"]["scale"] == 8.0

    other = torch.amp.GradScaler("cpu", init_scale=2.0)
    logic = ppe.handler.Logic(options={"grad_scaler": other})
    handler = ppe.handler.Handler(logic, ppe.runtime.PyTorchRuntime("cpu", {}), {})
    handler.load_state_dict(state)
    assert other.get_scale() == 8.0
    assert logic.state_dict()["grad_scaler"]["scale"] == 8.0


def test_handler_state_dict_is_empty_without_a_grad_scaler() -> None:
    model = ppe.to(TupleRegressor(), "cpu")
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    assert trainer.handler.state_dict() == {}
    assert ppe.handler.Logic().state_dict() == {}
    trainer.handler.load_state_dict({})


def test_grad_scaler_in_runtime_options_is_accepted_and_saved() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    model = ppe.to(TupleRegressor(), "cpu")
    before = model.fc.weight.detach().clone()
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        runtime_options={"grad_scaler": scaler, "autocast": False},
    )
    trainer.run(make_data())
    assert not torch.equal(before, model.fc.weight)
    assert trainer.handler.state_dict() == {"grad_scaler": scaler.state_dict()}


def test_torch_autocast_is_a_no_op_on_a_cpu_only_setup() -> None:
    with ppe.handler.torch_autocast():
        y = torch.nn.Linear(2, 2)(torch.ones(1, 2))
    assert y.dtype == torch.float32


# Closure optimizers --------------------------------------------------------------------------
def test_clousure_logic_with_lbfgs_equals_a_hand_written_loop() -> None:
    data = make_data()

    def lbfgs(model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)

    expected = TupleRegressor()
    optimizer = lbfgs(expected)
    for x, t in data:

        def closure(x: torch.Tensor = x, t: torch.Tensor = t) -> torch.Tensor:
            optimizer.zero_grad()
            loss = expected(x, t)[0]
            loss.backward()
            return loss

        optimizer.step(closure)  # type: ignore[no-untyped-call]

    model = ppe.to(TupleRegressor(), "cpu")
    seen: list[dict[str, Any]] = []

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def record(manager: Any) -> None:
        seen.append(dict(manager.observation))

    trainer = ppe.engine.create_trainer(
        model, lbfgs(model), 1, logic=ppe.handler.ClousureLogic(), extensions=[record]
    )
    trainer.run(data)
    assert_same_params(model.state_dict(), expected.state_dict())
    assert len(seen) == 4 and all("train/0" in s for s in seen)


def test_clousure_logic_matches_ppe() -> None:
    import pytorch_pfn_extras

    class LossOnly(TupleRegressor):  # PPE's ClousureLogic takes a single output
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            return super().forward(x, t)[0]

    results = []
    for lib in (ppe, pytorch_pfn_extras):
        model = LossOnly()
        lib.to(model, "cpu")
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
        lib.engine.create_trainer(
            model, optimizer, 2, logic=lib.handler.ClousureLogic(options={"backward_outputs": "0"})
        ).run(make_data())
        results.append(model.state_dict())
    assert_same_params(results[0], results[1])


def test_clousure_logic_rejects_a_grad_scaler() -> None:
    with pytest.raises(RuntimeError, match="grad_scaler"):
        ppe.handler.ClousureLogic(options={"grad_scaler": torch.amp.GradScaler("cpu")})


# Handler subclasses ----------------------------------------------------------------------------
class RecordingHandler(ppe.handler.Handler):
    calls: list[tuple[str, int, Any, Any]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = []

    def train_post_step(self, trainer: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        self.calls.append(("train", batch_idx, batch, outputs))
        super().train_post_step(trainer, batch_idx, batch, outputs)

    def eval_post_step(self, evaluator: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        self.calls.append(("eval", batch_idx, batch, outputs))
        super().eval_post_step(evaluator, batch_idx, batch, outputs)


def test_handler_subclass_post_steps_are_called_with_ppe_arguments() -> None:
    seen: list[dict[str, Any]] = []

    @ppe.training.make_extension(trigger=(1, "epoch"))
    def record(manager: Any) -> None:
        seen.append(dict(manager.observation))

    model = ppe.to(TupleRegressor(), "cpu")
    evaluator = ppe.engine.create_evaluator(
        model, handler_class=RecordingHandler, options={"eval_report_keys": ["0"]}
    )
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        2,
        evaluator=evaluator,
        handler_class=RecordingHandler,
        extensions=[record],
        options={"train_report_keys": ["0"]},
    )
    data, val = make_data(), make_data(n=8, seed=1)
    trainer.run(data, val)
    train_calls = trainer.handler.calls  # type: ignore[attr-defined]
    eval_calls = evaluator.handler.calls  # type: ignore[attr-defined]
    assert [c[1] for c in train_calls] == [0, 1, 2, 3] * 2
    assert [c[1] for c in eval_calls] == [0, 1] * 2
    assert {c[0] for c in train_calls} == {"train"} and {c[0] for c in eval_calls} == {"eval"}
    assert train_calls[1][2] is data[1]  # the loader's batch, as PPE passes it
    assert isinstance(train_calls[0][3], tuple) and train_calls[0][3][0].ndim == 0
    # The super() calls kept the default reporting.
    assert "train/0" in seen[-1] and "val/0" in seen[-1]


def test_handler_train_step_with_complete_fn_calls_it_once() -> None:
    model = ppe.to(TupleRegressor(), "cpu")

    trainerish = SimpleNamespace(
        models={"main": model},
        optimizers={"main": torch.optim.SGD(model.parameters(), lr=0.1)},
        epoch=0,
    )

    handler = RecordingHandler(ppe.handler.Logic(), ppe.runtime.PyTorchRuntime("cpu", {}), {})
    completed: list[tuple[int, Any]] = []
    batch = make_data()[0]
    handler.train_step(trainerish, 3, batch, complete_fn=lambda i, o: completed.append((i, o)))
    assert len(completed) == 1 and completed[0][0] == 3
    assert handler.calls == []  # with complete_fn, the caller runs the post-step (as PPE)
    handler.train_post_step(trainerish, 3, batch, completed[0][1])
    assert [c[:2] for c in handler.calls] == [("train", 3)]


def test_handler_default_post_step_reports_the_report_keys() -> None:
    handler = ppe.handler.Handler(
        ppe.handler.Logic(), ppe.runtime.PyTorchRuntime("cpu", {}), {"eval_report_keys": ["out"]}
    )

    evaluatorish = SimpleNamespace(models={"main": ppe.to(torch.nn.Linear(1, 1), "cpu")})

    reporter = ppe.reporting.Reporter()
    with reporter:
        handler.eval_post_step(evaluatorish, 0, None, {"out": 2.0, "other": 1.0})
    assert reporter.observation == {"val/out": 2.0}


def test_handler_runs_its_runtime_callbacks_outside_a_run() -> None:
    events: list[str] = []

    class Recording(ppe.runtime.PyTorchRuntime):
        def initialize_module(self, module: Any, loader: Any, optimizer: Any = None) -> None:
            events.append(f"initialize:{type(optimizer).__name__}")

        def train_cleanup(self, module: Any) -> None:
            events.append("train_cleanup")

        def train_validation_begin(self, module: Any) -> None:
            events.append("train_validation_begin")

    model = torch.nn.Linear(1, 1)
    ppe.to(model, "cpu", runtime_class=Recording)

    trainerish = SimpleNamespace(
        models={"main": model},
        optimizers={"main": torch.optim.SGD(model.parameters(), lr=0.1)},
        epoch=0,
    )

    handler = ppe.handler.Handler(ppe.handler.Logic(), Recording("cpu", {}), {})
    handler.train_cleanup(trainerish)
    handler.train_validation_begin(None, trainerish)
    handler.train_setup(trainerish, [])
    assert events == ["train_cleanup", "train_validation_begin", "initialize:SGD"]
    assert model.training  # train_setup put it in train mode


def test_model_in_eval_mode_after_training_as_in_ppe() -> None:
    import pytorch_pfn_extras

    modes = []
    for lib in (ppe, pytorch_pfn_extras):
        model = TupleRegressor()
        lib.to(model, "cpu")
        lib.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1).run(
            DataLoader(make_data(), batch_size=None)
        )
        modes.append(model.training)
    assert modes == [False, False]


# What the Handler reads of a Logic goes through public methods ------------------------------
class _SteppingLogic(ppe.handler.BaseLogic):
    """A PPE-style BaseLogic subclass: it steps in train_step and keeps a ``_grad_scaler``."""

    def __init__(self, scaler: torch.amp.GradScaler | None = None) -> None:
        super().__init__()
        self.model_name = "second"
        self._grad_scaler = scaler
        self.bound: list[str] = []

    def bind_device(self, device_type: str) -> None:
        self.bound.append(device_type)

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        optimizers["second"].zero_grad()
        loss = models["second"](*batch)[0]
        loss.backward()
        optimizers["second"].step()
        return {"loss": loss}


def test_handler_binds_the_device_of_the_logics_own_model() -> None:
    first, second = TupleRegressor(), TupleRegressor()
    ppe.to(first, "cpu", runtime_class=ppe.runtime.PyTorchRuntime)
    ppe.to(second, "meta")  # the logic's model: its runtime decides the device type
    logic = _SteppingLogic()
    handler = ppe.handler.Handler(logic, ppe.runtime.PyTorchRuntime("cpu"), {})
    trainerish = SimpleNamespace(models={"first": first, "second": second}, optimizers={})
    handler.train_setup(trainerish, [])
    assert logic.bound == ["meta"]


def test_logic_autocast_is_bound_through_bind_device() -> None:
    logic = ppe.handler.Logic(options={"autocast": {"dtype": torch.bfloat16}})
    logic.bind_device("cpu")
    with logic._autocast.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert torch.is_autocast_enabled("cpu")
    pinned = ppe.handler.Logic(options={"autocast": {"device_type": "cpu"}})
    pinned.bind_device("meta")  # an explicit device_type option wins
    assert pinned.get_grad_scaler() is None
    with pinned._autocast.autocast():
        assert torch.is_autocast_enabled("cpu")


def test_a_ppe_style_logics_grad_scaler_state_is_saved_by_the_handler() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    models = {"second": ppe.to(TupleRegressor(), "cpu")}
    optimizers = {"second": torch.optim.SGD(models["second"].parameters(), lr=0.1)}
    trainer = ppe.engine.create_trainer(models, optimizers, 1, logic=_SteppingLogic(scaler))
    trainer.run(make_data())
    assert trainer.handler.state_dict()["grad_scaler"]["scale"] == 8.0
    assert ppe.handler.Logic().get_grad_scaler() is None
    assert type(trainer.handler.entry_runtime).__name__ == "CPURuntime"  # device="cpu"
