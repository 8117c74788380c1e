"""torch.compile end to end: one way to ask for it (``ppe.to``'s options), refused where it
would be ignored, no graph break from reporting, evaluators or the logics, and compiled training
equal to eager training."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import RuntimeOptionError


class Net(torch.nn.Module):
    """A small MLP that reports from inside ``forward`` (the case that breaks graphs elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.body(x)
        loss = torch.nn.functional.cross_entropy(logits, t)
        accuracy = (logits.argmax(dim=1) == t).float().mean()
        ppe.reporting.report({"inner/accuracy": accuracy})
        return {"loss": loss, "accuracy": accuracy}


def batches(n: int = 6, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {"x": torch.randn(16, 8, generator=g), "t": torch.randint(0, 3, (16,), generator=g)}
        for _ in range(n)
    ]


class Counting:
    """A torch.compile backend that runs the captured graph eagerly and counts the graphs."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


# One way to ask: ppe.to's options --------------------------------------------------------------


@pytest.mark.parametrize("factory", ["trainer", "evaluator"])
def test_compile_in_runtime_options_after_ppe_to_is_refused(factory: str) -> None:
    model = ppe.to(Net(), "cpu")
    with pytest.raises(RuntimeOptionError) as info:
        if factory == "trainer":
            ppe.engine.create_trainer(
                model,
                torch.optim.SGD(model.parameters(), lr=0.1),
                1,
                runtime_options={"compile": True},
            )
        else:
            ppe.engine.create_evaluator(model, runtime_options={"compile": True})
    message = str(info.value)
    assert "'compile' act only when a model is moved" in message
    assert "model 'main' was already moved with ppe.to(model, 'cpu', options={})" in message
    assert "ppe.to(model, 'cpu', options={..., 'compile': True})" in message
    assert model._compiled_call_impl is None  # nothing was half-applied


def test_switching_compile_off_in_runtime_options_is_refused_too() -> None:
    model = ppe.to(Net(), "cpu", options={"compile": {"backend": Counting()}})
    with pytest.raises(RuntimeOptionError, match="'compile' act only when a model is moved"):
        ppe.engine.create_evaluator(model, runtime_options={"compile": False})


def test_the_same_compile_option_in_both_places_compiles_and_trains() -> None:
    backend = Counting()
    options = {"compile": {"backend": backend}}
    model = ppe.to(Net(), "cpu", options=options)
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, runtime_options=options
    )
    assert trainer.handler.entry_runtime is ppe.runtime.get_runtime(model)
    trainer.run(batches(2))
    assert backend.graphs >= 1


def test_other_options_beside_an_equal_compile_still_make_the_trainers_runtime() -> None:
    backend = Counting()
    model = ppe.to(Net(), "cpu", options={"compile": {"backend": backend}})
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        # A process-wide switch, set to what it is: an option the trainer's runtime applies.
        runtime_options={"compile": {"backend": backend}, "num_threads": torch.get_num_threads()},
    )
    assert trainer.handler.entry_runtime is not ppe.runtime.get_runtime(model)
    trainer.run(batches(2))
    assert backend.graphs >= 1  # the model's own compilation still runs


# No graph break ---------------------------------------------------------------------------------


class TwoPassLogic(ppe.handler.Logic):
    """A user logic: two forward passes per step (e.g. a consistency loss), one backward."""

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        model, optimizer = models["main"], optimizers["main"]
        optimizer.zero_grad()
        first = model(**batch)
        second = model(**batch)
        loss = 0.5 * (first["loss"] + second["loss"])
        loss.backward()
        optimizer.step()
        ppe.reporting.report({"train/two_pass": loss.detach()})
        return {"loss": loss}


@pytest.fixture
def dynamo_counters() -> Iterator[Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "logic",
    [None, "closure", TwoPassLogic(), "accumulate"],
    ids=["Logic", "closure", "custom", "accumulate"],
)
def test_reporting_evaluators_and_logics_cause_no_graph_break(
    logic: Any, dynamo_counters: Any
) -> None:
    backend = Counting()
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu", options={"compile": {"backend": backend}})
    options: dict[str, Any] = {}
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if logic == "closure":
        logic = ppe.handler.ClousureLogic()
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
    elif logic == "accumulate":
        logic = None
        options["grad_accumulation_steps"] = 2
    E = ppe.training.extensions
    log = E.LogReport(filename=None)
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        2,
        logic=logic,
        options=options,
        evaluator=ppe.engine.create_evaluator(model),
        extensions=[log, E.PrintReport(["epoch", "val/loss"])],
    )
    trainer.run(batches(4), batches(2, seed=1))
    assert backend.graphs >= 1
    breaks = dict(dynamo_counters["graph_break"])
    assert breaks == {}, f"graph breaks: {breaks}"
    # Training and evaluation share the compiled forward (at most one recompile: train/eval mode
    # or grad mode), and reporting from forward still reached the log.
    assert backend.graphs <= 3
    assert {"inner/accuracy", "val/loss"} <= set(log.log[-1])


# Compiled equals eager --------------------------------------------------------------------------


@pytest.mark.slow
# torch's own inductor import (torch/utils/mkldnn.py) uses a deprecated torch.jit decorator.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_compiled_training_equals_eager_within_rounding() -> None:
    def train(options: dict[str, Any]) -> torch.nn.Module:
        torch.manual_seed(0)
        model = ppe.to(Net(), "cpu", options=options)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        trainer = ppe.engine.create_trainer(
            model, optimizer, 5, evaluator=ppe.engine.create_evaluator(model)
        )
        trainer.run(batches(5), batches(2, seed=1))
        assert trainer.iteration == 25
        return model

    eager = train({})
    torch._dynamo.reset()
    compiled = train({"compile": True})  # the default backend, inductor
    assert compiled._compiled_call_impl is not None
    worst = max(
        (a - b).abs().max().item()
        for a, b in zip(eager.parameters(), compiled.parameters(), strict=True)
    )
    assert worst < 1e-5, worst
