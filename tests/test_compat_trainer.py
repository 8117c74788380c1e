"""PPE 0.9 usage of create_trainer / create_evaluator, Trainer and Evaluator, with only the import
changed; where practical the same scenario also runs on pytorch_pfn_extras and is compared."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe


def _net_class(pkg: ModuleType) -> type[torch.nn.Module]:
    class Net(torch.nn.Module):
        """Reports its loss with itself as observer, as PPE examples do."""

        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            y = self.fc(x)
            loss = torch.nn.functional.cross_entropy(y, t)
            pkg.reporting.report({"loss": loss}, self)
            return {"loss": loss, "accuracy": (y.argmax(1) == t).float().mean()}

    return Net


def make_loader(n: int = 32, batch_size: int = 8, seed: int = 0) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    t = (x[:, 0] > 0).long()
    return DataLoader([{"x": x[i], "t": t[i]} for i in range(n)], batch_size=batch_size)  # type: ignore[arg-type]


def make_model(pkg: ModuleType = ppe, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = _net_class(pkg)()
    pkg.to(model, "cpu")
    return model


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.3)


def recorder(pkg: ModuleType, seen: list[dict[str, float]], trigger: Any = (1, "epoch")) -> Any:
    @pkg.training.make_extension(trigger=trigger, priority=pkg.training.PRIORITY_READER)
    def record(manager: Any) -> None:
        seen.append({k: float(v) for k, v in manager.observation.items()})

    return record


def train_both(tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    """The same run with PPE and with ppe-core: final weights and per-epoch observations."""
    results: dict[str, Any] = {}
    for name in ("pytorch_pfn_extras", "ppe_core"):
        pkg = importlib.import_module(name)
        model = make_model(pkg)
        seen: list[dict[str, float]] = []
        trainer = pkg.engine.create_trainer(
            model,
            sgd(model),
            3,
            evaluator=pkg.engine.create_evaluator(model),
            extensions=[recorder(pkg, seen)],
            out_dir=str(tmp_path / name),
            **kwargs,
        )
        trainer.run(make_loader(), make_loader(n=16, seed=1))
        results[name] = {"state": model.state_dict(), "seen": seen, "trainer": trainer}
    return results


def test_same_model_and_seed_train_to_the_same_weights_as_ppe(tmp_path: Path) -> None:
    results = train_both(tmp_path)
    ref, ours = results["pytorch_pfn_extras"], results["ppe_core"]
    for key, value in ref["state"].items():
        torch.testing.assert_close(ours["state"][key], value, rtol=0, atol=0)
    # report(..., model) in forward works in training and validation, under PPE's name
    # "main/loss"; at the epoch end it holds the validation mean, as in PPE.
    for mine, theirs in zip(ours["seen"], ref["seen"], strict=True):
        assert mine["main/loss"] == pytest.approx(theirs["main/loss"], rel=1e-6)


def test_evaluator_registers_observers_like_the_trainer() -> None:
    model = make_model()
    evaluator = ppe.engine.create_evaluator(model)
    reporter, observation = ppe.reporting.Reporter(), {}  # type: ignore[var-annotated]
    with reporter.scope(observation):
        means = evaluator.run(make_loader())
    assert {"main/loss", "val/loss", "val/accuracy"} <= set(observation)
    assert means["main/loss"] == pytest.approx(means["val/loss"])


def test_metric_with_eval_report_keys_as_in_ppe() -> None:
    # PPE's pattern: a metric adds an output, eval_report_keys reports it as val/<name>.
    def error(batch: Any, outputs: Any) -> dict[str, Any]:
        return {"error": 1 - outputs["accuracy"]}

    model = make_model()
    evaluator = ppe.engine.create_evaluator(
        model, metrics=[error], options={"eval_report_keys": ["error"]}
    )
    reporter, observation = ppe.reporting.Reporter(), {}  # type: ignore[var-annotated]
    with reporter.scope(observation):
        evaluator.run(make_loader())
    assert "val/error" in observation and "val/loss" not in observation
    assert 0.0 <= observation["val/error"] <= 1.0


def test_ddp_is_unwrapped_by_default_so_state_keys_match_ppe(tmp_path: Path) -> None:
    import pytorch_pfn_extras
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        keys = {}
        for pkg in (pytorch_pfn_extras, ppe):
            model = make_model(pkg)
            ddp = DistributedDataParallel(model)
            trainer = pkg.engine.create_trainer(
                ddp, sgd(ddp), 1, out_dir=str(tmp_path / pkg.__name__)
            )
            trainer.run(make_loader(n=8))
            keys[pkg.__name__] = set(trainer.state_dict()["models"]["main"])
            # The distributed evaluator of one rank reports its own means.
            evaluator = pkg.engine.create_evaluator(ddp, distributed=True)
            reporter, observation = pkg.reporting.Reporter(), {}
            with reporter.scope(observation):
                evaluator.run(make_loader(n=16))
            if pkg is ppe:
                plain = ppe.engine.create_evaluator(ddp).run(make_loader(n=16))
                assert observation["val/loss"] == pytest.approx(plain["val/loss"])
                assert observation["main/loss"] == pytest.approx(plain["main/loss"])
                assert isinstance(evaluator, ppe.training._evaluator.DistributedEvaluator)
    finally:
        dist.destroy_process_group()
    assert keys["ppe_core"] == keys["pytorch_pfn_extras"] == {"fc.weight", "fc.bias"}


def test_distributed_evaluator_needs_an_initialised_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        ppe.engine.create_evaluator(make_model(), distributed=True)


def test_ppe_trainer_kwargs_and_options_are_accepted(tmp_path: Path) -> None:
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    trainer = ppe.engine.create_trainer(
        model,
        sgd(model),
        1,
        out_dir=str(tmp_path),
        enable_profile=True,
        enable_trace=False,
        options={"runtime": {}, "async": False, "grad_scaler": scaler},
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.run(make_loader(n=16))
    names = {event.key for event in prof.key_averages()}
    assert "ppe.training.Trainer:train_step" in names
    # Objects with state in the options are saved under PPE's flattened names.
    assert set(trainer.state_dict()["state_objects"]) == {"options___::__grad_scaler"}
    with pytest.raises(TypeError, match="enable_profil"):
        ppe.engine.create_trainer(model, sgd(model), 1, enable_profil=True)


def test_runtime_key_in_options_goes_to_the_runtime() -> None:
    model = make_model()
    with pytest.raises(ValueError, match="no_such_runtime_option"):
        ppe.engine.create_trainer(
            model, sgd(model), 1, options={"runtime": {"no_such_runtime_option": 1}}
        )
    # With runtime_options given, a "runtime" option is left over, as in PPE.
    with pytest.raises(ValueError, match="runtime"):
        ppe.engine.create_trainer(
            model, sgd(model), 1, options={"runtime": {}}, runtime_options={"x": 1}
        )


def test_optimizer_accessors_and_epoch_last_iteration(tmp_path: Path) -> None:
    model = make_model()
    first, second = sgd(model), torch.optim.SGD(model.parameters(), lr=0.0)
    last: list[bool] = []

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def probe(manager: Any) -> None:
        last.append(trainer.is_epoch_last_iter((manager.iteration - 1) % 4))

    trainer = ppe.engine.create_trainer(model, first, 1, out_dir=str(tmp_path))
    assert trainer.get_optimizer("main") is first
    trainer.set_optimizer("main", second)  # lr=0: the weights must not move
    trainer.extend(probe, "probe", (1, "iteration"), 10)  # PPE's positional form
    before = model.state_dict()["fc.weight"].clone()
    trainer.run(make_loader())
    assert torch.equal(before, model.state_dict()["fc.weight"])
    assert trainer.get_optimizer("main") is second
    assert last == [False, False, False, True]
    assert trainer.manager.get_extension("probe") is not None
    with pytest.raises(RuntimeError, match="cannot extend after"):
        trainer.extend(probe)
    with pytest.raises(KeyError, match="aux"):
        trainer.get_optimizer("aux")


def test_several_evaluators_run_on_their_triggers(tmp_path: Path) -> None:
    model = make_model()
    one = ppe.engine.create_evaluator(model)
    two = ppe.engine.create_evaluator(model)
    trainer = ppe.engine.create_trainer(
        model,
        sgd(model),
        2,
        out_dir=str(tmp_path),
        evaluator={"one": one, "two": (two, (2, "iteration"))},
    )
    assert dict(trainer.evaluators) == {"one": one, "two": two}
    with pytest.raises(ValueError, match="2 evaluators"):
        trainer.evaluator  # noqa: B018 - the property raises
    with mock.patch("ppe_core.training._evaluator.Evaluator.run") as patched:
        trainer.run(make_loader(), make_loader(n=8))
    assert patched.call_count == 2 + 4  # once per epoch, and every 2 of 8 iterations
    assert trainer.manager.get_extension("one") is not None


def test_single_evaluator_property_and_name(tmp_path: Path) -> None:
    model = make_model()
    evaluator = ppe.engine.create_evaluator(model)
    trainer = ppe.engine.create_trainer(
        model, sgd(model), 1, out_dir=str(tmp_path), evaluator=(evaluator, (2, "iteration"))
    )
    assert trainer.evaluator is evaluator
    trainer.run(make_loader(), make_loader(n=8))
    assert trainer.manager.get_extension("Evaluator") is not None
    none = ppe.engine.create_trainer(model, sgd(model), 1, out_dir=str(tmp_path))
    assert none.evaluator is None


def test_trainer_and_evaluator_constructed_directly(tmp_path: Path) -> None:
    model = make_model()
    handler = ppe.handler.Handler(ppe.handler.Logic(), ppe.runtime.PyTorchRuntime("cpu", {}), {})
    evaluator = ppe.training.Evaluator(handler, model, progress_bar=False)
    assert evaluator.models == {"main": model} and evaluator.progress_bar is False
    trainer = ppe.training.Trainer(
        handler,
        evaluator=evaluator,
        models=model,
        optimizers=sgd(model),
        max_epochs=2,
        out_dir=str(tmp_path),
    )
    assert trainer.is_before_training
    with pytest.raises(RuntimeError, match="not started"):
        trainer.manager  # noqa: B018 - the property raises
    trainer.run(make_loader(), make_loader(n=8))
    assert (trainer.epoch, trainer.iteration, trainer.epoch_detail) == (2, 8, 2.0)
    assert not trainer.is_before_training and trainer.out == str(tmp_path)
    with pytest.raises(ValueError, match="model must be an instance"):
        ppe.training.Trainer(handler, evaluator=None, models=object(), max_epochs=1)


def test_profile_is_entered_and_stepped_like_ppe(tmp_path: Path) -> None:
    # PPE enters the profiler around training and steps it after every iteration: with
    # 12 iterations and 4-step cycles, on_trace_ready fires 3 times (no extra partial trace).
    model = make_model()
    handler = mock.Mock()
    profile = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        on_trace_ready=handler,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
        acc_events=True,  # else torch warns that each cycle clears the events
    )
    trainer = ppe.engine.create_trainer(
        model, sgd(model), 3, profile=profile, out_dir=str(tmp_path)
    )
    trainer.run(make_loader())
    assert handler.call_count == 3


def test_custom_ppe_style_handler_gets_complete_fn_and_post_step(tmp_path: Path) -> None:
    events: list[str] = []

    class Recording(ppe.handler.Handler):
        def train_post_step(self, trainer: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
            events.append(f"train_post_step {batch_idx}")
            super().train_post_step(trainer, batch_idx, batch, outputs)

        def eval_post_step(self, evaluator: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
            events.append(f"eval_post_step {batch_idx}")
            super().eval_post_step(evaluator, batch_idx, batch, outputs)

    model = make_model()
    seen: list[dict[str, float]] = []
    trainer = ppe.engine.create_trainer(
        model,
        sgd(model),
        1,
        handler_class=Recording,
        out_dir=str(tmp_path),
        extensions=[recorder(ppe, seen)],
        evaluator=ppe.engine.create_evaluator(model, handler_class=Recording),
    )
    trainer.run(make_loader(n=16), make_loader(n=8))
    assert events == [
        "train_post_step 0",
        "train_post_step 1",
        "eval_post_step 0",
    ]
    assert {"train/loss", "val/loss", "main/loss"} <= set(seen[0])


def test_handler_overriding_train_step_gets_a_complete_fn(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []

    class Wrapping(ppe.handler.Handler):
        def train_step(self, trainer: Any, batch_idx: int, batch: Any, complete_fn: Any) -> Any:
            assert callable(complete_fn)  # PPE's Trainer always passes one
            return super().train_step(trainer, batch_idx, batch, complete_fn)

        def train_post_step(self, trainer: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
            calls.append(("post", batch_idx))
            assert set(batch) == {"x", "t"}  # the loader's batch, as PPE passes it
            super().train_post_step(trainer, batch_idx, batch, outputs)

    model = make_model()
    seen: list[dict[str, float]] = []
    trainer = ppe.engine.create_trainer(
        model,
        sgd(model),
        2,
        handler_class=Wrapping,
        out_dir=str(tmp_path),
        extensions=[recorder(ppe, seen)],
    )
    trainer.run(make_loader(n=16))
    assert calls == [("post", 0), ("post", 1)] * 2
    assert "train/loss" in seen[-1]


def test_setup_error_comes_before_the_ignored_val_loader_warning(tmp_path: Path) -> None:
    # PPE's test_trainer_no_to: a model never passed through ppe.to, and a val_loader with no
    # evaluator; the missing runtime is reported (the warning would come only after setup).
    model = _net_class(ppe)()
    trainer = ppe.engine.create_trainer(model, sgd(model), 1, out_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"ppe\.to"):
        trainer.run(make_loader(), make_loader())
