"""Issue 45 items 2 and 7: a best-model snapshot's trigger and where it goes, create_trainer's
hints for other frameworks' arguments, the rate of a resume with nothing left to train, the
CSV log's leading columns and PrintReport's warning for a column no entry has."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import ArgumentTypeError, MissingObservationWarning

E = ppe.training.extensions


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.linear(x), t)}


def _batches(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count * 4, 4, generator=g)
    t = x.sum(dim=1, keepdim=True)
    return [{"x": x[i : i + 4], "t": t[i : i + 4]} for i in range(0, count * 4, 4)]


TRAIN, VAL = _batches(3, 0), _batches(2, 1)


def _trainer(out: Path, max_epochs: int, extensions: list[Any], lr: float = 0.05) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return ppe.engine.create_trainer(
        model,
        optimizer,
        max_epochs,
        out_dir=str(out),
        evaluator=ppe.engine.create_evaluator(model),
        extensions=extensions,
    )


# Item 2: the best model ----------------------------------------------------------------------
def test_a_snapshot_trigger_is_refused_with_where_it_goes_and_that_form_keeps_the_best(
    tmp_path: Path,
) -> None:
    model = Net()
    best = ppe.training.triggers.MinValueTrigger("val/loss")
    for make in (
        lambda: E.snapshot_object(model, "best.pt", trigger=best),
        lambda: E.snapshot(trigger=(1, "epoch")),
    ):
        with pytest.raises(ArgumentTypeError) as info:
            make()
        message = str(info.value)
        assert "ExtensionEntry(snapshot_object(...), trigger=trigger)" in message
        assert "manager.extend(snapshot_object(...), trigger=trigger)" in message
    with pytest.raises(ArgumentTypeError, match=r"unexpected keyword argument\(s\) \['n_retain'\]"):
        E.snapshot(n_retain=2)

    # The form the error names: best.pt holds the weights of the epoch with the lowest
    # val/loss (a learning rate raised after epoch 3 makes the later epochs worse).
    losses: list[float] = []
    weights: list[dict[str, torch.Tensor]] = []

    @ppe.training.make_extension(trigger=(1, "epoch"), needs_model_state=True)
    def record(manager: Any) -> None:
        losses.append(float(manager.observation["val/loss"]))
        weights.append({k: v.clone() for k, v in manager.raw_models["main"].state_dict().items()})

    @ppe.training.make_extension(trigger=(1, "epoch"))
    def diverge(manager: Any) -> None:
        if manager.epoch == 3:  # later epochs get worse: best.pt must not follow them
            manager.optimizers["main"].param_groups[0]["lr"] = 1.5

    trainer = _trainer(tmp_path, 6, [diverge], lr=0.3)
    snap = E.snapshot_object(trainer.models["main"], "best.pt")
    trainer.extend(snap, trigger=ppe.training.triggers.MinValueTrigger("val/loss"))
    trainer.extend(record)
    trainer.run(TRAIN, VAL)
    best_epoch = min(range(len(losses)), key=losses.__getitem__)
    assert best_epoch != len(losses) - 1, losses  # the last epoch is not the best one
    saved = torch.load(tmp_path / "best.pt", weights_only=True)
    assert all(torch.equal(saved[k], weights[best_epoch][k]) for k in saved)


def test_an_extension_trigger_tuple_in_extensions_points_to_extension_entry(
    tmp_path: Path,
) -> None:
    model = Net()
    best = ppe.training.triggers.MinValueTrigger("val/loss")
    for item in [(E.snapshot_object(model, "best.pt"), best), (E.LogReport(), (1, "epoch"), 10)]:
        with pytest.raises(ArgumentTypeError) as info:
            _trainer(tmp_path, 1, [item]).run(TRAIN, VAL)
        message = str(info.value)
        assert "ExtensionEntry(extension, trigger=trigger, priority=priority)" in message
        assert "manager.extend(extension, trigger=trigger, priority=priority)" in message

    # ExtensionEntry in extensions= trains and writes best.pt.
    entry = ppe.training.ExtensionEntry(E.snapshot_object(model, "best.pt"), trigger=best)
    trainer = _trainer(tmp_path, 2, [entry])
    trainer.run(TRAIN, VAL)
    assert (tmp_path / "best.pt").is_file()


# Item 7: hints, rate, CSV columns, PrintReport ---------------------------------------------------
def test_precision_and_seed_point_to_what_does_it(tmp_path: Path) -> None:
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ArgumentTypeError) as info:
        ppe.engine.create_trainer(model, optimizer, 1, precision="bf16-mixed")
    message = str(info.value)
    assert "options={'autocast': True}" in message and "docs/runtimes.md" in message
    assert "did you mean" not in message
    with pytest.raises(ArgumentTypeError) as info:
        ppe.engine.create_trainer(model, optimizer, 1, seed=0)
    assert "torch.manual_seed(seed)" in str(info.value)
    assert "RNG states its snapshot saved" in str(info.value)

    # What the precision hint says trains in bfloat16 on the CPU.
    model = ppe.to(Net(), "cpu", options={"autocast": True})
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, out_dir=str(tmp_path)
    )
    trainer.run(TRAIN)
    assert ppe.runtime.get_runtime(model).autocast == {
        "device_type": "cpu",
        "dtype": torch.bfloat16,
    }


def test_a_resume_with_nothing_left_to_train_shows_no_rate(tmp_path: Path) -> None:
    first = [E.ProgressBar(out=io.StringIO()), E.snapshot(autoload=True)]
    _trainer(tmp_path, 2, first).run(TRAIN, VAL)
    out = io.StringIO()
    resumed = _trainer(tmp_path, 2, [E.ProgressBar(out=out), E.snapshot(autoload=True)])
    resumed.run(TRAIN, VAL)
    assert resumed.manager.iteration == 6
    (line,) = out.getvalue().splitlines()
    assert "6/6 iters (100.00%)" in line
    assert line.endswith(", ? iters/sec, ETA 0:00:00"), line


def test_the_csv_log_starts_with_epoch_and_iteration_also_after_a_new_key(
    tmp_path: Path,
) -> None:
    log_report = E.LogReport(trigger=(1, "iteration"), filename="log.csv")
    _trainer(tmp_path, 2, [log_report]).run(TRAIN, VAL)  # val/loss appears at iteration 3
    with open(tmp_path / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["epoch", "iteration", "train/loss", "elapsed_time", "val/loss"]
    assert [r["iteration"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert [r["val/loss"] == "" for r in rows] == [True, True, False, True, True, False]
    assert E.LogReport.read(tmp_path / "log.csv") == log_report.log


def test_print_report_warns_once_of_a_column_no_entry_of_the_first_epoch_has(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    extensions = [E.LogReport(), E.PrintReport(["epoch", "train/loss", "val/los"], out=out)]
    with pytest.warns(MissingObservationWarning) as records:
        _trainer(tmp_path / "a", 3, extensions).run(TRAIN, VAL)
    assert len(records) == 1
    message = str(records[0].message)
    assert "'val/los' (did you mean 'val/loss'?)" in message
    assert "'train/loss', 'val/loss'" in message
    assert len(out.getvalue().splitlines()) == 4  # the header and 3 rows: printed anyway

    # A key first reported at the epoch's end, with a per-iteration log: no warning.
    out = io.StringIO()
    per_iteration = [
        E.LogReport(trigger=(1, "iteration")),
        E.PrintReport(["iteration", "train/loss", "val/loss"], out=out),
    ]
    _trainer(tmp_path / "b", 1, per_iteration).run(TRAIN, VAL)
    assert out.getvalue().splitlines()[-1].split()[0] == "3"
