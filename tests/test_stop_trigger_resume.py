"""Issue 42, item 2: the stop trigger's state resumes (saved under ``state['_ppe_core']``).

An ``EarlyStoppingTrigger`` given as ``stop_trigger`` keeps its best value and its count of
checks without improvement through a snapshot, so a resumed run stops where the straight run
did. PPE saves nothing for the stop trigger: its snapshots load with a warning that the trigger
starts afresh.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe
from ppe_core.errors import MissingExtensionStateWarning, MissingObservationWarning
from ppe_core.training import ExtensionsManager
from ppe_core.training.triggers import EarlyStoppingTrigger

E = ppe.training.extensions

# With this data and model the straight run's early stopping fires at iteration 36 (4.5 epochs
# of 8 iterations); a state taken at iteration 28 (a check iteration, mid-epoch) whose stop
# trigger starts afresh trains on to 56.
STOP, SAVED_AT = 36, 28
# The hand-written loop (unshuffled batches) stops at 28; a state taken at 20 (a check
# iteration, mid-epoch) whose stop trigger starts afresh trains on to 36.
MANUAL_STOP, MANUAL_SAVED_AT, MANUAL_FRESH_STOP = 28, 20, 36


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x).squeeze(1), y)}


def _samples() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=g)
    y = x.sum(1) + torch.randn(32, generator=g)  # noisy: the loss stops improving
    return [{"x": x[i], "y": y[i]} for i in range(32)]


def _loader() -> DataLoader[Any]:
    data: Any = _samples()
    return DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))


def _stop() -> EarlyStoppingTrigger:
    return EarlyStoppingTrigger(
        check_trigger=(4, "iteration"), monitor="train/loss", patience=3, max_trigger=(20, "epoch")
    )


def _trainer(out: Path) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    save_at = ppe.training.triggers.ManualScheduleTrigger([SAVED_AT], "iteration")
    return ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        20,
        stop_trigger=_stop(),
        out_dir=str(out),
        extensions=[ppe.training.ExtensionEntry(E.snapshot(autoload=True), trigger=save_at)],
    )


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The uninterrupted Trainer run, and its directory holding the snapshot at SAVED_AT."""
    out = tmp_path_factory.mktemp("straight")
    trainer = _trainer(out)
    trainer.run(_loader())
    return trainer, out


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_trainer_resumed_mid_run_stops_where_the_straight_run_stopped(
    straight: tuple[Any, Path], tmp_path: Path
) -> None:
    reference, out = straight
    assert reference.manager.iteration == STOP
    for path in out.glob(f"*snapshot_iter_{SAVED_AT}*"):  # the snapshot and its manifest
        shutil.copy(path, tmp_path)

    resumed = _trainer(tmp_path)
    resumed.run(_loader())  # no MissingObservationWarning: the check at 28 is not made again
    assert resumed.manager.get_extension("_Snapshot").loaded_from.endswith(f"iter_{SAVED_AT}")
    assert resumed.manager.iteration == STOP
    reason = resumed.stop_reason
    assert reason is not None and (reason.kind, reason.iteration) == ("stop_trigger", STOP)
    expected = _weights(reference.models["main"])
    for key, value in _weights(resumed.models["main"]).items():
        assert torch.equal(value, expected[key]), key
    stop = resumed.manager._stop_trigger
    assert (stop.best, stop.count) == (reference.manager._stop_trigger.best, 3)


def test_the_snapshot_keeps_the_stop_trigger_under_ppe_core_s_key(
    straight: tuple[Any, Path],
) -> None:
    _, out = straight
    state = torch.load(out / f"snapshot_iter_{SAVED_AT}", weights_only=True)
    saved = state["_ppe_core"]["stop_trigger"]
    assert saved["checked_at"] == SAVED_AT and saved["value"] is False
    assert saved["trigger"].keys() == {
        "best",
        "count",
        "interval_trigger",
        "max_trigger",
        "_summary",
    }
    assert "stop_trigger" not in state  # PPE's keys are as PPE writes them


# --------------------------------------------------------------------- a hand-written loop


def _manager() -> tuple[ExtensionsManager, torch.nn.Module]:
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = ExtensionsManager(
        model, optimizer, 20, iters_per_epoch=8, stop_trigger=_stop(), out_dir="unused"
    )
    return manager, model


def _batches() -> list[dict[str, torch.Tensor]]:
    samples = _samples()
    return [
        {k: torch.stack([s[k] for s in samples[i : i + 4]]) for k in ("x", "y")}
        for i in range(0, 32, 4)
    ]


