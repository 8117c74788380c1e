"""A resume inside a gradient-accumulation window equals the uninterrupted run: the window's
gradients so far (each rank's, unreduced under DDP's ``no_sync`` and FSDP2) travel with the
snapshot. Real SIGKILLs of ``scripts/accumulation_training.py`` (alone and under torchrun,
gloo), and in-process variants (a GradScaler; the state's layout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import launch
from ppe_extensions._snapshot import load_snapshot

import ppe_core as ppe

SCRIPT = Path(__file__).parent / "scripts" / "accumulation_training.py"


def results(out: Path, ranks: int) -> list[dict[str, Any]]:
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(ranks)]


def straight_killed_resumed(root: Path, model: str) -> tuple[list[Any], list[Any], Path]:
    """The straight run, and the run SIGKILLed at iteration 5 then resumed (from snapshot 3,
    inside the first window), for ``model``; the resumed run's directory."""
    processes = 0 if model == "plain" else 2
    ranks = max(processes, 1)
    run, straight = root / "run", root / "straight"
    code, stderr = launch(SCRIPT, str(run), "--model", model, "--kill-at", "5", processes=processes)
    assert code != 0 and not (run / "rank0.pt").exists(), stderr[-4000:]
    # The resume, then the straight run (in the same processes: one launch less).
    code, stderr = launch(SCRIPT, str(run), str(straight), "--model", model, processes=processes)
    assert code == 0, stderr[-4000:]
    return results(straight, ranks), results(run, ranks), run


def assert_identical(straight: list[Any], resumed: list[Any], loaded_from: list[str]) -> None:
    for rank, (a, b) in enumerate(zip(straight, resumed, strict=True)):
        assert b["loaded_from"] == loaded_from[rank], rank
        assert a["iteration"] == b["iteration"] == 20, rank
        for key, value in a["weights"].items():
            assert torch.equal(b["weights"][key], value), (rank, key)


@pytest.mark.slow
def test_sigkill_inside_an_accumulation_window_resumes_bit_identically(tmp_path: Path) -> None:
    straight, resumed, run = straight_killed_resumed(tmp_path, "plain")
    assert_identical(straight, resumed, ["snapshot_3"])
    # The snapshot holds the 3 batches' gradients of the window, which iteration 4 completes.
    state = load_snapshot(str(run / "snapshot_3"))
    saved = state["_ppe_core"]["handler"]["logic"]["accumulation"]["main"]
    assert sorted(saved) == ["body.0.bias", "body.0.weight", "body.3.bias", "body.3.weight"]


@pytest.mark.slow
def test_ddp_sigkill_inside_a_no_sync_window_resumes_each_rank_bit_identically(
    tmp_path: Path,
) -> None:
    straight, resumed, run = straight_killed_resumed(tmp_path, "ddp")
    assert_identical(straight, resumed, ["snapshot_3", "snapshot_3"])
    ranks = load_snapshot(str(run / "snapshot_3"))["_ppe_core"]["ranks"]
    grads = [entry["handler"]["logic"]["accumulation"]["main"] for entry in ranks]
    # Unreduced: each rank's own partial gradients, saved and restored per rank.
    assert not torch.equal(grads[0]["body.0.weight"], grads[1]["body.0.weight"])


@pytest.mark.slow
def test_fsdp2_dcp_sigkill_inside_an_accumulation_window_resumes_each_rank_bit_identically(
    tmp_path: Path,
) -> None:
    straight, resumed, run = straight_killed_resumed(tmp_path, "fsdp")
    assert_identical(straight, resumed, ["snapshot_3", "snapshot_3"])  # SnapshotMode.DCP
    # Each rank's file beside DCP's shards holds its own resume data.
    parts = [torch.load(run / "snapshot_3" / f"rank{r}.pt", weights_only=True) for r in range(2)]
    grads = [part["_ppe_core"]["handler"]["logic"]["accumulation"]["main"] for part in parts]
    # FSDP2 keeps a window's gradients unsharded and unreduced: each rank's, whole.
    assert grads[0]["body.0.weight"].shape == (16, 4)
    assert not torch.equal(grads[0]["body.0.weight"], grads[1]["body.0.weight"])


