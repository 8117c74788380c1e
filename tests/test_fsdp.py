"""FSDP2 (``fully_shard``) under torchrun (gloo, two processes): training and evaluation equal
a single process on the combined batch, the snapshot modes that write one rank's state refuse
sharded state, and ``SnapshotMode.SHARDED`` resumes bit-exactly at the same world size only.

One launch per phase of ``scripts/fsdp_training.py``; the tests share their outputs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import launch
from torch.utils.data import DistributedSampler

SCRIPTS = Path(__file__).parent / "scripts"
FSDP = SCRIPTS / "fsdp_training.py"
sys.path.insert(0, str(SCRIPTS))
import fsdp_training  # noqa: E402  (the script's model and data, for the single-process run)

#: The snapshots that must refuse at start on every rank (see the script's ``refusals``).
REFUSED_AT_START = ["default", "distributed", "object_model", "object_optimizer", "object_custom"]


def results(out: Path, phase: str, ranks: int = 2) -> list[dict[str, Any]]:
    return [torch.load(out / f"{phase}_rank{r}.pt", weights_only=True) for r in range(ranks)]


def run_phase(out: Path, *args: str, processes: int = 2) -> None:
    code, stderr = launch(FSDP, str(out), *args, processes=processes)
    assert code == 0, stderr[-4000:]


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first phase (reference, AMP, refusals, straight and stopped runs), with copies of
    the stopped run for the resumes at other world sizes taken before anything resumes it."""
    out = tmp_path_factory.mktemp("fsdp")
    run_phase(out)
    for world in (1, 3):
        shutil.copytree(out / "run", out / f"world{world}" / "run")
    return out


def single_process(autocast: bool = False, accumulate: int = 1) -> torch.nn.Module:
    """The reference run in one process: each step on both ranks' batches together.

    Under ``autocast`` each rank's batch goes forward and backward alone (with half the
    loss): bfloat16 rounds a batch of 8 otherwise than two of 4 as much as autocast changes
    the weights at all, while the gradients add up in float32, as FSDP2's reduction does.
    """
    torch.manual_seed(0)  # as the script's sharded_model: the same initial weights
    model = fsdp_training.Net()
    optimizer = fsdp_training.optimizer(model)
    train, _ = fsdp_training.dataset()
    samplers = [
        DistributedSampler(train, num_replicas=2, rank=r, shuffle=True, seed=1)  # type: ignore[arg-type]
        for r in range(2)
    ]
    size = fsdp_training.BATCH
    for epoch in range(2):
        orders = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        for start in range(0, len(orders[0]), size):
            batch = [train[i] for order in orders for i in order[start : start + size]]
            step = start // size
            if step % accumulate == 0:
                optimizer.zero_grad()
            for part in [batch[:size], batch[size:]] if autocast else [batch]:
                with torch.autocast("cpu", enabled=autocast):
                    loss = model(
                        torch.stack([s["x"] for s in part]), torch.stack([s["t"] for s in part])
                    )["loss"]
                (loss * len(part) / len(batch) / accumulate).backward()
            if (step + 1) % accumulate == 0:
                optimizer.step()
    return model


