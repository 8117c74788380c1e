"""ExtensionsManager as PPE 0.9 uses it: the same scenarios run with PPE and with ppe-core."""

# torch leaves Tensor.backward unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import io
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ppe_core


def _ppe() -> types.ModuleType:
    import pytorch_pfn_extras

    return pytorch_pfn_extras


def _libs() -> list[types.ModuleType]:
    return [_ppe(), ppe_core]


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)) for _ in range(40)]


def _build(
    lib: types.ModuleType, out: Path, *extensions: Any, **kwargs: Any
) -> tuple[Any, torch.nn.Linear]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    manager = lib.training.ExtensionsManager(
        model,
        optimizer,
        4,
        iters_per_epoch=5,
        out_dir=str(out),
        extensions=list(extensions),
        **kwargs,
    )
    return manager, model


def _train(
    lib: types.ModuleType,
    manager: Any,
    model: torch.nn.Module,
    n: int,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
) -> None:
    for _ in range(n):
        x, t = next(batches)
        with manager.run_iteration(step_optimizers=["main"]):
            loss = F.mse_loss(model(x), t)
            lib.reporting.report({"loss": loss}, model)
            loss.backward()


def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


def test_state_dict_has_ppe_layout_for_stand_in_objects() -> None:
    class Stub(torch.nn.Module):
        """A module whose whole state is an opaque object, as PPE's own tests use."""

        def __init__(self, state: object) -> None:
            super().__init__()
            self.state = state
            self.loaded: list[object] = []

        def state_dict(self) -> Any:  # type: ignore[override]
            return self.state

        def load_state_dict(self, state: Any) -> None:  # type: ignore[override]
            self.loaded.append(state)

    class Opt:
        def __init__(self, state: object) -> None:
            self.state = state
            self.loaded: list[object] = []

        def state_dict(self) -> object:
            return self.state

        def load_state_dict(self, state: object) -> None:
            self.loaded.append(state)

    model_state, optimizer_state = object(), object()
    manager = ppe_core.training.manager.ExtensionsManager(
        {"net": Stub(model_state)}, {"opt": Opt(optimizer_state)}, 5, iters_per_epoch=4
    )
    for _ in range(6):
        with manager.run_iteration():
            pass
    state = manager.state_dict()
    elapsed = state["_ppe_core"].pop("elapsed_time")  # ppe-core's elapsed time goes on at resume
    assert set(elapsed) == {"seconds"} and elapsed["seconds"] > 0
    assert state == {
        "ppe_version": "0.9.0",  # the PPE format ppe-core writes; its own version is below
        "_start_iteration": 6,
        "_start_execution": 6,
        "models": {"net": model_state},
        "optimizers": {"opt": optimizer_state},
        "state_objects": {},
        "extensions": {},
        # a key PPE's load ignores
        "_ppe_core": {"version": ppe_core.__version__, "manager": {"iters_per_epoch": 4}},
    }
    net, opt = Stub(object()), Opt(object())
    fresh = ppe_core.training.manager.ExtensionsManager(
        {"net": net}, {"opt": opt}, 5, iters_per_epoch=4
    )
    fresh.load_state_dict(state)
    assert net.loaded == [model_state] and opt.loaded == [optimizer_state]
    assert fresh.iteration == 6


@pytest.mark.parametrize("version", [None, "0.4.0", "23.0.0"])
def test_state_from_another_version_warns(version: str | None) -> None:
    manager, _ = _build(ppe_core, Path("unused"))
    state = manager.state_dict()
    if version is None:
        del state["ppe_version"]
    else:
        state["ppe_version"] = version
    with pytest.warns(UserWarning, match="version"):
        _build(ppe_core, Path("unused"))[0].load_state_dict(state)


def test_ppe_state_dict_resumes_in_ppe_core(tmp_path: Path) -> None:
    ppe = _ppe()
    batches = _batches()
    reference, ref_model = _build(ppe, tmp_path / "ppe", ppe.training.extensions.LogReport())
    source = iter(batches)
    _train(ppe, reference, ref_model, 7, source)
    state = _round_trip(reference.state_dict())  # what a PPE snapshot file holds
    assert state["ppe_version"] == ppe.__version__
    _train(ppe, reference, ref_model, 6, source)

    resumed, model = _build(ppe_core, tmp_path / "core", ppe_core.training.extensions.LogReport())
    resumed.load_state_dict(state)  # PPE 0.9 states load without a version warning
    assert resumed.iteration == 7
    rest = iter(batches[7:])
    _train(ppe_core, resumed, model, 6, rest)
    assert resumed.iteration == 13
    torch.testing.assert_close(model.state_dict(), ref_model.state_dict(), rtol=0, atol=0)
    got = resumed.get_extension("LogReport").log
    expected = reference.get_extension("LogReport").log
    assert [e["iteration"] for e in got] == [e["iteration"] for e in expected] == [5, 10]
    assert got[-1]["main/loss"] == pytest.approx(expected[-1]["main/loss"], rel=1e-6)