def _train(manager: ExtensionsManager, model: torch.nn.Module, until: int | None = None) -> None:
    """PPE's loop: ``while not manager.stop_trigger``, one batch per ``run_iteration``."""
    batches = _batches()
    while not manager.stop_trigger:
        batch = batches[manager.iteration % len(batches)]
        with manager.run_iteration(step_optimizers=["main"]):
            loss = model(**batch)["loss"]
            ppe.reporting.report({"train/loss": loss})
            loss.backward()
        if manager.iteration == until:
            return


def _saved(manager: ExtensionsManager) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(manager.state_dict(), buffer)
    buffer.seek(0)
    state: dict[str, Any] = torch.load(buffer, weights_only=True)
    return state


@pytest.fixture(scope="module")
def manual() -> Iterator[tuple[int, dict[str, torch.Tensor], dict[str, Any]]]:
    """The straight hand-written run: where it stopped, its weights, its state at
    MANUAL_SAVED_AT."""
    manager, model = _manager()
    _train(manager, model, until=MANUAL_SAVED_AT)
    state = _saved(manager)
    _train(manager, model)
    yield manager.iteration, _weights(model), state


def test_a_hand_written_loop_resumes_the_stop_trigger(
    manual: tuple[int, dict[str, torch.Tensor], dict[str, Any]],
) -> None:
    stopped_at, weights, state = manual
    assert stopped_at == MANUAL_STOP
    manager, model = _manager()
    manager.load_state_dict(state)
    # The check at MANUAL_SAVED_AT already ran before the state was taken: reading stop_trigger at
    # that iteration repeats its answer instead of checking again (without an observation).
    assert not manager.stop_trigger
    _train(manager, model)
    assert manager.iteration == stopped_at
    for key, value in _weights(model).items():
        assert torch.equal(value, weights[key]), key


class _SaveState(ppe.training.Extension):
    """Keeps ``manager.state_dict()`` as a snapshot does: after the iteration's triggers."""

    runs_last = True
    trigger = (MANUAL_SAVED_AT, "iteration")

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None

    def __call__(self, manager: Any) -> None:
        if manager.iteration == MANUAL_SAVED_AT:
            self.state = _saved(manager)


def test_a_state_taken_by_a_runs_last_extension_includes_the_stop_trigger_s_call(
    manual: tuple[int, dict[str, torch.Tensor], dict[str, Any]],
) -> None:
    stopped_at, weights, _ = manual
    manager, model = _manager()
    saver = _SaveState()
    manager.extend(saver)
    _train(manager, model)
    assert manager.iteration == stopped_at and saver.state is not None
    assert saver.state["_ppe_core"]["stop_trigger"]["checked_at"] == MANUAL_SAVED_AT

    manager, model = _manager()
    manager.extend(_SaveState())
    manager.load_state_dict(saver.state)
    _train(manager, model)  # no second call at MANUAL_SAVED_AT (filterwarnings=error)
    assert manager.iteration == stopped_at
    for key, value in _weights(model).items():
        assert torch.equal(value, weights[key]), key


def test_a_ppe_state_without_the_stop_trigger_loads_and_the_trigger_starts_afresh(
    manual: tuple[int, dict[str, torch.Tensor], dict[str, Any]],
) -> None:
    _, _, saved = manual
    state = {k: v for k, v in saved.items() if k != "_ppe_core"}  # PPE's layout: no such key
    manager, model = _manager()
    with pytest.warns(MissingExtensionStateWarning) as record:
        manager.load_state_dict(state)
    assert len(record) == 1
    message = str(record[0].message)
    assert "no state for the stop trigger EarlyStoppingTrigger" in message
    assert "starts afresh" in message and "PPE does not save it" in message
    stop = manager._stop_trigger
    assert (stop.best, stop.count) == (float("inf"), 0)
    assert manager.iteration == MANUAL_SAVED_AT
    # The fresh trigger checks at MANUAL_SAVED_AT again, where nothing is reported yet (PPE too).
    with pytest.warns(MissingObservationWarning, match=f"at iteration {MANUAL_SAVED_AT} "):
        _train(manager, model)
    assert manager.iteration == MANUAL_FRESH_STOP  # as in PPE: the count started again


def test_only_a_stateful_stop_trigger_is_saved_and_missed() -> None:
    manager, _ = _manager()
    assert "stop_trigger" in manager.state_dict()["_ppe_core"]

    def plain() -> ExtensionsManager:
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return ExtensionsManager(model, optimizer, 2, iters_per_epoch=4, out_dir="unused")

    state = plain().state_dict()
    assert "stop_trigger" not in state["_ppe_core"]  # (max_epochs, 'epoch') has no state
    plain().load_state_dict(state)  # and nothing is missing (filterwarnings=error)
