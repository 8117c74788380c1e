"""Gaps PPE's own test suite found (run through an import alias, see docs/migration.md):
``ppe.testing._compare_states``, a first step whose loss needs no grad, and the queue writer
joining its queue."""

from __future__ import annotations

import queue
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import NoGradientError, NoGradientWarning
from ppe_core.testing import _compare_states


def _trained_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 3)).sum().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return model, optimizer


# ppe.testing._compare_states -----------------------------------------------------------------


def test_compare_states_equal_and_unequal_real_states() -> None:
    model, optimizer = _trained_model()
    twin, twin_optimizer = _trained_model()  # same seed: the same values, other tensors
    assert _compare_states(model.state_dict(), twin.state_dict())
    assert _compare_states(optimizer.state_dict(), twin_optimizer.state_dict(), strict=True)
    assert ppe.testing._compare_states is _compare_states  # PPE's path

    with torch.no_grad():
        twin[0].weight[0, 0] += 1e-3
    assert not _compare_states(model.state_dict(), twin.state_dict())
    assert not _compare_states(model.state_dict(), {**model.state_dict(), "extra": 1})
    lost = dict(model.state_dict())
    del lost["0.bias"]
    assert not _compare_states(model.state_dict(), lost)


def test_compare_states_strict_nested_and_mismatched_kinds() -> None:
    a = torch.ones(3)
    close = a + 1e-6
    assert _compare_states({"x": a}, {"x": close})
    assert not _compare_states({"x": [a]}, {"x": [close]}, strict=True)  # at every depth
    assert _compare_states({"x": (1, [a])}, {"x": [1, (a.clone(),)]})  # lists equal tuples
    assert not _compare_states([1, 2], [1, 2, 3])
    assert not _compare_states({"x": a}, {"x": 1.0})  # a tensor against a number
    assert not _compare_states({"x": a}, {"x": torch.ones(4)})  # other shape: PPE raises
    assert not _compare_states({"x": {"y": 1}}, {"x": 1})


# A first step whose loss needs no grad (PPE: test_train_step_backward_nograd) -----------------


class _ReturnsInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l0 = torch.nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"0": x}


def test_first_step_without_grad_warns_and_goes_on_as_in_ppe() -> None:
    logic = ppe.handler.Logic()
    model = _ReturnsInput()
    before = model.l0.weight.detach().clone()
    x = torch.rand(1, 1, requires_grad=True)
    optimizers = {"main": torch.optim.SGD(model.parameters(), 1.0)}
    with pytest.warns(NoGradientWarning) as warned:
        outs = logic.train_step({"main": model}, optimizers, 0, x)
        logic.train_step_optimizers({"main": model}, optimizers, 0)
    message = str(warned[0].message)
    assert "the parameters are not updated" in message
    assert "'0': a torch.float32 leaf tensor, computed from no parameter" in message
    assert "NoGradientError stops the run" in message
    assert outs["0"].grad is None  # nothing was backpropagated
    assert torch.equal(model.l0.weight, before)


