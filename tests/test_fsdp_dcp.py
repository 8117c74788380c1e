"""``SnapshotMode.DCP``: FSDP2 snapshots on torch.distributed.checkpoint, saved asynchronously,
atomic (a kill during a save leaves the previous one), verified (a damaged shard is skipped)
and resharded on load. Under torchrun (gloo) with ``scripts/fsdp_training.py --mode dcp``;
the file helpers alone, without processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import launch
from ppe_extensions import _snapshot_dcp as files
from test_snapshot_background import world_of_one  # noqa: F401  (a 1-process gloo group)

import ppe_core as ppe
from ppe_core.__main__ import main as cli
from ppe_core.errors import ConfigurationError, SnapshotError, SnapshotVerificationWarning
from ppe_core.training.extensions import export_snapshot

SCRIPTS = Path(__file__).parent / "scripts"
FSDP = SCRIPTS / "fsdp_training.py"
sys.path.insert(0, str(SCRIPTS))


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def results(out: Path, phase: str, ranks: int = 2) -> list[dict[str, Any]]:
    return [torch.load(out / f"{phase}_rank{r}.pt", weights_only=True) for r in range(ranks)]


def run_phase(out: Path, *args: str, processes: int = 2, code: int = 0) -> str:
    returned, stderr = launch(FSDP, str(out), "--mode", "dcp", *args, processes=processes)
    assert (returned == 0) == (code == 0), stderr[-4000:]
    return stderr


def assert_same_run(resumed: dict[str, Any], straight: dict[str, Any], rank: int) -> None:
    assert resumed["iteration"] == straight["iteration"] == 16, rank
    for key, value in straight["weights"].items():
        assert torch.equal(resumed["weights"][key], value), (rank, key)
    assert torch.equal(resumed["rng"], straight["rng"]), rank


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks: the straight run and the run stopped at iteration 12 (snapshots every 4),
    with copies of the stopped run taken before anything resumes it."""
    out = tmp_path_factory.mktemp("dcp")
    run_phase(out)
    for copy in ("world1", "damaged"):
        shutil.copytree(out / "run", out / copy / "run")
    return out


@pytest.fixture(scope="module")
def straight(first: Path) -> list[dict[str, Any]]:
    return [result["straight"] for result in results(first, "first")]


@pytest.mark.slow
def test_dcp_snapshot_resumes_mid_epoch_bit_exactly_and_reports_blocked_time(
    first: Path, straight: list[dict[str, Any]]
) -> None:
    run = first / "run"
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == [
        "snapshot_12",
        "snapshot_4",
        "snapshot_8",
    ]
    manifest = files.verify(str(run / "snapshot_12"))
    assert manifest["world_size"] == 2 and manifest["iteration"] == 12
    # each rank its shards, DCP's metadata and each rank's other state
    assert set(manifest["files"]) == {
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "rank0.pt",
        "rank1.pt",
    }
    run_phase(first, "--phase", "resume")
    assert not torch.equal(straight[0]["rng"], straight[1]["rng"])  # per-rank dropout seeds
    for rank, result in enumerate(results(first, "resume")):
        assert result["resumed"]["loaded_from"] == "snapshot_12"
        assert_same_run(result["resumed"], straight[rank], rank)
    for rank, run_result in enumerate(straight):  # one per snapshot, the staging wait added
        blocked = run_result["blocked_times"]
        assert [iteration for iteration, _ in blocked] == [4, 8, 12, 16], rank
        assert all(0 < seconds < 5 for _, seconds in blocked), blocked


@pytest.mark.slow
def test_dcp_snapshot_of_two_ranks_loads_resharded_into_one_process(first: Path) -> None:
    out = first / "world1"
    stderr = run_phase(out, "--phase", "load", processes=1)
    (result,) = results(out, "load", 1)
    loaded = result["loaded"]
    assert loaded["loaded_from"] == "snapshot_12" and loaded["iteration"] == 12
    stopped = results(first, "first")[0]["stopped"]  # its weights are snapshot_12's
    for key, value in stopped["weights"].items():
        assert torch.equal(loaded["weights"][key], value), key
    # The weights resume exactly; each rank's RNG and loader position only approximately.
    assert "WorldSizeMismatchWarning" in stderr and "2 process(es) and this run has 1" in stderr