def test_ppe_core_state_dict_loads_into_ppe(tmp_path: Path) -> None:
    ppe = _ppe()
    batches = iter(_batches())
    source, model = _build(ppe_core, tmp_path, ppe_core.training.extensions.LogReport())
    _train(ppe_core, source, model, 7, batches)
    state = _round_trip(source.state_dict())
    target, target_model = _build(ppe, tmp_path, ppe.training.extensions.LogReport())
    target.load_state_dict(state)  # no version warning: the state says PPE 0.9.0's format
    assert target.iteration == 7
    torch.testing.assert_close(target_model.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_state_objects_are_saved_and_restored() -> None:
    torch.manual_seed(0)

    def build() -> tuple[Any, torch.optim.lr_scheduler.StepLR]:
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
        manager = ppe_core.training.ExtensionsManager(
            model, optimizer, 1, iters_per_epoch=1, state_objects={"sched": scheduler}
        )
        return manager, scheduler

    manager, scheduler = build()
    for _ in range(3):
        manager.optimizers["main"].step()
        scheduler.step()
    state = _round_trip(manager.state_dict())
    assert state["state_objects"]["sched"]["last_epoch"] == 3
    fresh, fresh_scheduler = build()
    fresh.load_state_dict(state)
    assert fresh_scheduler.last_epoch == 3
    del state["state_objects"]["sched"]
    with pytest.raises(KeyError, match="sched"):
        build()[0].load_state_dict(state)


def test_grad_scaler_state_object_round_trips() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    model = torch.nn.Linear(2, 1)
    manager = ppe_core.training.ExtensionsManager(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        iters_per_epoch=1,
        state_objects={"scaler": scaler},
    )
    state = _round_trip(manager.state_dict())
    restored = torch.amp.GradScaler("cpu", init_scale=2.0)
    fresh = ppe_core.training.ExtensionsManager(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        iters_per_epoch=1,
        state_objects={"scaler": restored},
    )
    fresh.load_state_dict(state)
    assert restored.state_dict()["scale"] == 64.0


@pytest.mark.parametrize("lib", _libs(), ids=["ppe", "ppe_core"])
def test_error_inside_run_iteration_can_be_caught_and_training_continues(
    lib: types.ModuleType, tmp_path: Path
) -> None:
    calls: list[int] = []
    errors: list[str] = []
    finalized: list[bool] = []

    class Watch(lib.training.Extension):  # type: ignore[name-defined,misc]
        def __call__(self, manager: Any) -> None:
            calls.append(manager.iteration)

        def on_error(self, manager: Any, exc: Exception, tb: Any) -> None:
            errors.append(str(exc))

        def finalize(self, manager: Any) -> None:
            finalized.append(True)

    manager, model = _build(lib, tmp_path, Watch())
    batches = iter(_batches())
    _train(lib, manager, model, 2, batches)
    with pytest.raises(ValueError, match="bad batch"), manager.run_iteration():
        raise ValueError("bad batch")
    assert errors == ["bad batch"] and not finalized
    _train(lib, manager, model, 2, batches)
    assert calls == [1, 2, 3, 4]
    assert manager.iteration == 4


@pytest.mark.parametrize("lib", _libs(), ids=["ppe", "ppe_core"])
def test_duplicate_names_are_renamed_with_ordinals(lib: types.ModuleType, tmp_path: Path) -> None:
    manager, _ = _build(lib, tmp_path)
    first = lib.training.extensions.LogReport()
    second = lib.training.extensions.LogReport(filename="other")
    third = lib.training.extensions.LogReport(filename="third")
    manager.extend(first, name="log")
    manager.extend(second, name="log")
    manager.extend(third, name="log")
    assert manager.get_extension("log") is first
    assert manager.get_extension("log_1") is second
    assert manager.get_extension("log_2") is third


@pytest.mark.parametrize("lib", _libs(), ids=["ppe", "ppe_core"])
def test_models_read_without_needs_model_state_raise_runtime_error(
    lib: types.ModuleType, tmp_path: Path
) -> None:
    manager, _ = _build(lib, tmp_path)
    manager.extend(lambda m: m.models["main"], name="reader", trigger=(1, "iteration"))
    with pytest.raises(RuntimeError, match="needs_model_state"), manager.run_iteration():
        pass


def test_run_extensions_updater_and_needs_state_this_iteration(tmp_path: Path) -> None:
    manager, _ = _build(ppe_core, tmp_path)
    seen: list[int] = []

    @ppe_core.training.make_extension(trigger=(2, "iteration"), needs_model_state=True)
    def every2(m: Any) -> None:
        seen.append(m.iteration)

    manager.extend(every2)
    assert manager.needs_state_this_iteration() is False  # iteration 1 is next
    manager.iteration = 2
    manager.run_extensions()  # a loop that counts iterations itself
    assert seen == [2]
    assert manager.needs_state_this_iteration() is False
    with pytest.warns(DeprecationWarning, match="updater"):
        assert manager.updater is manager


def test_enable_trace_is_accepted(tmp_path: Path) -> None:
    manager, model = _build(ppe_core, tmp_path, enable_trace=True)
    _train(ppe_core, manager, model, 1, iter(_batches()))
    assert manager.iteration == 1


def test_trainer_leaves_out_step_time_but_logs_keep_elapsed_time(tmp_path: Path) -> None:
    """Per-step ``elapsed_time`` costs two clock reads and a summary entry per step, so the
    Trainer leaves it out (documented in docs/migration.md); LogReport entries carry the run's
    elapsed time, as in PPE."""
    torch.manual_seed(0)
    model = ppe_core.to(_LossNet(), "cpu")
    steps: list[Any] = []

    def watch(manager: Any) -> None:
        steps.append(manager.observation.get("elapsed_time"))

    trainer = ppe_core.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        out_dir=str(tmp_path),
        extensions=[watch, ppe_core.training.extensions.LogReport()],
    )
    trainer.run(_loss_batches())
    log = json.loads((tmp_path / "log").read_text())
    assert log[-1]["elapsed_time"] > 0
    assert steps == [None] * 4


