"""Trainer, Evaluator, Handler and Logic on real models, optimizers and loaders."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe
from ppe_core import hookimpl
from ppe_core.errors import ConfigurationError, RegistryLookupError, TeardownHookWarning
from ppe_core.handler import BatchMismatchError, Logic, ModelOutputError, NoRuntimeError
from ppe_core.plugins import PluginHost


class Classifier(torch.nn.Module):
    """A model in the house style: keyword inputs, a dict with its loss."""

    def __init__(self, lazy: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.LazyLinear(2) if lazy else torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.fc(x)
        loss = torch.nn.functional.cross_entropy(y, t)
        return {"loss": loss, "accuracy": (y.argmax(1) == t).float().mean()}


def make_loader(
    n: int = 64, batch_size: int = 8, shuffle: bool = False, seed: int = 0
) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    t = (x[:, 0] > 0).long()
    data = [{"x": x[i], "t": t[i]} for i in range(n)]
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle, generator=g)  # type: ignore[arg-type]


def make_model(seed: int = 0, lazy: bool = False) -> Classifier:
    torch.manual_seed(seed)
    return ppe.to(Classifier(lazy), "cpu")


def observe(trainer_or_list: list[dict[str, float]]) -> Any:
    @ppe.training.make_extension(trigger=(1, "epoch"), priority=ppe.training.PRIORITY_READER)
    def record(manager: Any) -> None:
        trainer_or_list.append(
            {k: float(v) for k, v in manager.observation.items()} | {"iteration": manager.iteration}
        )

    return record


def test_trainer_reduces_loss_and_reports_train_and_val() -> None:
    model = make_model(lazy=True)  # LazyLinear materialises in the first step
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    seen: list[dict[str, float]] = []
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        5,
        evaluator=ppe.engine.create_evaluator(model),
        extensions=[observe(seen)],
    )
    trainer.run(make_loader(), make_loader(seed=1))
    assert [s["iteration"] for s in seen] == [8, 16, 24, 32, 40]
    assert {"train/loss", "train/accuracy", "val/loss", "val/accuracy"} <= set(seen[0])
    assert seen[-1]["val/loss"] < seen[0]["val/loss"]
    assert (trainer.epoch, trainer.iteration, trainer.epoch_detail) == (5, 40, 5.0)
    assert not model.training  # as in PPE, Logic.train_epoch_end leaves eval mode


def test_evaluator_reports_mean_over_whole_loader_and_restores_mode() -> None:
    model = make_model()
    model.eval()
    evaluator = ppe.engine.create_evaluator(model)
    loader = make_loader(n=20, batch_size=8)  # 8, 8, 4: the mean over the 20 samples
    means = evaluator.run(loader)
    with torch.no_grad():
        expected = sum(float(model(**b)["loss"]) * len(b["t"]) for b in loader) / 20
    assert means["val/loss"] == pytest.approx(expected, rel=1e-6)
    assert not model.training  # it was in eval mode before, and stays there


def test_evaluator_metrics_add_keys() -> None:
    model = make_model()

    def error_rate(
        batch: Mapping[str, torch.Tensor], outs: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        return {"error": 1 - outs["accuracy"]}

    means = ppe.engine.create_evaluator(model, metrics=[error_rate]).run(make_loader())
    assert means["val/error"] == pytest.approx(1 - means["val/accuracy"])


def test_gradient_accumulation_equals_one_large_batch_step() -> None:
    x = torch.randn(32, 4)
    t = (x[:, 0] > 0).long()
    big = make_model(seed=3)
    small = copy.deepcopy(big)
    ppe.to(small, "cpu")
    opt_big = torch.optim.SGD(big.parameters(), lr=0.3)
    opt_small = torch.optim.SGD(small.parameters(), lr=0.3)
    big_loader = [{"x": x, "t": t}]
    small_loader = [{"x": x[i : i + 8], "t": t[i : i + 8]} for i in range(0, 32, 8)]
    ppe.engine.create_trainer(big, opt_big, 1).run(big_loader)
    trainer = ppe.engine.create_trainer(small, opt_small, 1, options={"grad_accumulation_steps": 4})
    trainer.run(small_loader)
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert trainer.iteration == 4


def test_accumulation_window_is_cut_at_epoch_end() -> None:
    # 3 batches with a window of 2: steps after batch 2 (window 2) and batch 3 (window 1).
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps: list[int] = []
    optimizer.register_step_post_hook(lambda *a: steps.append(1))
    loader = make_loader(n=24, batch_size=8)
    ppe.engine.create_trainer(model, optimizer, 2, options={"grad_accumulation_steps": 2}).run(
        loader
    )
    assert len(steps) == 4


class GANLogic(ppe.handler.BaseLogic):
    """A two-model, two-optimizer step: discriminator then generator."""

    def train_step(self, models: Any, optimizers: Any, batch_idx: int, batch: Any) -> Any:
        gen, dis = models["gen"], models["dis"]
        real = batch["x"]
        noise = torch.randn(real.shape[0], 2)
        optimizers["dis"].zero_grad()
        fake = gen(noise).detach()
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        d_loss = bce(dis(real), torch.ones(real.shape[0], 1)) + bce(
            dis(fake), torch.zeros(real.shape[0], 1)
        )
        d_loss.backward()
        optimizers["dis"].step()
        optimizers["gen"].zero_grad()
        g_loss = bce(dis(gen(noise)), torch.ones(real.shape[0], 1))
        g_loss.backward()
        return {"d_loss": d_loss, "g_loss": g_loss}

    def train_step_optimizers(self, models: Any, optimizers: Any, batch_idx: int) -> None:
        optimizers["gen"].step()  # the discriminator already stepped inside train_step

    def eval_step(self, models: Any, batch_idx: int, batch: Any) -> Any:
        return {"d_real": models["dis"](batch["x"]).mean()}


def test_gan_logic_trains_two_models_with_two_optimizers() -> None:
    torch.manual_seed(0)
    gen = ppe.to(torch.nn.Linear(2, 4), "cpu")
    dis = ppe.to(torch.nn.Linear(4, 1), "cpu")
    gen_before = copy.deepcopy(gen.state_dict())
    dis_before = copy.deepcopy(dis.state_dict())
    seen: list[dict[str, float]] = []
    trainer = ppe.engine.create_trainer(
        {"gen": gen, "dis": dis},
        {"gen": torch.optim.Adam(gen.parameters()), "dis": torch.optim.Adam(dis.parameters())},
        2,
        logic=GANLogic(),
        extensions=[observe(seen)],
    )
    trainer.run(make_loader())
    assert {"train/d_loss", "train/g_loss"} <= set(seen[-1])
    assert not torch.equal(gen.weight, gen_before["weight"])
    assert not torch.equal(dis.weight, dis_before["weight"])


class CountingLogic(Logic):
    calls = 0

    def train_step(self, *args: Any, **kwargs: Any) -> Any:
        CountingLogic.calls += 1
        return super().train_step(*args, **kwargs)


class CountingRuntime(ppe.runtime.PyTorchRuntime):
    events: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, device_spec: Any, options: Any = None) -> None:
        super().__init__("cpu", options)

    def train_pre_step(self, trainer: Any, module: Any, batch_idx: int, batch: Any) -> None:
        self.events.append(("train_pre_step", batch_idx))

    def train_post_step(
        self, trainer: Any, module: Any, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        self.events.append(("train_post_step", batch_idx))

    def eval_pre_step(self, evaluator: Any, module: Any, batch_idx: int, batch: Any) -> None:
        self.events.append(("eval_pre_step", batch_idx))

    def eval_post_step(
        self, evaluator: Any, module: Any, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        self.events.append(("eval_post_step", batch_idx))


class DevicePlugin:
    @hookimpl
    def ppe_register_runtimes(self, registry: Any) -> None:
        registry.register("countdev", CountingRuntime)

    @hookimpl
    def ppe_register_logics(self, registry: Any) -> None:
        registry.register("counting", CountingLogic)


def test_plugin_runtime_and_named_logic_drive_every_step(plugin_host: PluginHost) -> None:
    plugin_host.register(DevicePlugin())
    CountingRuntime.events.clear()
    CountingLogic.calls = 0
    torch.manual_seed(0)
    model = ppe.to(Classifier(), "countdev")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        2,
        device="countdev",
        logic="counting",
        evaluator=ppe.engine.create_evaluator(model, device="countdev"),
    )
    trainer.run(make_loader(n=24), make_loader(n=16))
    train = [e for e in CountingRuntime.events if e[0].startswith("train")]
    evals = [e for e in CountingRuntime.events if e[0].startswith("eval")]
    assert train == [
        (k, i) for _ in range(2) for i in range(3) for k in ("train_pre_step", "train_post_step")
    ]
    assert evals == [
        (k, i) for _ in range(2) for i in range(2) for k in ("eval_pre_step", "eval_post_step")
    ]
    assert CountingLogic.calls == 6


def test_lifecycle_hooks_are_called_once_per_run(plugin_host: PluginHost) -> None:
    calls: list[tuple[str, Any]] = []

    class Lifecycle:
        @hookimpl
        def ppe_trainer_setup(self, trainer: Any) -> None:
            calls.append(("trainer_setup", trainer.iteration))

        @hookimpl
        def ppe_trainer_teardown(self, trainer: Any, exception: Any) -> None:
            calls.append(("trainer_teardown", exception))

        @hookimpl
        def ppe_evaluator_setup(self, evaluator: Any) -> None:
            calls.append(("evaluator_setup", None))

        @hookimpl
        def ppe_evaluator_teardown(self, evaluator: Any, exception: Any) -> None:
            calls.append(("evaluator_teardown", exception))

    plugin_host.register(Lifecycle())
    model = make_model()
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        2,
        evaluator=ppe.engine.create_evaluator(model),
    )
    trainer.run(make_loader(n=16), make_loader(n=8))
    assert calls == [
        ("trainer_setup", 0),
        ("evaluator_setup", None),
        ("evaluator_teardown", None),
        ("evaluator_setup", None),
        ("evaluator_teardown", None),
        ("trainer_teardown", None),
    ]
    # A failing run still tears down, with the exception.
    calls.clear()
    bad = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    with pytest.raises(BatchMismatchError):
        bad.run([{"x": torch.randn(2, 4)}])
    assert calls[0] == ("trainer_setup", 0)
    assert calls[-1][0] == "trainer_teardown" and isinstance(calls[-1][1], BatchMismatchError)


def test_failing_teardown_hook_never_replaces_the_training_error(plugin_host: PluginHost) -> None:
    """Issue 14, bug 2: the run's error surfaces; the hook's becomes a warning naming it."""
    seen: list[str] = []

    class BrokenTeardown:
        @hookimpl
        def ppe_trainer_teardown(self, trainer: Any, exception: Any) -> None:
            raise RuntimeError("teardown broke")

        @hookimpl
        def ppe_evaluator_teardown(self, evaluator: Any, exception: Any) -> None:
            raise RuntimeError("evaluator teardown broke")

    class LaterTeardown:  # still runs although another teardown raised
        @hookimpl
        def ppe_trainer_teardown(self, trainer: Any, exception: Any) -> None:
            seen.append(type(exception).__name__)

    plugin_host.register(LaterTeardown(), name="later")
    plugin_host.register(BrokenTeardown(), name="broken")
    model = make_model()
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    with (
        pytest.warns(TeardownHookWarning, match="'broken' raised RuntimeError"),
        pytest.raises(BatchMismatchError),
    ):
        trainer.run([{"x": torch.randn(2, 4)}])
    assert seen == ["BatchMismatchError"]
    # After a successful run nothing else reports the hook's error, so it is raised.
    evaluator = ppe.engine.create_evaluator(model)
    with pytest.raises(RuntimeError, match="evaluator teardown broke"):
        evaluator.run(make_loader(n=8))


def test_sampler_set_epoch_is_called_each_epoch() -> None:
    epochs: list[int] = []

    class Sampler(torch.utils.data.Sampler[int]):
        def __init__(self) -> None:
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            epochs.append(epoch)

        def __iter__(self) -> Any:
            return iter(range(16))

        def __len__(self) -> int:
            return 16

    x = torch.randn(16, 4)
    data = [{"x": x[i], "t": torch.tensor(i % 2)} for i in range(16)]
    loader = DataLoader(data, batch_size=8, sampler=Sampler())  # type: ignore[arg-type]
    model = make_model()
    ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 3).run(loader)
    assert epochs == [0, 1, 2]


def test_resume_mid_epoch_keeps_epoch_boundaries() -> None:
    loader = make_loader(n=40, batch_size=8)  # 5 iterations per epoch
    seen_full: list[dict[str, float]] = []
    model = make_model(seed=1)
    full = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 3, extensions=[observe(seen_full)]
    )
    full.run(loader)

    model = make_model(seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = ppe.engine.create_trainer(model, optimizer, 3, stop_trigger=(7, "iteration"))
    first.run(loader)
    state = first.state_dict()
    assert first.iteration == 7

    seen: list[dict[str, float]] = []
    epoch_begins: list[int] = []

    class Probe(Logic):
        def train_epoch_begin(self, models: Any, epoch: int, loader: Any) -> None:
            epoch_begins.append(epoch)
            super().train_epoch_begin(models, epoch, loader)

    model2 = make_model(seed=99)
    resumed = ppe.engine.create_trainer(
        model2,
        torch.optim.SGD(model2.parameters(), lr=0.1),
        3,
        logic=Probe(),
        extensions=[observe(seen)],
    )
    resumed.load_state_dict(state)  # before run(): applied when the manager is built
    # The snapshot predates the "record" extension: a warning, not a KeyError.
    with pytest.warns(ppe.training.manager.MissingExtensionStateWarning, match="record"):
        resumed.run(loader)
    assert [s["iteration"] for s in seen] == [10, 15]
    assert epoch_begins == [1, 2]
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert a.shape == b.shape
    full_weights = full.models["main"].state_dict()
    for key, value in resumed.models["main"].state_dict().items():
        torch.testing.assert_close(value, full_weights[key])


def test_load_state_dict_before_run_with_an_evaluator() -> None:
    model = make_model()
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        evaluator=ppe.engine.create_evaluator(model),
    )
    trainer.run(make_loader(n=16), make_loader(n=8))
    state = trainer.state_dict()
    model2 = make_model(seed=5)
    again = ppe.engine.create_trainer(
        model2,
        torch.optim.SGD(model2.parameters(), lr=0.1),
        2,
        evaluator=ppe.engine.create_evaluator(model2),
    )
    again.load_state_dict(state)
    again.run(make_loader(n=16), make_loader(n=8))
    assert again.iteration == 4


def test_loader_without_len_trains_until_it_runs_out_or_train_len() -> None:
    model = make_model()
    batches = list(make_loader(n=16))
    once = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    once.run(iter(batches))
    assert (once.iteration, once.manager.iters_per_epoch) == (len(batches), len(batches))
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 2)

    def generate() -> Any:
        while True:
            yield from batches

    trainer.run(generate(), train_len=2)
    assert trainer.iteration == 4


@pytest.mark.parametrize(
    ("kwargs", "run_val", "match"),
    [
        ({"options": {"no_such_option": 1}}, False, "no_such_option"),
        ({"device": "nodevice"}, False, "nodevice"),
        ({"logic": "no-such-logic"}, False, "no-such-logic"),
        ({"bogus": 1}, False, "bogus"),
    ],
)
def test_bad_factory_arguments_are_named(kwargs: dict[str, Any], run_val: bool, match: str) -> None:
    model = make_model()
    with pytest.raises((ConfigurationError, RegistryLookupError), match=match):
        ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1, **kwargs)


def test_val_loader_and_evaluator_must_come_together() -> None:
    model = make_model()
    plain = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    # PPE warns and trains without validation; so does ppe-core, naming the fix.
    with pytest.warns(ppe.training._trainer.ValLoaderIgnoredWarning, match="no evaluator"):
        plain.run(make_loader(), make_loader())
    assert plain.iteration == 8
    with_eval = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        evaluator=ppe.engine.create_evaluator(model),
    )
    with pytest.raises(ConfigurationError, match="no val_loader"):
        with_eval.run(make_loader())


def test_run_without_ppe_to_explains_the_fix() -> None:
    model = Classifier()
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    with pytest.raises(NoRuntimeError, match=r"ppe.to\(model"):
        trainer.run(make_loader())


def test_model_output_errors_name_the_fix() -> None:
    class VectorLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            return {"loss": self.fc(x).sum(dim=1)}

    model = ppe.to(VectorLoss(), "cpu")
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, options={"backward_outputs": "loss"}
    )
    with pytest.raises(ModelOutputError, match="needs a scalar"):
        trainer.run(make_loader())
    classifier = make_model()
    trainer = ppe.engine.create_trainer(
        classifier,
        torch.optim.SGD(classifier.parameters(), lr=0.1),
        1,
        options={"backward_outputs": ["los"]},
    )
    # As in PPE, a missing backward key is skipped with a warning naming it.
    with pytest.warns(ppe.handler.BackwardOutputWarning, match="backward value: los"):
        trainer.run(make_loader())


def test_batch_that_does_not_fit_forward_names_the_keys() -> None:
    model = make_model()
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    with pytest.raises(BatchMismatchError, match=r"keys \['input', 't'\]"):
        trainer.run([{"input": torch.randn(2, 4), "t": torch.tensor([0, 1])}])


def test_autocast_uses_the_runtime_device_type() -> None:
    dtypes: list[torch.dtype] = []

    class Probe(Classifier):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            y = self.fc(x)
            dtypes.append(y.dtype)
            return {"loss": torch.nn.functional.cross_entropy(y.float(), t)}

    torch.manual_seed(0)
    model = ppe.to(Probe(), "cpu")
    ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        options={"autocast": {"dtype": torch.bfloat16}},
    ).run(make_loader(n=8))
    assert dtypes == [torch.bfloat16]


def test_grad_scaler_option_is_device_neutral() -> None:
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    before = model.fc.weight.detach().clone()
    ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, options={"grad_scaler": scaler}
    ).run(make_loader(n=16))
    assert not torch.equal(before, model.fc.weight)
    assert scaler.get_scale() == 4.0  # finite grads: no back-off


def test_device_auto_resolves_through_the_hook() -> None:
    model = make_model()
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, device="auto"
    )
    assert type(trainer.handler._entry_runtime).__name__ == "CPURuntime"


def test_report_keys_select_reported_outputs() -> None:
    model = make_model()
    seen: list[dict[str, float]] = []
    ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        options={"train_report_keys": ["accuracy"]},
        extensions=[observe(seen)],
    ).run(make_loader(n=16))
    assert "train/accuracy" in seen[0] and "train/loss" not in seen[0]


def test_no_pluggy_hook_runs_per_step(plugin_host: PluginHost) -> None:
    calls: list[str] = []
    undo = plugin_host.pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append(name), lambda *args: None
    )
    try:
        counts = []
        for batches in (16, 64):  # 2 and 8 steps per epoch, 2 epochs each
            calls.clear()
            model = make_model()
            ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 2).run(
                make_loader(n=batches)
            )
            counts.append(len(calls))
    finally:
        undo()
    # Trainer setup goes through pluggy once; teardown calls each implementation directly (so
    # that one failing implementation cannot hide the run's error). Neither depends on steps.
    assert counts[0] == counts[1] == 1


def test_accumulation_skips_gradient_sync_inside_a_window() -> None:
    entered: list[int] = []

    class SyncingClassifier(Classifier):
        """Stands for DistributedDataParallel: counts no_sync() windows."""

        def no_sync(self) -> Any:
            import contextlib

            entered.append(1)
            return contextlib.nullcontext()

    torch.manual_seed(0)
    model = ppe.to(SyncingClassifier(), "cpu")
    ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        options={"grad_accumulation_steps": 3},
    ).run(make_loader(n=48))  # 6 batches: two windows of 3, sync only on each window's last
    assert len(entered) == 4


class _ConstantLoss(torch.nn.Module):
    """A model whose loss never improves, so early stopping fires after its patience."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.fc(x).sum() * 0 + 1.0}