@pytest.mark.slow
def test_a_damaged_shard_is_skipped_and_resume_falls_back_bit_exactly(
    first: Path, straight: list[dict[str, Any]]
) -> None:
    out = first / "damaged"
    shard = out / "run" / "snapshot_12" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(data)
    stderr = run_phase(out, "--phase", "resume")
    assert "SnapshotVerificationWarning" in stderr and "__1_0.distcp is damaged" in stderr
    for rank, result in enumerate(results(out, "resume")):
        assert result["resumed"]["loaded_from"] == "snapshot_8", rank
        assert_same_run(result["resumed"], straight[rank], rank)


@pytest.mark.slow
def test_a_kill_during_an_async_save_leaves_the_previous_snapshot_and_resume_is_bit_exact(
    tmp_path: Path, straight: list[dict[str, Any]]
) -> None:
    # Both ranks SIGKILLed at iteration 10, while snapshot_8's save is unfinished (its data
    # written, its manifest held back).
    run_phase(tmp_path, "--phase", "kill", code=1)
    run = tmp_path / "run"
    (leftover,) = run.glob(".snapshot_8.*.dcp-tmp")  # named after the killed saver
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [leftover.name, "snapshot_4"]
    run_phase(tmp_path, "--phase", "resume")
    assert not leftover.exists()  # removed when the run started
    for rank, result in enumerate(results(tmp_path, "resume")):
        assert result["resumed"]["loaded_from"] == "snapshot_4", rank
        assert_same_run(result["resumed"], straight[rank], rank)


def _snapshot_dir(out: Path, name: str, iteration: int) -> Path:
    directory = out / name
    directory.mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"shard" * 100)
    (directory / "rank0.pt").write_bytes(b"rest")
    files.write_manifest(str(directory), iteration, 1)
    return directory


def test_verify_finds_damaged_missing_and_unlisted_files(tmp_path: Path) -> None:
    directory = _snapshot_dir(tmp_path, "snapshot_4", 4)
    assert files.verify(str(directory))["files"]["__0_0.distcp"]["size"] == 500
    (directory / "__0_1.distcp").write_bytes(b"")  # a shard DCP would read, unverified
    with pytest.raises(SnapshotError, match=r"not listed: \['__0_1.distcp'\]"):
        files.verify(str(directory))
    (directory / "__0_1.distcp").unlink()
    (directory / "rank0.pt").write_bytes(b"REST")  # same size, other bytes
    with pytest.raises(SnapshotError, match=r"rank0\.pt is damaged"):
        files.verify(str(directory))
    (directory / "rank0.pt").unlink()
    with pytest.raises(SnapshotError, match=r"missing: \['rank0.pt'\]"):
        files.verify(str(directory))
    (directory / files.MANIFEST_NAME).write_text("{")
    with pytest.raises(SnapshotError, match="no readable snapshot manifest"):
        files.verify(str(directory))


def test_newest_valid_falls_back_retain_keeps_the_newest_and_leftovers_go(tmp_path: Path) -> None:
    template = "snapshot_{.iteration}"
    for iteration in (4, 8, 12):
        _snapshot_dir(tmp_path, f"snapshot_{iteration}", iteration)
    (tmp_path / "snapshot_12" / "__0_0.distcp").write_bytes(b"x" * 500)
    with pytest.warns(SnapshotVerificationWarning, match="snapshot_12.*damaged"):
        assert files.newest_valid(str(tmp_path), template) == str(tmp_path / "snapshot_8")
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    leftover = Path(
        files.temporary_dir(str(tmp_path / "snapshot_16"), f"{files.writer_tag()[:8]}-{dead.pid}")
    )
    live = Path(files.temporary_dir(str(tmp_path / "snapshot_20"), files.writer_tag()))
    leftover.mkdir()
    live.mkdir()
    assert files.remove_leftovers(str(tmp_path), template) == [str(leftover)]
    assert not leftover.exists()
    live.rmdir()  # this process's: never removed
    files.retain(str(tmp_path), template, 2)
    assert sorted(os.listdir(tmp_path)) == ["snapshot_12", "snapshot_8"]


