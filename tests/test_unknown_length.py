"""Loaders without ``len()``: the first epoch ends when the loader runs out (issue 26)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import ConfigurationError

E = ppe.training.extensions
SCRIPT = Path(__file__).parent / "scripts" / "unknown_length_training.py"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = torch.nn.functional.mse_loss(self.lin(x), t)
        ppe.reporting.report({"loss": loss}, self)
        return {"loss": loss}


def _samples(n: int = 22, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return [{"x": x[i], "t": x[i].sum(0, keepdim=True)} for i in range(n)]


class Stream(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """The same samples as a list, without ``len()``; ``lengths`` varies them per epoch."""

    def __init__(self, samples: list[dict[str, torch.Tensor]], lengths: list[int] | None = None):
        self.samples = samples
        self.lengths = lengths
        self.epochs = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        n = len(self.samples) if self.lengths is None else self.lengths[self.epochs]
        self.epochs += 1
        yield from self.samples[:n]


def _train(
    loader: Any,
    epochs: int = 3,
    val: Any = None,
    out: Path | None = None,
    extensions: list[Any] | None = None,
    train_len: int | None = None,
    **kwargs: Any,
) -> tuple[ppe.training.Trainer, torch.nn.Module]:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    evaluator = ppe.engine.create_evaluator(model) if val is not None else None
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        epochs,
        out_dir=str(out) if out else "result",
        evaluator=evaluator,
        extensions=[E.LogReport()] if extensions is None else extensions,
        **kwargs,
    )
    trainer.run(loader, val, train_len=train_len)
    return trainer, model


def _log(out: Path) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in entry.items() if k != "elapsed_time"}
        for entry in json.loads((out / "log").read_text())
    ]


def test_iterable_dataset_trains_like_the_sized_loader_of_the_same_batches(tmp_path: Path) -> None:
    samples, val = _samples(), _samples(9, seed=1)
    sized = torch.utils.data.DataLoader(samples, batch_size=4)  # 6 batches, the last of 2
    stream = torch.utils.data.DataLoader(Stream(samples), batch_size=4)
    val_stream = torch.utils.data.DataLoader(Stream(val), batch_size=4)
    with pytest.raises(TypeError):
        len(stream)
    _, model_a = _train(
        sized, val=torch.utils.data.DataLoader(val, batch_size=4), out=tmp_path / "a"
    )
    b, model_b = _train(stream, val=val_stream, out=tmp_path / "b")
    assert b.manager.epoch_length_known and b.manager.iters_per_epoch == 6
    assert (b.iteration, b.epoch) == (18, 3)
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(p, q)
    # Epoch triggers (LogReport, the evaluator, max_epochs) fired when the loader ran out.
    assert _log(tmp_path / "a") == _log(tmp_path / "b")
    assert [(e["epoch"], e["iteration"]) for e in _log(tmp_path / "b")] == [
        (1, 6),
        (2, 12),
        (3, 18),
    ]
    assert "val/loss" in _log(tmp_path / "b")[0]
    assert str(b.stop_reason).startswith("max_epochs")


def test_a_generator_trains_one_epoch_and_a_second_epoch_is_refused() -> None:
    trainer, _ = _train(iter(_samples()), epochs=1, extensions=[])
    assert (trainer.iteration, trainer.manager.iters_per_epoch) == (22, 22)
    with pytest.raises(ConfigurationError, match=r"can be read only once.*max_epochs=1"):
        _train(iter(_samples()), epochs=2, extensions=[])


@pytest.mark.parametrize(
    ("stop_trigger", "iterations"), [((7, "iteration"), 7), ((1.5, "epoch"), 9), ((2, "epoch"), 12)]
)
def test_stop_triggers(stop_trigger: Any, iterations: int) -> None:
    stream = torch.utils.data.DataLoader(Stream(_samples()), batch_size=4)
    trainer, _ = _train(stream, epochs=10, extensions=[], stop_trigger=stop_trigger)
    assert trainer.iteration == iterations


def test_progress_bar_counts_without_a_total_until_the_loader_runs_out() -> None:
    out = io.StringIO()
    stream = torch.utils.data.DataLoader(Stream(_samples()), batch_size=4)
    bar = E.ProgressBar(update_interval=1, out=out, min_interval=0.0)
    _train(stream, epochs=2, extensions=[bar])
    lines = out.getvalue().splitlines()
    first = [line for line in lines if line.startswith(("1 iter", "5 iter"))]
    assert first and all(
        "epoch length not known yet" in line and "ETA" not in line for line in first
    )
    assert any(line.startswith("6 iter") and "6/12 iters" in line for line in lines), lines
    assert lines[-1].startswith("12 iter, 2 epoch / 2 epochs | 12/12 iters (100.00%)")


@pytest.mark.parametrize(
    "extension",
    [
        pytest.param(lambda: E.LogReport(trigger=(0.5, "epoch")), id="inner-trigger"),
        pytest.param(
            lambda: ppe.training.ExtensionEntry(E.snapshot(), trigger=(0.25, "epoch")),
            id="entry-trigger",
        ),
    ],
)
def test_a_trigger_that_needs_the_length_in_the_first_epoch_is_refused(extension: Any) -> None:
    stream = torch.utils.data.DataLoader(Stream(_samples()), batch_size=4)
    with pytest.raises(ConfigurationError) as info:
        _train(stream, extensions=[extension()])
    message = str(info.value)
    assert "needs the epoch length within the first epoch" in message
    assert "(100, 'iteration')" in message and "train_len=" in message
    # With train_len the same configuration trains.
    trainer, _ = _train(stream, epochs=1, extensions=[extension()], train_len=6)
    assert trainer.iteration == 6


@pytest.mark.parametrize(
    ("lengths", "phrase"),
    [([22, 14], "ran out after 4 batches but its first epoch had 6"), ([14, 22], "yields more")],
)
def test_a_later_epoch_of_another_length_is_refused(lengths: list[int], phrase: str) -> None:
    stream = torch.utils.data.DataLoader(Stream(_samples(), lengths), batch_size=4)
    with pytest.raises(ConfigurationError, match=phrase):
        _train(stream, epochs=3, extensions=[])


def test_a_len_less_validation_loader_is_read_until_it_runs_out() -> None:
    model = ppe.to(Net(), "cpu")
    evaluator = ppe.engine.create_evaluator(model)
    val = _samples(9, seed=1)
    streamed = evaluator.run(torch.utils.data.DataLoader(Stream(val), batch_size=4))
    sized = evaluator.run(torch.utils.data.DataLoader(val, batch_size=4))
    assert streamed == sized


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}


def _run(out: Path, *extra: str, kill_at: int | None = None) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        start_new_session=True,  # its own process group, with its DataLoader workers
    )
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        if (
            kill_at is not None
            and line.startswith("iteration ")
            and int(line.split()[1]) >= kill_at
        ):
            # Mid-step, mid-snapshot: wherever it is; its workers with it, as a scheduler's
            # kill does (alone, they would keep the pipes open until they noticed, up to 5 s).
            os.killpg(proc.pid, signal.SIGKILL)
            break
        assert time.monotonic() < deadline
    proc.wait(timeout=120)
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == (-signal.SIGKILL if kill_at is not None else 0), err


@pytest.mark.slow
@pytest.mark.parametrize(
    "loader", [["--loader", "plain"], ["--loader", "stateful"], ["--workers", "2"]]
)
def test_sigkill_in_the_first_and_later_epochs_then_resume_is_bit_identical(
    tmp_path: Path, loader: list[str]
) -> None:
    """Kills at 6 (epoch 1, length unknown, resumed from the snapshot at 4), 11 and 22."""
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    _run(reference, *loader)
    for kill_at in (6, 11, 22):
        _run(crashed, *loader, kill_at=kill_at)
    _run(crashed, *loader)
    a = torch.load(reference / "final.pt", weights_only=True)
    b = torch.load(crashed / "final.pt", weights_only=True)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"
    assert _log(reference) == _log(crashed)  # the evaluator's val/loss included
