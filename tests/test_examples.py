"""The examples under examples/, run as a user runs them (and their custom Logic in-process)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe

EXAMPLES = Path(__file__).parent.parent / "examples"
QUICKSTART = EXAMPLES / "quickstart.py"
DIGITS = EXAMPLES / "train_digits.py"
CUSTOM = EXAMPLES / "train_digits_custom_logic.py"
FSDP = EXAMPLES / "train_fsdp.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_example(script: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in a fresh interpreter, as `python examples/<script>` would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    env["OMP_NUM_THREADS"] = "1"  # tiny models: one thread is fastest on a shared 2-core VM
    result = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result


def final_accuracy(stdout: str) -> float:
    match = re.search(r"^final validation accuracy: ([0-9.]+) \(epoch (\d+)\)$", stdout, re.M)
    assert match, stdout[-2000:]
    return float(match.group(1))


def table_epochs(stdout: str, columns: int) -> list[int]:
    """The epoch column of PrintReport's rows."""
    rows = [line.split() for line in stdout.splitlines() if line[:1].isdigit()]
    return [int(row[0]) for row in rows if len(row) == columns]


@pytest.mark.slow
def test_quickstart_prints_the_table_shows_progress_and_writes_the_log(tmp_path: Path) -> None:
    result = run_example(QUICKSTART, tmp_path)
    lines = result.stdout.splitlines()
    header = [line for line in lines if line.startswith("epoch")]
    assert len(header) == 1
    assert header[0].split() == ["epoch", "iteration", "train/loss", "val/loss", "val/accuracy"]
    rows = [line.split() for line in lines if line[:1].isdigit() and len(line.split()) == 5]
    assert [int(row[0]) for row in rows] == list(range(1, 11))
    # Progress: plain lines (stdout is a pipe here), ending at 100 %, and a validation line
    # with the real number of batches each epoch.
    progress = [line for line in lines if "iters (" in line]
    assert progress and "320/320 iters (100.00%)" in progress[-1]
    assert not any("\r" in line or "\x1b[" in line for line in lines)
    assert sum("validation: 8/8 batches" in line for line in lines) == 10
    log = json.loads((tmp_path / "result" / "log").read_text())
    assert len(log) == 10
    for entry in log:
        assert {"epoch", "iteration", "train/loss", "val/loss"} <= set(entry)
    assert log[-1]["val/loss"] < log[0]["val/loss"]