def test_publish_renames_into_place_and_replaces_an_older_directory(tmp_path: Path) -> None:
    final = tmp_path / "snapshot_4"
    for content in (b"old", b"new"):
        temporary = Path(files.temporary_dir(str(final), files.writer_tag()))
        temporary.mkdir()
        (temporary / "rank0.pt").write_bytes(content)
        files.publish(str(temporary), str(final))
        assert not temporary.exists()
    assert (final / "rank0.pt").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["snapshot_4"]


def _same_state(a: Any, b: Any) -> bool:
    """Whether two nested states hold equal values, tensors compared bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.slow
def test_dcp_snapshot_of_one_process_resumes_resharded_on_two_ranks(tmp_path: Path) -> None:
    # One process trains to iteration 12 (snapshots every 4), then 2 ranks resume from it and
    # stop at once: their shards hold the saved full state.
    run_phase(tmp_path, "--phase", "load", processes=1)
    (alone,) = results(tmp_path, "load", 1)
    saved = alone["loaded"]
    assert saved["loaded_from"] is None and saved["iteration"] == 12
    assert files.verify(str(tmp_path / "run" / "snapshot_12"))["world_size"] == 1
    stderr = run_phase(tmp_path, "--phase", "load")
    resumed = [result["loaded"] for result in results(tmp_path, "load")]
    for rank, loaded in enumerate(resumed):
        assert loaded["loaded_from"] == "snapshot_12" and loaded["iteration"] == 12, rank
        # Exactly: the weights and the optimizer states (AdamW's moments and step counts).
        for key, value in saved["weights"].items():
            assert torch.equal(loaded["weights"][key], value), (rank, key)
        assert _same_state(loaded["optimizer"], saved["optimizer"]), rank
    assert "WorldSizeMismatchWarning" in stderr and "1 process(es) and this run has 2" in stderr
    # Approximately: both ranks restore the one saving process's RNG states (applied when
    # training goes on), so their dropout masks, different in a 2-rank run, are the same.
    run_phase(tmp_path, "--phase", "resume")
    finished = [result["resumed"] for result in results(tmp_path, "resume")]
    assert [result["iteration"] for result in finished] == [16, 16]
    assert torch.equal(finished[0]["rng"], finished[1]["rng"])


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DDP model (replicated) with SnapshotMode.DCP and n_retains=2: the straight run and
    the run stopped at iteration 12, then resumed to the end."""
    out = tmp_path_factory.mktemp("ddp_dcp")
    run_phase(out, "--model", "ddp", "--n-retains", "2")
    run_phase(out, "--phase", "resume", "--model", "ddp", "--n-retains", "2")
    return out