def _early_stopping_trainer(tmp_path: Any) -> tuple[Any, Any]:
    """A trainer on :class:`_ConstantLoss` whose early stopping fires at iteration 6."""
    torch.manual_seed(0)
    model = ppe.to(_ConstantLoss(), "cpu")
    stop = ppe.training.triggers.EarlyStoppingTrigger(
        check_trigger=(2, "iteration"), monitor="train/loss", patience=2, max_trigger=(5, "epoch")
    )
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        5,
        stop_trigger=stop,
        out_dir=str(tmp_path),
    )
    return trainer, stop


def test_early_stopping_mid_epoch_stops_the_trainer_once(tmp_path: Any) -> None:
    """Issue 14, bug 1: one stop condition, consulted once per iteration; the run ends where
    the trigger fired (iteration 6 of an 8-step epoch) instead of failing in the next epoch."""
    trainer, _ = _early_stopping_trainer(tmp_path)
    trainer.run([{"x": torch.randn(4, 2)} for _ in range(8)])
    assert (trainer.manager.iteration, trainer.manager.epoch) == (6, 0)
    assert trainer.manager.stop_trigger


# ------------------------------------------------------------------------- stop reason


def test_stop_reason_names_the_early_stopping_trigger_and_its_iteration(tmp_path: Any) -> None:
    trainer, stop = _early_stopping_trainer(tmp_path)
    assert trainer.stop_reason is None  # not started
    trainer.run([{"x": torch.randn(4, 2)} for _ in range(8)])
    reason = trainer.stop_reason
    assert reason is not None
    assert (reason.kind, reason.trigger, reason.iteration) == ("stop_trigger", stop, 6)
    assert reason.epoch_detail == 6 / 8
    assert reason is trainer.manager.stop_reason
    assert str(reason).startswith("stop_trigger EarlyStoppingTrigger")
    assert "at iteration 6 (epoch 0.75)" in str(reason)