# In-process variants -------------------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def train(out: Path, stop_at: int | None = None, scaler: bool = False, staged: bool = False) -> Any:
    """12 iterations (one epoch) accumulating over 4 batches, snapshots every 3 (autoload);
    stopped at ``stop_at`` (nothing saved after the last snapshot, as a kill would leave).
    ``staged``: two models, each with its optimizer, through the ``optimizers`` option."""
    torch.manual_seed(0)
    models = {"main": ppe.to(Net(), "cpu"), "other": ppe.to(Net(), "cpu")}
    options: dict[str, Any] = {"grad_accumulation_steps": 4}
    if scaler:  # growth every window: the scale changes between the windows
        options["grad_scaler"] = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    if staged:
        options["optimizers"] = {"main": {}, "other": {"model": "other"}}
    else:
        del models["other"]
    trainer = ppe.engine.create_trainer(
        models,
        {name: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for name, m in models.items()},
        1,
        out_dir=str(out),
        stop_trigger=None if stop_at is None else (stop_at, "iteration"),
        options=options,
    )
    # A stopped run (a fresh directory: nothing to load) does not autoload, so that, as after
    # a kill, it saves nothing at its stop (an autoloading snapshot also saves the end).
    snapshot = ppe.training.extensions.snapshot(
        autoload=stop_at is None, filename="snapshot_{.iteration}"
    )
    trainer.extend(snapshot, trigger=(3, "iteration"))
    g = torch.Generator().manual_seed(1)
    data = [{"x": torch.randn(2, 3, generator=g), "t": torch.tensor([0, 1])} for _ in range(12)]
    trainer.run(data)
    return models["main"] if len(models) == 1 else models, trainer, snapshot


def test_grad_scaler_resume_inside_a_window_is_bit_identical(tmp_path: Path) -> None:
    straight, trainer, _ = train(tmp_path / "straight", scaler=True)
    train(tmp_path / "run", stop_at=5, scaler=True)
    resumed, trainer_resumed, snapshot = train(tmp_path / "run", scaler=True)
    assert snapshot.loaded_from.endswith("snapshot_3")
    for key, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    scale = trainer.handler.state_dict()["grad_scaler"]
    assert scale["scale"] == trainer_resumed.handler.state_dict()["grad_scaler"]["scale"] > 2**10
    # The saved gradients are the scaled ones, with the scale they were scaled by.
    state = load_snapshot(str(tmp_path / "run" / "snapshot_3"))["_ppe_core"]["handler"]
    assert state["grad_scaler"]["scale"] == 2.0**10
    assert state["logic"]["accumulation"]["main"]["fc.weight"].abs().max() > 1


def test_window_aligned_state_holds_no_gradients_and_inside_a_window_it_does(
    tmp_path: Path,
) -> None:
    model, trainer, _ = train(tmp_path / "run", stop_at=4)  # window [0, 4) complete
    assert "logic" not in trainer.handler.state_dict()
    assert model.fc.weight.grad is not None  # kept until the next window's zero_grad
    model, trainer, _ = train(tmp_path / "other", stop_at=6)
    saved = trainer.handler.state_dict()["logic"]["accumulation"]["main"]
    assert torch.equal(saved["fc.weight"], model.fc.weight.grad)


def test_resume_inside_a_window_of_the_optimizers_option_restores_every_model(
    tmp_path: Path,
) -> None:
    straight, _, _ = train(tmp_path / "straight", staged=True)
    _, stopped, _ = train(tmp_path / "run", stop_at=5, staged=True)
    assert sorted(stopped.handler.state_dict()["logic"]["accumulation"]) == ["main", "other"]
    resumed, _, snapshot = train(tmp_path / "run", staged=True)
    assert snapshot.loaded_from.endswith("snapshot_3")
    for name, model in straight.items():
        for key, value in model.state_dict().items():
            assert torch.equal(resumed[name].state_dict()[key], value), (name, key)