@pytest.mark.slow
def test_dcp_snapshot_of_a_ddp_model_resumes_bit_exactly_saving_replicas_once(ddp: Path) -> None:
    straight = [result["straight"] for result in results(ddp, "first")]
    assert not torch.equal(straight[0]["rng"], straight[1]["rng"])  # per-rank dropout seeds
    for rank, result in enumerate(results(ddp, "resume")):
        assert result["resumed"]["loaded_from"] == "snapshot_12", rank
        assert_same_run(result["resumed"], straight[rank], rank)
        assert _same_state(result["resumed"]["optimizer"], straight[rank]["optimizer"]), rank
    # Replicated tensors are written once (by one rank), not once per rank: DCP's metadata
    # stores each tensor as one chunk, in one rank's file.
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(ddp / "run" / "snapshot_16")).read_metadata()
    tensors = [k for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks")]
    assert len(tensors) == 4 + 4 * 3  # 4 parameters, AdamW's step, exp_avg, exp_avg_sq
    assert all(len(metadata.state_dict_metadata[k].chunks) == 1 for k in tensors)  # type: ignore[attr-defined]
    stored = [index.fqn for index in metadata.storage_data]
    assert all(stored.count(k) == 1 for k in tensors)
    where = {info.relative_path for info in metadata.storage_data.values()}
    assert where == {"__0_0.distcp", "__1_0.distcp"}  # the work shared by both ranks


@pytest.mark.slow
def test_n_retains_under_torchrun_keeps_the_newest_snapshots_each_loadable(ddp: Path) -> None:
    for run in ("straight", "run"):
        kept = sorted(p.name for p in (ddp / run).iterdir())
        assert kept == ["snapshot_12", "snapshot_16"], (run, kept)
        for name in kept:
            assert files.verify(str(ddp / run / name))["world_size"] == 2
    # Each one loads: the stopped run resumed from snapshot_12 (above), and both of the
    # straight run's export to one state_dict, the last one holding its final weights.
    final = results(ddp, "first")[0]["straight"]["weights"]
    for name in ("snapshot_12", "snapshot_16"):
        exported = export_snapshot(ddp / "straight" / name, ddp / f"{name}.pt")
        loaded = torch.load(ddp / f"{name}.pt", weights_only=True)
        assert sorted(loaded) == sorted(final) == sorted(exported)
    for key, value in final.items():
        assert torch.equal(loaded[key], value), key


@pytest.mark.slow
def test_export_snapshot_writes_one_state_dict_file_the_model_loads(
    first: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import fsdp_training

    # 2 ranks' shards of snapshot_12 joined into one ordinary file, by the CLI.
    assert cli(["export-snapshot", str(first / "run" / "snapshot_12"), str(tmp_path / "m.pt")]) == 0
    assert "wrote" in capsys.readouterr().out
    model = fsdp_training.Net()
    model.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    stopped = results(first, "first")[0]["stopped"]  # its weights are snapshot_12's
    for key, value in model.state_dict().items():
        assert torch.equal(value, stopped["weights"][key]), key


@pytest.mark.slow
def test_export_snapshot_refuses_a_damaged_or_unfinished_snapshot(
    first: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "snapshot_12"
    shutil.copytree(first / "run" / "snapshot_12", damaged)
    shard = damaged / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(data)
    with pytest.raises(SnapshotError, match=r"refusing to export .*__0_0\.distcp is damaged"):
        export_snapshot(damaged, tmp_path / "m.pt")
    assert cli(["export-snapshot", str(damaged), str(tmp_path / "m.pt")]) == 1
    assert "error: refusing to export" in capsys.readouterr().err
    (damaged / files.MANIFEST_NAME).unlink()  # as a save that never finished leaves it
    with pytest.raises(SnapshotError, match="no readable snapshot manifest"):
        export_snapshot(damaged, tmp_path / "m.pt")
    with pytest.raises(SnapshotError, match=r"holds no model 'other'; it holds \['main'\]"):
        export_snapshot(first / "run" / "snapshot_12", tmp_path / "m.pt", model="other")
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize(
    ("given", "names"),
    [
        ({"writer": ppe.writing.SimpleWriter()}, "does not take writer: DCP writes its files"),
        ({"savefun": torch.save}, "does not take savefun: DCP serializes the tensors itself"),
        (
            {"snapshot_on_error": True},
            "does not take snapshot_on_error: a DCP save is a collective",
        ),
        ({"filename": lambda m: "s"}, "names its directories with a str template"),
        ({"target": {"model": torch.nn.Linear(2, 2), "n": [1]}}, r"n \(list\) is neither"),
    ],
)
@pytest.mark.usefixtures("world_of_one")
def test_dcp_mode_refuses_what_it_cannot_do_at_construction_naming_the_fix(
    given: dict[str, Any], names: str
) -> None:
    E = ppe.training.extensions
    with pytest.raises(ConfigurationError, match=names) as raised:
        E.snapshot(saver_rank=0, snapshot_mode=E.SnapshotMode.DCP, **given)
    assert "SnapshotMode.SHARDED" in str(raised.value) or "filename" in given


@pytest.mark.usefixtures("world_of_one")
def test_dcp_mode_saves_a_target_when_the_saver_s_condition_says_and_resumes_it(
    tmp_path: Path,
) -> None:
    E = ppe.training.extensions
    data = [{"x": torch.randn(4, 3), "t": torch.randint(0, 2, (4,))} for _ in range(8)]

    def train(stop: int, autoload: bool) -> tuple[Any, Any, torch.nn.Module]:
        torch.manual_seed(0)
        model = ppe.to(Tiny(), "cpu")
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        calls: list[int] = []

        def every_other() -> bool:  # asked at each trigger: True at iterations 4 and 8
            calls.append(1)
            return len(calls) % 2 == 0

        snap = E.snapshot(
            filename="target_{.iteration}",
            target={"net": model, "adam": opt},
            condition=every_other,
            autoload=autoload,
            saver_rank=0,
            snapshot_mode=E.SnapshotMode.DCP,
        )
        trainer = ppe.engine.create_trainer(
            model, opt, 1, out_dir=str(tmp_path / "out"), stop_trigger=(stop, "iteration")
        )
        trainer.extend(snap, trigger=(2, "iteration"))
        trainer.run(data)
        return snap, opt, model

    _, opt, model = train(8, autoload=False)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("target")) == [
        "target_4",
        "target_8",
    ]
    manifest = files.verify(str(out / "target_8"))
    assert not [f for f in manifest["files"] if f.startswith("rank")]  # the target alone
    exported = export_snapshot(out / "target_8", tmp_path / "net.pt", model="net")
    for key, value in model.state_dict().items():
        assert torch.equal(exported[key], value), key
    # A new run autoloads the target and steps once more on the first batch: the same as the
    # saved model and AdamW state stepping once more by hand.
    opt.zero_grad()
    model(**data[0])["loss"].backward()
    opt.step()
    snap, opt2, model2 = train(1, autoload=True)
    assert snap.loaded_from == str(out / "target_8")
    for key, value in model.state_dict().items():
        assert torch.equal(model2.state_dict()[key], value), key
    assert _same_state(opt2.state_dict(), opt.state_dict())


@pytest.mark.usefixtures("world_of_one")
def test_an_optimizer_pre_hook_added_after_a_dcp_save_runs_and_the_step_waits_for_staging(
    tmp_path: Path,
) -> None:
    # The snapshot's step pre-hook (waiting for staging) once removed itself while the
    # optimizer iterated over its hooks: a hook registered between a save and the next step
    # (here by the model's forward of iteration 3, after the snapshot of iteration 2) made
    # that step raise "OrderedDict mutated during iteration".
    E = ppe.training.extensions
    calls: list[int] = []

    class Hooking(Tiny):
        forwards = 0

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            Hooking.forwards += 1
            if Hooking.forwards == 3:
                opt.register_step_pre_hook(lambda *_: calls.append(Hooking.forwards))
            return super().forward(x, t)

    torch.manual_seed(0)
    model = ppe.to(Hooking(), "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    snap = E.snapshot(saver_rank=0, snapshot_mode=E.SnapshotMode.DCP)
    trainer = ppe.engine.create_trainer(model, opt, 1, out_dir=str(tmp_path / "out"))
    trainer.extend(snap, trigger=(2, "iteration"))
    data = [{"x": torch.randn(4, 3), "t": torch.randint(0, 2, (4,))} for _ in range(6)]
    trainer.run(data)
    assert calls == [3, 4, 5, 6]  # the user's hook ran at every step from the third on
    assert [it for it, _ in snap.blocked_times] == [2, 4, 6]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == [
        "snapshot_iter_2",
        "snapshot_iter_4",
        "snapshot_iter_6",
    ]