class _LossNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.mse_loss(self.fc(x), t)}


def _loss_batches() -> list[dict[str, torch.Tensor]]:
    return [{"x": x, "t": t} for x, t in _batches()[:4]]


# ------------------------------------------------------------------------- ignite


def _ignite() -> types.ModuleType:
    import warnings

    with warnings.catch_warnings():
        # Importing ignite 0.5 scripts a function with the deprecated torch.jit.script.
        warnings.simplefilter("ignore", DeprecationWarning)
        import ignite.engine

    return ignite.engine


def _ignite_run(lib: types.ModuleType, out: Path, epochs: int, *extensions: Any) -> Any:
    create_supervised_trainer = _ignite().create_supervised_trainer

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def step_loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(y, t)
        lib.reporting.report({"loss": loss}, model)
        return loss

    engine = create_supervised_trainer(model, optimizer, step_loss)
    manager = lib.training.manager.IgniteExtensionsManager(
        engine,
        model,
        optimizer,
        epochs,
        out_dir=str(out),
        extensions=[lib.training.extensions.LogReport(), *extensions],
    )
    engine.run(_batches()[:5], max_epochs=epochs)
    return manager, model


def test_ignite_manager_matches_ppe(tmp_path: Path) -> None:
    ppe = _ppe()
    reference, ref_model = _ignite_run(ppe, tmp_path / "ppe", 2)
    manager, model = _ignite_run(ppe_core, tmp_path / "core", 2)
    assert manager.iteration == reference.iteration == 10
    torch.testing.assert_close(model.state_dict(), ref_model.state_dict(), rtol=0, atol=0)
    log = manager.get_extension("LogReport").log
    ref_log = reference.get_extension("LogReport").log
    assert [e["iteration"] for e in log] == [e["iteration"] for e in ref_log] == [5, 10]
    assert log[-1]["main/loss"] == pytest.approx(ref_log[-1]["main/loss"], rel=1e-6)
    state = manager.state_dict()
    assert (state["_epoch_length"], state["_start_iteration"]) == (5, 10)


def test_ignite_manager_resumes_from_its_snapshot(tmp_path: Path) -> None:
    E = ppe_core.training.extensions
    _ignite_run(ppe_core, tmp_path / "ref", 3)
    reference_weights = _ignite_run(ppe_core, tmp_path / "ref2", 3)[1].state_dict()
    _ignite_run(ppe_core, tmp_path / "run", 2, E.snapshot(autoload=True))
    manager, model = _ignite_run(ppe_core, tmp_path / "run", 3, E.snapshot(autoload=True))
    assert manager.iteration == 15
    assert manager.engine.state.epoch == 3
    torch.testing.assert_close(model.state_dict(), reference_weights, rtol=0, atol=0)


def test_ignite_manager_rejects_a_non_engine() -> None:
    _ignite()
    model = torch.nn.Linear(1, 1)
    with pytest.raises(TypeError, match=r"ignite\.engine\.Engine"):
        ppe_core.training.manager.IgniteExtensionsManager(
            object(), model, torch.optim.SGD(model.parameters(), lr=0.1), 1
        )