class _LateLoss(torch.nn.Module):
    """Returns a loss without a graph at its first call only, then a real one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        self.calls += 1
        loss = torch.nn.functional.mse_loss(self.fc(x), t)
        return {"loss": loss.detach() if self.calls == 1 else loss}


class _FirstOnlyLoss(_LateLoss):
    """Trains at its first steps but not at the last of the epoch: the hooks, not the final
    gradients, decide that it trained."""

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        self.calls += 1
        loss = torch.nn.functional.mse_loss(self.fc(x), t)
        return {"loss": loss if self.calls == 2 else loss.detach()}


def _batches(n: int = 3) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 3, generator=g), "t": torch.randn(4, 1, generator=g)}] * n


@pytest.mark.parametrize("model_class", [_LateLoss, _FirstOnlyLoss])
def test_model_that_trains_after_a_first_step_without_grad_goes_on(model_class: type) -> None:
    model = ppe.to(model_class(), "cpu")
    before = model.fc.weight.detach().clone()
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    with pytest.warns(NoGradientWarning):
        trainer.run(_batches())
    assert trainer.manager.iteration == 9  # no NoGradientError at epoch 2 or 3
    assert not torch.equal(model.fc.weight, before)


def test_model_that_never_trains_is_stopped_after_its_first_epoch() -> None:
    class Detached(_LateLoss):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            return {"loss": torch.nn.functional.mse_loss(self.fc(x), t).detach()}

    model = ppe.to(Detached(), "cpu")
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 5)
    stopped = pytest.raises(NoGradientError, match="a whole epoch trained nothing")
    with stopped as info, pytest.warns(NoGradientWarning):  # the warning: at the first step
        trainer.run(_batches())
    assert ".detach()" in str(info.value)
    assert trainer.manager.iteration == 3  # one epoch, not five
    assert all(not p._backward_hooks for p in model.parameters())  # the watch's hooks are gone


# The queue writer joins its queue (PPE: test_queue_writer) ------------------------------------


class _RecordingQueue(queue.Queue[Any]):
    """A real ``queue.Queue`` that records whether ``join`` was called, and when."""

    def __init__(self) -> None:
        super().__init__()
        self.joined_with_unfinished: int | None = None

    def join(self) -> None:
        super().join()
        self.joined_with_unfinished = self.unfinished_tasks


class _RecordingWriter(ppe.writing.ThreadQueueWriter):
    def create_queue(self) -> Any:
        self.recording = _RecordingQueue()
        return self.recording


def test_queue_writer_finalize_joins_its_queue(tmp_path: Any) -> None:
    writer = _RecordingWriter()
    for i in range(3):
        writer(f"f{i}.pt", str(tmp_path), {"i": torch.tensor(i)})
    writer.finalize()
    assert writer.recording.joined_with_unfinished == 0  # joined, every item acknowledged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0.pt", "f1.pt", "f2.pt"]
    assert torch.load(tmp_path / "f2.pt")["i"] == 2


# PPE's _find_stale_snapshots with fewer snapshots than it retains (PPE: test_find_stale_snapshot)


def test_find_stale_snapshots_keeps_all_when_fewer_than_retained(tmp_path: Any) -> None:
    from ppe_extensions._snapshot import _find_stale_snapshots

    for i in range(2):
        (tmp_path / f"snapshot_iter_{i}").write_bytes(b"")
    fmt = "snapshot_iter_{}"
    assert list(_find_stale_snapshots(fmt, str(tmp_path), 3, None)) == []
    assert list(_find_stale_snapshots(fmt, str(tmp_path), 2, None)) == []
    assert list(_find_stale_snapshots(fmt, str(tmp_path), 1, None)) == ["snapshot_iter_0"]


# TensorBoardWriter as LogReport's writer sends 'iteration' too (PPE: test_tensorboard_writer) ----


def test_tensorboard_writer_as_log_writer_sends_every_entry_value_as_ppe(tmp_path: Any) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = tmp_path / "tb"
    writer = ppe.writing.TensorBoardWriter(out_dir=str(tb_dir))
    manager = ppe.training.ExtensionsManager(
        {}, {}, max_epochs=2, iters_per_epoch=2, out_dir=str(tmp_path)
    )
    manager.extend(ppe.training.extensions.LogReport(writer=writer, trigger=(1, "iteration")))
    while not manager.stop_trigger:
        with manager.run_iteration():
            ppe.reporting.report({"main/loss": 0.5})
    writer.finalize()

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"main/loss", "epoch", "iteration", "elapsed_time"} <= tags
    assert [(e.step, e.value) for e in events.Scalars("iteration")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 4.0),
    ]


# PPE's log_report._LogBuffer, the buffer of log entries its readers look at (PPE: test_log_buffer)


def test_log_buffer_keeps_entries_until_every_looker_cleared_them(tmp_path: Any) -> None:
    from ppe_core.training.extensions import log_report

    buffer = log_report._LogBuffer()
    printer = buffer.emit_new_looker()
    manager = ppe.training.ExtensionsManager(
        {}, {}, max_epochs=2, iters_per_epoch=2, out_dir=str(tmp_path)
    )
    report = ppe.training.extensions.LogReport(filename=None, trigger=(1, "iteration"))
    report.add_entry_listener(buffer.append)
    manager.extend(report)
    for _ in range(2):
        with manager.run_iteration():
            ppe.reporting.report({"main/loss": 0.5})
    plotter = buffer.emit_new_looker()  # sees only what comes after it
    assert [e["iteration"] for e in printer.get()] == [1, 2] and plotter.get() == []
    printer.clear()
    assert buffer.size() == 0 and printer.get() == []
    with manager.run_iteration():
        ppe.reporting.report({"main/loss": 0.25})
    assert [e["iteration"] for e in printer.get()] == [3] == [e["iteration"] for e in plotter.get()]
    plotter.clear()
    assert buffer.size() == 1 and [e["main/loss"] for e in printer.get()] == [0.25]
    printer.clear()
    assert buffer.size() == 0