@pytest.mark.slow
def test_train_digits_reaches_95_percent_plots_and_resumes_from_its_snapshot(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    first = run_example(DIGITS, tmp_path, "--out", str(out))
    assert final_accuracy(first.stdout) >= 0.95
    assert table_epochs(first.stdout, 6) == list(range(1, 16))
    assert "resumed from" not in first.stdout
    for name in ("loss.png", "accuracy.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    log = json.loads((out / "log").read_text())
    assert [entry["epoch"] for entry in log] == list(range(1, 16))
    assert log[-1]["lr"] < log[0]["lr"]  # the scheduler decayed the learning rate
    assert log[-1]["val/loss"] < log[0]["val/loss"]

    # The same --out again, one epoch longer: the newest snapshot is loaded and training
    # continues from the end of epoch 15 instead of starting over.
    second = run_example(DIGITS, tmp_path, "--out", str(out), "--epochs", "16")
    assert f"resumed from {out / 'snapshot_iter_675'}" in second.stdout
    assert table_epochs(second.stdout, 6) == [16]
    resumed = json.loads((out / "log").read_text())
    assert resumed[:15] == log
    assert resumed[15]["epoch"] == 16
    assert final_accuracy(second.stdout) >= 0.95


@pytest.mark.slow
def test_train_digits_custom_logic_trains_reports_grad_norm_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run_example(CUSTOM, tmp_path, "--out", str(out), "--epochs", "5")
    assert final_accuracy(first.stdout) >= 0.95
    log = json.loads((out / "log").read_text())
    assert [entry["epoch"] for entry in log] == [1, 2, 3, 4, 5]
    # 180 batches of 8 per epoch, one optimizer step (and one grad_norm) per 4 of them; the
    # norm is clipped to 1 only after it is measured, so it may exceed 1 but stays finite.
    assert all(0 < entry["grad_norm"] < 100 for entry in log)
    for name in ("grad_norm.png", "accuracy.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    second = run_example(CUSTOM, tmp_path, "--out", str(out), "--epochs", "6")
    assert "resumed from" in second.stdout
    assert table_epochs(second.stdout, 5) == [6]


# The custom Logic, in-process ------------------------------------------------------------


@pytest.fixture
def example_modules() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLES))


class _Linear(torch.nn.Module):
    """No dropout: the two runs compared below must draw no random numbers in the model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.fc(x)
        return {"loss": torch.nn.functional.cross_entropy(scores, t), "y": scores.argmax(1)}


def _train(logic: ppe.handler.BaseLogic | None, batch_size: int, n: int) -> torch.nn.Module:
    from train_digits import load_digits_split

    train_set, _ = load_digits_split(0)
    subset = torch.utils.data.Subset(train_set, range(n))
    torch.manual_seed(0)
    model = ppe.to(_Linear(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    trainer = ppe.engine.create_trainer(model, optimizer, 1, device="cpu", logic=logic)
    trainer.run(DataLoader(subset, batch_size=batch_size))
    return model


def test_accumulating_four_batches_of_8_equals_one_step_on_32(example_modules: None) -> None:
    from train_digits_custom_logic import AccumulateClipLogic

    # 72 samples: windows of 32, 32 and a short last window of 8 (one batch).
    accumulated = _train(AccumulateClipLogic(4, max_norm=float("inf")), batch_size=8, n=72)
    reference = _train(None, batch_size=32, n=72)
    for a, b in zip(accumulated.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_clipping_bounds_every_update(example_modules: None) -> None:
    from train_digits_custom_logic import AccumulateClipLogic

    start = _train(AccumulateClipLogic(1, max_norm=0.0), batch_size=8, n=16)
    # max_norm=0 clips every gradient to zero, so SGD leaves the initial weights unchanged.
    torch.manual_seed(0)
    initial = _Linear()
    for a, b in zip(start.parameters(), initial.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_accumulation_steps_below_one_is_refused(example_modules: None) -> None:
    from train_digits_custom_logic import AccumulateClipLogic

    with pytest.raises(ValueError, match="accumulation_steps must be >= 1"):
        AccumulateClipLogic(0)


# FSDP2 under torchrun ------------------------------------------------------------------------


def run_torchrun(script: Path, cwd: Path, *args: str, timeout: float = 300) -> str:
    """Runs ``script`` as `torchrun --nproc_per_node=2 examples/<script>` would; its stdout.

    Output goes to files (a pipe would stay open as long as any worker lives); a run still
    going after ``timeout`` seconds is killed with its workers and fails the test.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", str(script), *args]
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            command, cwd=cwd, stdout=stdout, stderr=stderr, env=env, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # torchrun and its workers
            process.wait()
            returncode = None
        stdout.seek(0)
        stderr.seek(0)
        output, errors = stdout.read(), stderr.read()
    assert returncode == 0, f"{script.name} {' '.join(args)}: exit {returncode}\n{errors[-3000:]}"
    return output


def epochs_and_iterations(out: Path) -> list[tuple[int, int]]:
    return [(entry["epoch"], entry["iteration"]) for entry in json.loads((out / "log").read_text())]


def check_export(out: Path, stdout: str) -> None:
    """``out/model.pt`` is a plain state dict of the unsharded Classifier whose validation
    loss and accuracy are the final ones the sharded run logged (and printed)."""
    from train_digits import load_digits_split
    from train_fsdp import Classifier

    state = torch.load(out / "model.pt", weights_only=True)
    assert all(type(value) is torch.Tensor for value in state.values())  # no DTensors
    model = Classifier()
    model.load_state_dict(state)  # strict: the unsharded model's keys, no FSDP prefixes
    _, val = load_digits_split(seed=0)
    x = torch.stack([val[i]["x"] for i in range(len(val))])
    t = torch.stack([val[i]["t"] for i in range(len(val))])
    with torch.no_grad():
        exported = model(x, t)
    final = json.loads((out / "log").read_text())[-1]
    assert float(exported["loss"]) == pytest.approx(final["val/loss"], abs=1e-5)
    assert float(exported["accuracy"]) == pytest.approx(final["val/accuracy"], abs=1e-6)
    assert final["val/accuracy"] >= 0.9
    printed = re.findall(r"^(sharded|exported) model: val/loss ([0-9.]+), ", stdout, re.M)
    assert [name for name, _ in printed] == ["sharded", "exported"]
    assert float(printed[1][1]) == pytest.approx(final["val/loss"], abs=1e-5)


@pytest.mark.slow
def test_train_fsdp_under_torchrun_exports_the_trained_weights_and_resumes(
    tmp_path: Path, example_modules: None
) -> None:
    out = tmp_path / "out"
    first = run_torchrun(FSDP, tmp_path, "--out", str(out), "--epochs", "3")
    assert table_epochs(first, 5) == [1, 2, 3]  # rank 0's table only
    assert "resumed from" not in first
    assert "(world size 2)" in first
    # 1438 samples, 64 per step over both ranks: 23 steps per epoch.
    assert epochs_and_iterations(out) == [(1, 23), (2, 46), (3, 69)]
    log = json.loads((out / "log").read_text())
    assert log[-1]["val/loss"] < log[0]["val/loss"]
    assert sorted(p.name for p in out.glob("snapshot_iter_*")) == [
        "snapshot_iter_46",
        "snapshot_iter_69",
    ]  # n_retains=2
    assert sorted(p.name for p in (out / "snapshot_iter_69").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]  # each rank wrote its shards
    check_export(out, first)
    first_export = torch.load(out / "model.pt", weights_only=True)

    # Longer: resumed from the newest snapshot on both ranks, epoch 4 alone is trained.
    second = run_torchrun(FSDP, tmp_path, "--out", str(out), "--epochs", "4")
    assert f"resumed from {out / 'snapshot_iter_69'}" in second
    assert table_epochs(second, 5) == [4]
    resumed = json.loads((out / "log").read_text())
    assert resumed[:3] == log
    assert epochs_and_iterations(out)[3:] == [(4, 92)]
    assert sorted(p.name for p in out.glob("snapshot_iter_*")) == [
        "snapshot_iter_69",
        "snapshot_iter_92",
    ]
    check_export(out, second)  # now the weights after epoch 4
    second_export = torch.load(out / "model.pt", weights_only=True)
    assert not all(torch.equal(first_export[k], second_export[k]) for k in first_export)


@pytest.mark.slow
def test_train_fsdp_runs_as_one_process(tmp_path: Path, example_modules: None) -> None:
    out = tmp_path / "out"
    result = run_example(FSDP, tmp_path, "--out", str(out), "--epochs", "2")
    assert table_epochs(result.stdout, 5) == [1, 2]
    assert "(world size 1)" in result.stdout
    assert epochs_and_iterations(out) == [(1, 23), (2, 46)]  # the same global batch of 64
    assert sorted(p.name for p in (out / "snapshot_iter_46").glob("*.distcp")) == ["__0_0.distcp"]
    check_export(out, result.stdout)