def max_difference(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    return max((weights[k] - v).abs().max().item() for k, v in model.state_dict().items())


@pytest.mark.slow
def test_fsdp2_training_and_evaluation_equal_a_single_process_on_the_combined_batch(
    first: Path,
) -> None:
    model = single_process()
    _, val = fsdp_training.dataset()
    with torch.no_grad():
        model.eval()
        expected = model(torch.stack([s["x"] for s in val]), torch.stack([s["t"] for s in val]))
    for rank, result in enumerate(results(first, "first")):
        reference = result["reference"]
        assert reference["iteration"] == 16, rank  # 2 epochs of 8 batches of 4 per rank
        assert max_difference(reference["weights"], model) < 1e-6, rank
        # The distributed evaluator's mean covers both ranks' samples (19 + 18 of 37).
        assert reference["means"]["val/loss"] == pytest.approx(expected["loss"].item(), abs=1e-6)


@pytest.mark.slow
def test_fsdp2_training_under_autocast_equals_a_single_process(first: Path) -> None:
    model = single_process(autocast=True)
    for rank, result in enumerate(results(first, "first")):
        assert result["amp"]["iteration"] == 16, rank
        # bfloat16 changed the run (by about 1e-2): the comparison below says something.
        assert max_difference(result["reference"]["weights"], model) > 1e-3, rank
        assert max_difference(result["amp"]["weights"], model) < 1e-6, rank


@pytest.mark.slow
def test_modes_writing_one_rank_state_refuse_sharded_state_naming_the_fix(first: Path) -> None:
    ranks = [result["refusals"] for result in results(first, "first")]
    for name in REFUSED_AT_START:
        for rank, messages in enumerate(ranks):  # at start, on every rank alike
            message = messages[name]
            assert "cannot save" in message and "nothing was written" in message, (name, rank)
            assert "snapshot_mode=SnapshotMode.SHARDED" in message, (name, rank)
            assert "snapshot_mode=SnapshotMode.DCP" in message, (name, rank)
            assert "StateDictOptions(full_state_dict=True)" in message, (name, rank)
    assert "models['main'].body.0.weight" in ranks[0]["default"]
    assert "target['optimizer'].param_groups[0][0]" in ranks[0]["object_optimizer"]
    assert "target.state_dict()['tensors']['body.0.weight']" in ranks[1]["object_custom"]
    # Sharded tensors only an extension's state holds are found when the saver takes it.
    assert "the state of extension 'Average'" in ranks[0]["extension_state"]
    assert "snapshot_mode=SnapshotMode.SHARDED" in ranks[0]["extension_state"]
    assert ranks[1]["extension_state"] == "no error"  # it saves nothing
    assert [p for p in (first / "refusals").rglob("*") if p.is_file()] == []


@pytest.mark.slow
def test_sharded_snapshot_of_fsdp2_resumes_mid_epoch_bit_exactly_on_every_rank(
    first: Path,
) -> None:
    run_phase(first, "--phase", "resume")
    straight = [result["straight"] for result in results(first, "first")]
    # Dropout with per-rank seeds: each rank's RNG differs, and each must resume with its own.
    assert not torch.equal(straight[0]["rng"], straight[1]["rng"])
    for rank, result in enumerate(results(first, "resume")):
        resumed = result["resumed"]
        assert resumed["loaded_from"] == f"snapshot_12/{rank}"  # mid-epoch 2
        assert resumed["iteration"] == straight[rank]["iteration"] == 16
        for key, value in straight[rank]["weights"].items():
            assert torch.equal(resumed["weights"][key], value), (rank, key)
        assert torch.equal(resumed["rng"], straight[rank]["rng"]), rank


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_sharded_snapshot_of_fsdp2_refuses_another_world_size(first: Path, world: int) -> None:
    out = first / f"world{world}"
    run_phase(out, "--phase", "reshard", processes=world)
    for rank, result in enumerate(results(out, "reshard", world)):
        refusal = result["refusal"]
        assert f"written by 2 ranks and this run has {world}" in refusal, (rank, refusal)
        assert "Resume with 2 processes" in refusal, rank
        assert "SnapshotMode.DCP snapshots reshard" in refusal, rank
    assert sorted(p.name for p in (out / "run").iterdir()) == [
        "snapshot_12",
        "snapshot_4",
        "snapshot_8",
    ]  # nothing written, nothing removed


@pytest.mark.slow
def test_fsdp2_gradient_accumulation_equals_a_single_process_on_the_combined_batches(
    tmp_path: Path,
) -> None:
    # grad_accumulation_steps=2: FSDP2 reduces only at each window's last batch
    # (set_requires_gradient_sync(False) before), as one process stepping every 2 batches.
    run_phase(tmp_path, "--phase", "accumulate")
    model = single_process(accumulate=2)
    first = results(tmp_path, "accumulate")[0]["accumulated"]["weights"]
    assert max_difference(first, single_process()) > 1e-4  # accumulating changed the run
    for rank, result in enumerate(results(tmp_path, "accumulate")):
        accumulated = result["accumulated"]
        assert accumulated["iteration"] == 16, rank
        assert max_difference(accumulated["weights"], model) < 1e-6, rank
        assert accumulated["unreduced"] == [True] * 8, rank
