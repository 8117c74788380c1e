"""Issue 22, moves 1 and 2: reporting owns the reporter stack, and one step protocol.

The Trainer and the Evaluator drive every handler the same way: one call per step that runs the
whole step, post-step included (``ppe.handler.step_function`` adapts PPE-style handlers once at
setup); the manager and the evaluators open and close reporter scopes through the public
``Reporter.push``/``pop``; the single-model logics share ``ModelLogic``; one model validator.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe
from ppe_core.errors import ArgumentTypeError
from ppe_core.handler import BaseHandler, CodeBlockLogic, Handler, Logic
from ppe_core.reporting import DictSummary, Reporter, Summary, get_current_reporter, report

PACKAGE = Path(ppe.__file__).parent


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def make_loader(n: int = 16, seed: int = 0) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    t = (x[:, 0] > 0).long()
    return DataLoader([{"x": x[i], "t": t[i]} for i in range(n)], batch_size=8)  # type: ignore[arg-type]


def recorder(trigger: tuple[int, str]) -> tuple[Any, list[dict[str, Any]]]:
    """An extension that keeps a copy of the manager's observation on ``trigger``, and them."""
    seen: list[dict[str, Any]] = []

    @ppe.training.make_extension(trigger=trigger, priority=ppe.training.PRIORITY_READER)
    def record(manager: Any) -> None:
        seen.append(dict(manager.observation))

    return record, seen


# Move 1: the reporter stack ----------------------------------------------------------------
def test_reporter_push_makes_it_current_and_pop_restores_the_previous_one() -> None:
    outer, inner = Reporter(), Reporter()
    first: dict[str, Any] = {}
    with outer.scope(first):
        observation: dict[str, Any] = {}
        previous = inner.push(observation)
        assert get_current_reporter() is inner and inner.observation is observation
        report({"a": 1.0})
        inner.pop(previous)
        assert get_current_reporter() is outer and inner.observation is previous
        report({"b": 2.0})
    assert observation == {"a": 1.0} and first == {"b": 2.0}
    with pytest.raises(IndexError, match="no Reporter is current"):
        get_current_reporter()


def test_summary_add_tensor_is_the_fast_path_of_add() -> None:
    values = [torch.tensor(v) for v in (0.5, 1.5, -2.0, 4.25)] * 100  # > one fold of 256
    fast, checked = Summary(), Summary()
    for value in values:
        fast.add_tensor(value)
        checked.add(value)
    fast_mean, checked_mean = fast.compute_mean(), checked.compute_mean()
    assert torch.equal(torch.as_tensor(fast_mean), torch.as_tensor(checked_mean))
    assert fast.state_dict() == checked.state_dict()
    summary = DictSummary()
    for value in values:
        summary.add({"v": value})
    assert summary.state_dict()["v"] == checked.state_dict()


def _python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_outside_reporting_uses_a_reporting_private_name() -> None:
    offenders = []
    for path in _python_files():
        if path.name in ("_reporting.py", "reporting.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "ppe_core._reporting":
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name[0] == "_"]
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("_reporting", "reporting")
                and node.attr.startswith("_")
            ):
                offenders.append(f"{path.name}: {node.attr}")
    assert offenders == []


def test_dict_summary_leaves_summary_fields_to_summary() -> None:
    source = (PACKAGE / "_reporting.py").read_text()
    tree = ast.parse(source)
    dict_summary = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DictSummary"
    )
    fields = set(Summary.__slots__)
    touched = {
        node.attr
        for node in ast.walk(dict_summary)
        if isinstance(node, ast.Attribute)
        and node.attr in fields
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    }
    assert touched == set()


