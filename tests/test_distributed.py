"""Distributed training on torch.distributed: real two-process runs (torchrun, gloo on CPU),
and the rank helpers, environment errors and evaluator semantics without a process group."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._snapshot import load_snapshot

import ppe_core as ppe
from ppe_core.distributed import DistributedEnvironmentError
from ppe_core.errors import ConfigurationError, WorldSizeMismatchWarning

SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = SCRIPTS / "ddp_training.py"
EXAMPLE = Path(__file__).parent.parent / "examples" / "train_ddp.py"
sys.path.insert(0, str(SCRIPTS))
import ddp_training  # noqa: E402  (the script's model and data, for the single-process checks)

_LAUNCH_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PPE_", "DDP_TEST_")) and k not in _LAUNCH_VARIABLES
    }
    env.update(extra)
    return env


def torchrun(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in two gloo processes on this machine."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", str(script), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=180, env=_env(**env), check=False
    )


def results(out: Path, ranks: int = 2) -> list[dict[str, Any]]:
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(ranks)]


def snapshot_names(out: Path) -> list[str]:
    return sorted(
        (p.name for p in out.glob("snapshot_*")), key=lambda name: int(name.split("_")[1])
    )


def whole_set_loss(weights: dict[str, torch.Tensor]) -> float:
    """The validation loss over all 37 samples, computed directly in this process."""
    net = ddp_training.Net()
    net.load_state_dict(weights)
    _, val = ddp_training.dataset()
    x = torch.stack([s["x"] for s in val])
    t = torch.stack([s["t"] for s in val])
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(net.body(x), t).item()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One uninterrupted two-process run, shared by the tests that read its results."""
    out = tmp_path_factory.mktemp("ddp")
    result = torchrun(SCRIPT, str(out))
    assert result.returncode == 0, result.stderr[-4000:]
    return out, results(out)


