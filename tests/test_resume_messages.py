"""Issue 45.4: a run says what happened. A resume says once where it resumed; the trainer's
autoloading snapshot also saves the last iteration, so a finished run started again trains
nothing and says so; ``stop_reason`` names a full run as reaching its maximum; ``elapsed_time``
goes on after a resume."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core as ppe

E = ppe.training.extensions
SCRIPT = Path(__file__).parent / "scripts" / "resume_messages_ddp.py"


class Net(torch.nn.Module):
    """A tiny model that counts its training steps."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.steps += self.training
        return {"loss": (self.fc(x) ** 2).mean()}


def _loader() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 2, generator=g)} for _ in range(6)]  # 6 iterations per epoch


def _trainer(out: Path, epochs: int, *extensions: Any, **kwargs: Any) -> tuple[Any, Net]:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        epochs,
        out_dir=str(out),
        extensions=list(extensions),
        **kwargs,
    )
    return trainer, model


def _snapshot(every: int = 4) -> Any:
    return ppe.training.ExtensionEntry(
        E.snapshot(autoload=True, n_retains=2), trigger=(every, "iteration")
    )


def _files(out: Path, prefix: str) -> list[str]:
    names = [p.name for p in out.iterdir() if p.name.startswith(prefix)]
    return sorted(names, key=lambda name: int(name.rsplit("_", 1)[1].split(".")[0]))


def test_a_resume_says_once_where_it_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    _trainer(tmp_path, 1, _snapshot(every=6))[0].run(_loader())
    capsys.readouterr()
    caplog.set_level(logging.INFO, logger="ppe.snapshot")
    trainer, model = _trainer(tmp_path, 2, _snapshot(every=6))
    trainer.run(_loader())
    line = "resumed from snapshot_iter_6 (epoch 1, iteration 6)"
    assert capsys.readouterr().err.count(line) == 1
    assert [r.getMessage() for r in caplog.records if r.name == "ppe.snapshot"] == [line]
    assert model.steps == 6  # the second epoch only


def test_a_finished_run_started_again_trains_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Periodic snapshots at 4 and 8; training ends at 12, which the trainer's autoloading
    # snapshot saves too (n_retains still keeps two). The best-model snapshot_object keeps to
    # its own trigger: no file at 12.
    def best(model: Net) -> Any:
        return ppe.training.ExtensionEntry(
            E.snapshot_object(model, "best_{.iteration}"), trigger=(5, "iteration")
        )

    trainer, model = _trainer(tmp_path, 2, _snapshot())
    trainer.extend(best(model))
    trainer.run(_loader())
    assert _files(tmp_path, "snapshot_iter_") == ["snapshot_iter_8", "snapshot_iter_12"]
    assert _files(tmp_path, "best_") == ["best_5", "best_10"]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    capsys.readouterr()

    again, rerun = _trainer(tmp_path, 2, _snapshot())
    again.extend(best(rerun))
    again.run(_loader())
    assert rerun.steps == 0
    assert again.manager.iteration == 12
    assert all(torch.equal(v, weights[k]) for k, v in rerun.state_dict().items())
    err = capsys.readouterr().err
    assert "resumed from snapshot_iter_12 (epoch 2, iteration 12)" in err
    assert err.count("training already finished (epoch 2, iteration 12): nothing to do") == 1
    assert _files(tmp_path, "snapshot_iter_") == ["snapshot_iter_8", "snapshot_iter_12"]

    # A run that ends by an error gets no final snapshot (its state may not resume exactly).
    @ppe.training.make_extension(trigger=(10, "iteration"))
    def boom(manager: Any) -> None:
        raise RuntimeError("boom")

    failed, _ = _trainer(tmp_path / "failed", 2, _snapshot(), boom)
    with pytest.raises(RuntimeError, match="boom"):
        failed.run(_loader())
    assert _files(tmp_path / "failed", "snapshot_iter_") == ["snapshot_iter_4", "snapshot_iter_8"]


def test_stop_reason_tells_a_full_run_from_an_early_stop(
    tmp_path: Path,
) -> None:
    stop = ppe.training.triggers.EarlyStoppingTrigger(
        monitor="train/loss", patience=100, max_trigger=(2, "epoch")
    )
    trainer, _ = _trainer(tmp_path / "a", 5, stop_trigger=stop)
    trainer.run(_loader())
    reason = trainer.stop_reason
    assert reason is not None and (reason.kind, reason.length) == ("stop_trigger", (2, "epoch"))
    assert str(reason) == (
        f"stop_trigger {stop!r} reached its maximum (2 epochs) at iteration 12 (epoch 2)"
    )
    trainer, _ = _trainer(tmp_path / "b", 2)
    trainer.run(_loader())
    assert str(trainer.stop_reason) == "max_epochs (2) reached at iteration 12 (epoch 2)"

    # A real early stop still names the monitored key and patience. The loss of a constant
    # model never improves: patience 2 runs out at the third check.
    stop = ppe.training.triggers.EarlyStoppingTrigger(
        check_trigger=(2, "iteration"), monitor="train/loss", patience=2, max_trigger=(5, "epoch")
    )
    trainer, model = _trainer(tmp_path / "c", 5, stop_trigger=stop)
    torch.nn.init.zeros_(model.fc.weight)
    torch.nn.init.zeros_(model.fc.bias)
    trainer.run(_loader())
    reason = trainer.stop_reason
    assert reason is not None and reason.length is None
    text = str(reason)
    assert text.startswith("stop_trigger EarlyStoppingTrigger(") and " fired at iteration " in text
    assert "monitor='train/loss'" in text and "patience=2" in text
    assert reason.iteration < 30


def test_elapsed_time_goes_on_after_a_resume(tmp_path: Path) -> None:
    @ppe.training.make_extension(trigger=(1, "iteration"))
    def slow(manager: Any) -> None:
        time.sleep(0.05)  # makes the first run's elapsed time clearly longer than the second's

    _trainer(tmp_path, 1, _snapshot(every=6), E.LogReport(), slow)[0].run(_loader())
    saved = torch.load(tmp_path / "snapshot_iter_6", weights_only=True)
    before = saved["_ppe_core"]["elapsed_time"]["seconds"]
    assert before >= 0.3
    log = E.LogReport()
    trainer, _ = _trainer(tmp_path, 2, _snapshot(every=6), log)
    trainer.run(_loader())
    assert trainer.manager.elapsed_time > before
    assert [entry["iteration"] for entry in log.log] == [6, 12]
    assert log.log[0]["elapsed_time"] <= before < log.log[1]["elapsed_time"]

    # A state without it (PPE's layout) starts at 0, as in PPE, without a warning.
    del saved["_ppe_core"]["elapsed_time"]
    model = Net()
    fresh = ppe.training.ExtensionsManager(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 2, iters_per_epoch=6
    )
    fresh.load_state_dict(saved)
    assert fresh.elapsed_time == 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_under_torchrun_a_dcp_run_saves_its_end_and_a_rerun_trains_nothing(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    command += [f"--master_port={_free_port()}", "--master_addr=127.0.0.1"]
    command += [str(SCRIPT), str(tmp_path)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "rank 0 trained 8 steps" in first.stdout and "rank 1 trained 8 steps" in first.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("snapshot_")) == [
        "snapshot_iter_6",
        "snapshot_iter_8",
    ]
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "rank 0 trained 0 steps" in again.stdout and "rank 1 trained 0 steps" in again.stdout
    assert again.stderr.count("resumed from snapshot_iter_8 (epoch 2, iteration 8)") == 1
    done = "training already finished (epoch 2, iteration 8): nothing to do"
    assert again.stderr.count(done) == 1