# Move 2: one step protocol -----------------------------------------------------------------
def _inside_step(handler: Any, kind: str) -> bool:
    """Whether the caller runs inside ``handler.<kind>_step`` (the whole step in one call)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == f"{kind}_step" and frame.f_locals.get("self") is handler:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class PostOnly(Handler):
    """ppe-core style: overrides only the post-steps."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, int, bool]] = []

    def train_post_step(self, trainer: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        assert not hasattr(trainer, "_batch")  # nothing handed back through the trainer
        self.events.append(("train", batch_idx, _inside_step(self, "train")))
        super().train_post_step(trainer, batch_idx, batch, outputs)

    def eval_post_step(self, evaluator: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
        assert not hasattr(evaluator, "_batch")
        self.events.append(("eval", batch_idx, _inside_step(self, "eval")))
        super().eval_post_step(evaluator, batch_idx, batch, outputs)


class WrapsStep(PostOnly):
    """PPE style: overrides the steps and passes complete_fn on, as PPE's examples do."""

    def train_step(self, trainer: Any, batch_idx: int, batch: Any, complete_fn: Any) -> Any:
        assert callable(complete_fn)
        return super().train_step(trainer, batch_idx, batch, complete_fn)

    def eval_step(self, evaluator: Any, batch_idx: int, batch: Any, complete_fn: Any) -> Any:
        assert callable(complete_fn)
        return super().eval_step(evaluator, batch_idx, batch, complete_fn)


@pytest.mark.parametrize("handler_class", [Handler, PostOnly, WrapsStep])
@pytest.mark.parametrize("metrics", [False, True])
def test_every_handler_runs_its_whole_step_in_one_call(
    tmp_path: Path, handler_class: type[Handler], metrics: bool
) -> None:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    metric = [lambda batch, outputs: {"n": float(len(batch["x"]))}] if metrics else None
    evaluator = ppe.engine.create_evaluator(model, handler_class=handler_class, metrics=metric)
    record, seen = recorder((1, "epoch"))
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        handler_class=handler_class,
        evaluator=evaluator,
        extensions=[record],
        out_dir=str(tmp_path),
    )
    trainer.run(make_loader(), make_loader(seed=1))
    assert {"train/loss", "val/loss"} <= set(seen[0])
    if metrics:
        assert seen[0]["val/n"] == 8.0
    if handler_class is not Handler:
        events = trainer.handler.events + evaluator.handler.events  # type: ignore[attr-defined]
        expected = [("train", 0), ("train", 1), ("eval", 0), ("eval", 1)]
        assert events == [(kind, i, True) for kind, i in expected]


def test_a_base_handler_written_for_ppe_is_driven_through_complete_fn(tmp_path: Path) -> None:
    events: list[tuple[str, int]] = []
    batches: list[Any] = []

    class PPEStyle(BaseHandler):
        def train_step(self, trainer: Any, batch_idx: int, batch: Any, complete_fn: Any) -> Any:
            model = trainer.models["main"]
            optimizer = trainer.optimizers["main"]
            optimizer.zero_grad()
            outputs = model(**batch)
            outputs["loss"].backward()
            optimizer.step()
            events.append(("step", batch_idx))
            complete_fn(batch_idx, outputs)
            events.append(("step done", batch_idx))
            return outputs

        def train_post_step(self, trainer: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
            events.append(("post", batch_idx))
            batches.append(batch)
            report({"train/loss": outputs["loss"]})

    model = ppe.to(Net(), "cpu")
    trainer = ppe.training.Trainer(
        PPEStyle(Logic(), None),
        models=model,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        max_epochs=1,
        out_dir=str(tmp_path),
    )
    loader = list(make_loader())
    trainer.run(loader)
    assert events == [
        ("step", 0),
        ("post", 0),
        ("step done", 0),
        ("step", 1),
        ("post", 1),
        ("step done", 1),
    ]
    assert batches[0] is loader[0] and batches[1] is loader[1]  # the loader's own batch


def test_step_function_adapts_only_handlers_that_speak_ppes_protocol() -> None:
    step_function = ppe.handler.step_function
    runtime = ppe.runtime.PyTorchRuntime("cpu", {})
    own = Handler(Logic(), runtime, {})
    assert step_function(own, "train") == own.train_step
    assert step_function(own, "eval") == own.eval_step
    post_only = PostOnly(Logic(), runtime, {})
    assert step_function(post_only, "train") == post_only.train_step
    wrapping = WrapsStep(Logic(), runtime, {})
    assert step_function(wrapping, "train") != wrapping.train_step
    assert step_function(wrapping, "eval") != wrapping.eval_step


def test_single_model_logics_share_model_logic_and_switch_only_their_model() -> None:
    for logic in (Logic("a"), CodeBlockLogic("a")):
        assert isinstance(logic, ppe.handler.ModelLogic)
        models = {"a": torch.nn.Linear(1, 1), "b": torch.nn.Linear(1, 1)}
        logic.train_validation_begin(models)
        assert (models["a"].training, models["b"].training) == (False, True)
        logic.train_validation_end(models)
        logic.train_epoch_end(models, 0)
        assert (models["a"].training, models["b"].training) == (False, True)
        logic.train_epoch_begin(models, 1, [])
        assert models["a"].training
        with pytest.raises(ppe.errors.ConfigurationError, match="trains the model named 'a'"):
            logic.train_epoch_begin({"c": torch.nn.Linear(1, 1)}, 0, [])


def test_autocast_state_and_entry_trigger_are_public() -> None:
    logic = Logic(options={"autocast": False})
    assert logic._autocast.enabled is False and logic._autocast._enabled is False
    entry = ppe.training.ExtensionEntry(lambda manager: None)
    entry.set_trigger((3, "iteration"))
    assert entry.trigger.period == 3  # type: ignore[attr-defined]


def test_one_models_validator_says_the_same_everywhere() -> None:
    logic = Logic()
    handler = Handler(logic, ppe.runtime.PyTorchRuntime("cpu", {}), {})
    makers = [
        lambda: ppe.training.Trainer(handler, models="net", max_epochs=1),
        lambda: ppe.training.Evaluator(handler, "net"),
        lambda: ppe.training.ExtensionsManager("net", {}, 1, iters_per_epoch=1),
        lambda: ppe.engine.create_trainer("net", {}, 1),
        lambda: ppe.engine.create_evaluator("net"),
    ]
    messages = set()
    for make in makers:
        with pytest.raises(ArgumentTypeError) as info:
            make()
        messages.add(str(info.value))
    assert messages == {
        "models must be a torch.nn.Module or a dict of them (each model must be an instance of "
        "torch.nn.Module), but models['main'] is str; pass e.g. models=MyModel() or "
        "models={'main': MyModel()}"
    }
    # The extension Evaluator's argument is PPE's ``target``: the same validator names it.
    for target in ("net", {"main": "net"}):
        with pytest.raises(ArgumentTypeError) as info:
            ppe.training.extensions.Evaluator([], target)  # type: ignore[arg-type]
        assert str(info.value) == next(iter(messages)).replace("models", "target")


# Outputs normalised once per step ------------------------------------------------------------
class TupleNet(Net):
    """Returns a tuple (keys "0", "1"): the loss and a detached statistic."""

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        y = self.fc(x)
        return torch.nn.functional.cross_entropy(y, t), y.detach().abs().mean()


@pytest.fixture
def normalize_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every call of ``normalize_outputs``, through whichever module's name it is made."""
    from ppe_core.handler import _logic

    original = _logic.normalize_outputs
    calls: list[Any] = []

    def counting(outputs: Any) -> Any:
        calls.append(outputs)
        return original(outputs)

    for name, module in list(sys.modules.items()):
        if name.startswith("ppe_core") and module is not None:
            for attr in ("normalize_outputs", "_normalize_outputs"):
                if getattr(module, attr, None) is original:
                    monkeypatch.setattr(module, attr, counting)
    return calls


def _five_batches(tuples: bool = True) -> list[Any]:
    loader = make_loader(n=40)  # 5 batches of 8
    return [(b["x"], b["t"]) if tuples else b for b in loader]


@pytest.mark.parametrize("logic_class", [Logic, CodeBlockLogic])
def test_a_training_step_normalises_its_outputs_once(
    tmp_path: Path, normalize_calls: list[Any], logic_class: type[Any]
) -> None:
    # Code blocks need dict outputs (as in PPE): nothing to normalise there, and nothing is.
    tuples = logic_class is Logic
    model = ppe.to(TupleNet() if tuples else Net(), "cpu")
    record, seen = recorder((1, "iteration"))
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        logic=logic_class(),
        extensions=[record],
        out_dir=str(tmp_path),
    )
    trainer.run(_five_batches(tuples))
    assert len(seen) == 5
    if tuples:
        assert len(normalize_calls) == 5  # was 11: backward, report, and the first-step check
        assert {"train/0", "train/1"} <= set(seen[-1])
    else:
        assert normalize_calls == [] and "train/loss" in seen[-1]


@pytest.mark.parametrize("logic_class", [Logic, CodeBlockLogic])
def test_an_evaluator_step_normalises_its_outputs_once(
    normalize_calls: list[Any], logic_class: type[Any]
) -> None:
    model = ppe.to(TupleNet(), "cpu")
    evaluator = ppe.engine.create_evaluator(model, logic=logic_class())
    with Reporter().scope({}):
        means = evaluator.run(_five_batches())
    assert len(normalize_calls) == 5
    assert set(means) == {"val/0", "val/1"}


# Modes switched in one place -----------------------------------------------------------------
class ModeNet(Net):
    """Records ``(grad enabled, training)`` at each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append((torch.is_grad_enabled(), self.training))
        return super().forward(x, t)


@pytest.mark.parametrize("logic_class", [Logic, CodeBlockLogic])
def test_steps_train_in_train_mode_evaluations_in_eval_mode_and_training_resumes(
    tmp_path: Path, logic_class: type[Any]
) -> None:
    model = ppe.to(ModeNet(), "cpu")
    val = list(make_loader(seed=1))  # 2 batches
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        2,
        logic=logic_class(),
        # Mid-epoch evaluations: the step after each must train in train mode again.
        evaluator=(ppe.engine.create_evaluator(model, logic=logic_class()), (2, "iteration")),
        out_dir=str(tmp_path),
    )
    trainer.extend(ppe.training.extensions.Evaluator(val, model), trigger=(2, "iteration"))
    trainer.run(make_loader(n=32), val)  # 4 iterations per epoch, 8 in all
    training = [mode for grad, mode in model.seen if grad]
    evaluating = [mode for grad, mode in model.seen if not grad]
    assert training == [True] * 8
    assert evaluating == [False] * (4 * 2 * 2)  # 4 passes of 2 batches, by each evaluator
    # Standalone, each evaluator leaves the mode as it found it (and evaluates in eval mode).
    evaluator = ppe.engine.create_evaluator(model, logic=logic_class())
    extension = ppe.training.extensions.Evaluator(val, model)
    for mode in (True, False):
        model.train(mode)
        model.seen.clear()
        with Reporter().scope({}):
            evaluator.run(val)
        extension()
        assert model.seen == [(False, False)] * 4 and model.training is mode