def test_stop_reason_is_max_epochs_after_a_full_run() -> None:
    model = make_model()
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 2)
    trainer.run(make_loader(n=32, batch_size=8))
    reason = trainer.stop_reason
    assert reason is not None
    assert (reason.kind, reason.iteration, reason.epoch_detail, reason.error) == (
        "max_epochs",
        8,
        2.0,
        None,
    )
    assert isinstance(reason.trigger, ppe.training.triggers.IntervalTrigger)


def test_stop_reason_records_the_error_that_ended_training() -> None:
    class Boom(ppe.training.extension.Extension):
        trigger = (3, "iteration")

        def __call__(self, manager: Any) -> None:
            raise RuntimeError("boom at 3")

    model = make_model()
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 2, extensions=[Boom()]
    )
    with pytest.raises(RuntimeError, match="boom at 3") as info:
        trainer.run(make_loader(n=32, batch_size=8))
    reason = trainer.stop_reason
    assert reason is not None
    assert (reason.kind, reason.iteration, reason.error) == ("error", 3, info.value)
    assert str(reason) == "error RuntimeError: boom at 3 at iteration 3 (epoch 0.75)"


def test_set_optimizer_on_a_running_trainer_is_saved_by_the_manager() -> None:
    model = make_model()
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    trainer.run(make_loader(n=16, batch_size=8))
    other = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer.set_optimizer("extra", other)
    assert trainer.manager.optimizers["extra"] is other
    assert "extra" in trainer.state_dict()["optimizers"]