@pytest.mark.slow
def test_ranks_end_with_identical_weights(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    _, (rank0, rank1) = two_ranks
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["iteration"] == rank1["iteration"] == 24  # 32 samples per rank, batches of 4
    for key, value in rank0["weights"].items():
        assert torch.equal(value, rank1["weights"][key]), key
    untrained = ddp_training.Net().state_dict()
    assert not torch.equal(untrained["body.0.weight"], rank0["weights"]["body.0.weight"])


@pytest.mark.slow
def test_distributed_val_loss_is_the_mean_over_the_whole_odd_sized_set(
    two_ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, (rank0, rank1) = two_ranks
    # 37 samples: rank 0 has 19 (batches 5, 5, 5, 4), rank 1 has 18 (5, 5, 5, 3).
    assert (rank0["val_samples"], rank1["val_samples"]) == (19, 18)
    assert rank0["means"] == rank1["means"]  # identical on every rank
    expected = whole_set_loss(rank0["weights"])
    assert rank0["means"]["val/loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_only_rank_0_writes_snapshots(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    out, (rank0, rank1) = two_ranks
    expected = [f"snapshot_{i}" for i in range(4, 25, 4)]
    assert snapshot_names(out) == expected
    assert not any(name.startswith(("snapshot", ".snapshot")) for name in rank1["written"])
    assert [n for n in rank0["written"] if n.startswith("snapshot")] == expected


@pytest.mark.slow
def test_only_rank_0_writes_the_log(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    _, (rank0, rank1) = two_ranks
    assert "log" in rank0["written"]
    assert "log" not in rank1["written"]


@pytest.mark.slow
def test_ddp_snapshot_loads_into_an_unwrapped_model_and_resumes(
    two_ranks: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    out, (rank0, _) = two_ranks
    state = load_snapshot(str(out / "snapshot_24"))
    net = ddp_training.Net()
    net.load_state_dict(state["models"]["main"])  # keys without DDP's "module." prefix
    for key, value in rank0["weights"].items():
        assert torch.equal(net.state_dict()[key], value), key
    # ... and a plain single-process trainer resumes from the DDP run's snapshot.
    shutil.copy(out / "snapshot_16", tmp_path / "snapshot_16")
    shutil.copy(out / ".snapshot_16.manifest.json", tmp_path / ".snapshot_16.manifest.json")
    model = ppe.to(ddp_training.Net(), "cpu")
    snapshot = ppe.training.extensions.snapshot(autoload=True, filename="snapshot_{.iteration}")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.2),
        3,
        out_dir=str(tmp_path),
        extensions=[snapshot],
    )
    train, _ = ddp_training.dataset()
    with pytest.warns(WorldSizeMismatchWarning, match=r"2 process\(es\) and this run has 1"):
        trainer.run(torch.utils.data.DataLoader(train[:32], batch_size=4))  # type: ignore[arg-type]
    assert snapshot.loaded_from == str(tmp_path / "snapshot_16")
    assert trainer.iteration == 24  # resumed at 16 (epoch 2 of 8 batches), 8 more steps
    single = load_snapshot(str(tmp_path / "snapshot_24"))
    assert single["models"]["main"].keys() == state["models"]["main"].keys()
    assert single["optimizers"]["main"].keys() == state["optimizers"]["main"].keys()


@pytest.mark.slow
def test_killed_run_resumes_from_the_snapshot_on_both_ranks(
    two_ranks: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, uninterrupted = two_ranks
    killed = torchrun(SCRIPT, str(tmp_path), DDP_TEST_EXIT_AT_ITERATION="12")
    assert killed.returncode != 0
    assert not (tmp_path / "rank0.pt").exists()
    assert snapshot_names(tmp_path) == ["snapshot_4", "snapshot_8", "snapshot_12"]
    resumed = torchrun(SCRIPT, str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    ranks = results(tmp_path)
    for rank in ranks:
        assert rank["loaded_from"] == "snapshot_12"  # mid-epoch 2 on both ranks
        assert rank["iteration"] == 24
        for key, value in uninterrupted[0]["weights"].items():
            assert torch.equal(rank["weights"][key], value), key
    assert ranks[0]["means"] == uninterrupted[0]["means"]


@pytest.mark.slow
def test_ranks_that_find_different_snapshots_all_raise_instead_of_diverging(
    two_ranks: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    out, _ = two_ranks
    (tmp_path / "r0").mkdir()  # rank 0's directory holds a snapshot, rank 1's does not
    for name in ("snapshot_8", ".snapshot_8.manifest.json"):
        shutil.copy(out / name, tmp_path / "r0" / name)
    result = torchrun(SCRIPT, str(tmp_path), DDP_TEST_OUT_PER_RANK="1")
    assert result.returncode != 0
    assert result.stderr.count("autoload found different snapshots") >= 2, result.stderr[-4000:]
    assert "rank 0: snapshot_8, rank 1: nothing" in result.stderr
    assert not list(tmp_path.glob("r*/rank*.pt"))


@pytest.mark.slow
def test_the_same_script_trains_as_one_plain_process(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (alone,) = results(tmp_path, ranks=1)
    assert alone["world_size"] == 1
    assert alone["iteration"] == 16  # 64 samples in batches of 4, one process
    assert alone["val_samples"] == 37
    assert alone["means"]["val/loss"] == pytest.approx(whole_set_loss(alone["weights"]), rel=1e-5)
    assert snapshot_names(tmp_path) == ["snapshot_4", "snapshot_8", "snapshot_12", "snapshot_16"]


@pytest.mark.slow
def test_the_example_runs_alone_and_under_torchrun(tmp_path: Path) -> None:
    alone = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path / "one"), "--epochs", "3"],
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(OMP_NUM_THREADS="1"),
        check=False,
    )
    assert alone.returncode == 0, alone.stderr[-4000:]
    two = torchrun(EXAMPLE, "--out", str(tmp_path / "two"), "--epochs", "3")
    assert two.returncode == 0, two.stderr[-4000:]
    for result, processes in ((alone, 1), (two, 2)):
        finals = [line for line in result.stdout.splitlines() if line.startswith("final")]
        assert len(finals) == 1, result.stdout  # printed by rank 0 only
        accuracy = float(finals[0].split()[3])
        assert accuracy > 0.85, finals
        assert finals[0].endswith(f"({processes} processes)")
        headers = [line for line in result.stdout.splitlines() if line.startswith("epoch")]
        assert len(headers) == 1  # one table
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [
        ".snapshot_iter_32.manifest.json",
        ".snapshot_iter_48.manifest.json",
        "log",
        "snapshot_iter_32",
        "snapshot_iter_48",
    ]


# Without a process group ------------------------------------------------------------------


@pytest.fixture
def unlaunched(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_helpers_answer_as_a_single_process_when_not_launched(
    unlaunched: pytest.MonkeyPatch,
) -> None:
    d = ppe.distributed
    assert d.init_from_env("cpu") == (1, 0, 0)
    assert not torch.distributed.is_initialized()  # nothing was started
    assert (d.get_rank(), d.get_world_size(), d.get_local_rank()) == (0, 1, 0)
    assert d.is_main_process() and not d.is_distributed()
    d.barrier()  # a no-op, not a hang or an error


def test_helpers_read_the_launcher_before_the_group_exists(
    unlaunched: pytest.MonkeyPatch,
) -> None:
    unlaunched.setenv("WORLD_SIZE", "4")
    unlaunched.setenv("RANK", "3")
    unlaunched.setenv("LOCAL_RANK", "1")
    d = ppe.distributed
    assert (d.get_rank(), d.get_world_size(), d.get_local_rank()) == (3, 4, 1)
    assert not d.is_main_process()
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        unlaunched.delenv(name)
    unlaunched.setenv("OMPI_COMM_WORLD_SIZE", "2")
    unlaunched.setenv("OMPI_COMM_WORLD_RANK", "1")
    unlaunched.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert (d.get_rank(), d.get_world_size(), d.get_local_rank()) == (1, 2, 1)


def test_backend_follows_the_device_type() -> None:
    d = ppe.distributed
    assert d.backend_for("cpu") == "gloo"
    assert d.backend_for(torch.device("cpu")) == "gloo"
    assert d.backend_for(None) is None
    with pytest.raises(ConfigurationError, match="not a device string"):
        d.backend_for("cpu:first")
    with pytest.raises(TypeError, match="must be a str or torch"):
        d.backend_for(0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="no collective backend"):
        d.backend_for("meta")


def test_bad_backend_and_timeout_types_raise(unlaunched: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="backend must be a backend name"):
        ppe.distributed.init_from_env(backend=1)  # type: ignore[arg-type]
    for name, value in {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1",
    }.items():
        unlaunched.setenv(name, value)
    with pytest.raises(TypeError, match="timeout must be seconds"):
        ppe.distributed.init_from_env("cpu", timeout="10")  # type: ignore[arg-type]
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(
    ("variables", "phrase"),
    [
        ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR is not"),
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "RANK is not"),
        ({"WORLD_SIZE": "two", "RANK": "0"}, "not an integer"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "ranks are 0"),
        ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h"}, "MASTER_PORT is not"),
        ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "x"}, "port number"),
    ],
)
def test_inconsistent_launch_variables_raise_naming_the_fix(
    unlaunched: pytest.MonkeyPatch, variables: dict[str, str], phrase: str
) -> None:
    for name, value in variables.items():
        unlaunched.setenv(name, value)
    with pytest.raises(DistributedEnvironmentError, match=phrase) as info:
        ppe.distributed.init_from_env("cpu")
    assert isinstance(info.value, ValueError)
    assert not torch.distributed.is_initialized()


def test_single_node_mpirun_needs_no_master_address(unlaunched: pytest.MonkeyPatch) -> None:
    from ppe_core.distributed._env import _launch_variables, _rendezvous

    unlaunched.setenv("OMPI_COMM_WORLD_SIZE", "2")
    unlaunched.setenv("OMPI_COMM_WORLD_RANK", "1")
    unlaunched.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    assert _launch_variables(os.environ) == ("mpirun", 2, 1, 0)
    assert _rendezvous(os.environ, "mpirun", 2) == ("127.0.0.1", "29500")
    unlaunched.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")  # two nodes: rank 0's host is unknown
    with pytest.raises(DistributedEnvironmentError, match="mpirun -x MASTER_ADDR"):
        _rendezvous(os.environ, "mpirun", 2)


def test_a_world_of_one_under_torchrun_variables_gets_a_gloo_group(
    unlaunched: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as s:  # a free port for rank 0's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}.items():
        unlaunched.setenv(name, value)
    unlaunched.setenv("MASTER_ADDR", "127.0.0.1")
    unlaunched.setenv("MASTER_PORT", str(port))
    try:
        assert ppe.distributed.init_from_env("cpu") == (1, 0, 0)
        assert torch.distributed.get_backend() == "gloo"
        assert ppe.distributed.is_distributed()
        assert ppe.distributed.init_from_env("cpu") == (1, 0, 0)  # twice: kept, no error
        ppe.distributed.barrier()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_distributed_evaluator_without_a_group_raises() -> None:
    model = ppe.to(ddp_training.Net(), "cpu")
    with pytest.raises(RuntimeError, match="init_process_group"):
        ppe.engine.create_evaluator(model, distributed=True)


def test_evaluator_mean_is_per_sample_when_the_last_batch_is_smaller() -> None:
    model = ppe.to(ddp_training.Net(), "cpu")
    _, val = ddp_training.dataset()  # 37 samples: 5 batches of 8, the last of 5
    loader = torch.utils.data.DataLoader(val, batch_size=8)  # type: ignore[arg-type]
    means = ppe.engine.create_evaluator(model).run(loader)
    expected = whole_set_loss(model.state_dict())
    assert float(means["val/loss"]) == pytest.approx(expected, rel=1e-6)
    with torch.no_grad():
        batch_means = [float(model(**b)["loss"]) for b in loader]
    assert float(means["val/loss"]) != pytest.approx(sum(batch_means) / 5, rel=1e-6)


def test_evaluator_batch_size_comes_from_the_first_tensor_of_the_batch() -> None:
    from collections import namedtuple

    from ppe_core.training._sample_means import batch_size as _batch_size

    Pair = namedtuple("Pair", "x t")
    x = torch.zeros(7, 3)
    assert _batch_size(x) == 7
    assert _batch_size({"x": x, "t": torch.zeros(7)}) == 7
    assert _batch_size((x, torch.zeros(7))) == 7
    assert _batch_size(Pair(x, torch.zeros(7))) == 7
    assert _batch_size({"meta": "a", "inputs": [torch.tensor(1.0), x]}) == 7
    assert _batch_size(["no", "tensors"]) == 1


_WITHOUT_NUMPY = """
import sys
class HideNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, HideNumpy())
import ppe_core as ppe
try:
    ppe.distributed.init_from_env("cpu")
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


def test_several_processes_without_numpy_are_refused_before_the_group_starts() -> None:
    # torch runs without numpy, but its object collectives (which every multi-process run
    # uses at start) read through it: the launch says so at once, before any rendezvous.
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",  # nothing listens: a rendezvous attempt would fail differently
    }
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NUMPY],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "OptionalDependencyError" in done.stdout, done.stdout + done.stderr
    assert "training with 2 processes" in done.stdout and "pip install numpy" in done.stdout
