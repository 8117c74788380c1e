"""The process group's lifecycle when ppe-core creates it: a clean exit on every rank, and a
frozen peer failing the others within the configured timeout with an error that says so."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import ppe_core as ppe
from ppe_core.distributed import DistributedEnvironmentError
from ppe_core.errors import ConfigurationError

SCRIPT = Path(__file__).parent / "scripts" / "ddp_lifecycle.py"
EXAMPLE = Path(__file__).parent.parent / "examples" / "train_ddp.py"
_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PPE_", "DDP_TEST_", "OMPI_")) and k not in _LAUNCH_VARIABLES
    }
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def torchrun(mode: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Runs the lifecycle script in two gloo processes; ``(result, seconds it took)``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", str(SCRIPT), mode]
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env=_env(**env), check=False
    )
    return result, time.monotonic() - started


# A clean exit -----------------------------------------------------------------------------


#: Runs per exit test. The race these two tests guard (a gloo worker freeing a collective's
#: tensors after the interpreter began finalizing) aborted about 1 run in 10 on a loaded
#: machine before the fix; the two tests' 21 exits catch such a regression with about 89%
#: probability per suite run (each run costs about 5 s of the suite's 15-minute budget).
EXIT_RUNS = 10


@pytest.mark.slow
def test_consecutive_torchrun_runs_exit_0() -> None:
    # Each run trains with DDP, evaluates (an all-reduce) as its last collective and returns
    # with no teardown of its own; rank 1 is the slower one, so rank 0 reaches exit first.
    # The script exits 3 if the group is still alive when the interpreter starts finalizing.
    for run in range(EXIT_RUNS):
        result, _ = torchrun("finish")
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"run {run + 1}: {output[-4000:]}"
        assert "terminate called" not in output, f"run {run + 1}: {output[-4000:]}"
        assert result.stdout.count("val/loss") == 1, result.stdout  # rank 0 got to the end


@pytest.mark.slow
def test_reruns_of_the_example_on_a_finished_directory_exit_0(tmp_path: Path) -> None:
    # The scenario: the README's torchrun command run again on its finished output
    # directory (it resumes, trains nothing, evaluates with an all-reduce and exits). Before
    # ppe-core's collectives kept their work handles until exit, about 1 such run in 10 aborted
    # on a loaded machine: a gloo worker freed a collective's tensors after the interpreter had
    # begun finalizing ("terminate called without an active exception", torchrun returned 1).
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", str(EXAMPLE), "--epochs", "1"]
    for run in range(EXIT_RUNS + 1):  # one that trains, then the reruns
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=180,
            env=_env(),
            cwd=tmp_path,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"run {run + 1}: {output[-4000:]}"
        assert "terminate called" not in output, f"run {run + 1}: {output[-4000:]}"
        assert "(2 processes)" in result.stdout


@pytest.mark.slow
def test_the_example_writes_into_a_directory_per_world_size(tmp_path: Path) -> None:
    # A one-process run and a torchrun run with the default --out must not resume each other.
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert [p.name for p in (tmp_path / "result_ddp").iterdir()] == ["world1"]
    assert (tmp_path / "result_ddp" / "world1" / "log").is_file()


# A frozen peer ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "where"),
    [("stall-train", "while training"), ("stall-eval", "all-reducing the evaluation")],
)
def test_a_frozen_rank_fails_the_others_within_the_timeout(mode: str, where: str) -> None:
    # Rank 1 freezes for 40 s; with PPE_DISTRIBUTED_TIMEOUT=4 rank 0 must give up after about
    # 4 s with an error naming the timeout and how to change it, and torchrun must fail. (The
    # frozen rank then dies of torchrun's SIGTERM, so the run takes seconds, not 4 + 30.)
    result, seconds = torchrun(mode, PPE_DISTRIBUTED_TIMEOUT="4", DDP_TEST_STALL="40")
    assert result.returncode != 0, result.stdout
    assert "rank 1 resumed" not in result.stdout  # the run ended before the peer woke up
    assert seconds < 40, seconds
    waited = re.search(r"rank 0 waited ([\d.]+) s", result.stdout)
    assert waited is not None, result.stdout + result.stderr[-4000:]
    assert 3.5 < float(waited.group(1)) < 4 + 15
    message = re.search(r"CollectiveTimeoutError: (.*)", result.stderr)
    assert message is not None, result.stderr[-4000:]
    text = message.group(1)
    for phrase in (
        "rank 0 waited longer than the process group's timeout",
        where,
        "a peer rank stopped responding",
        "its timeout of 4 s",
        "init_from_env(timeout=<seconds>)",
        "PPE_DISTRIBUTED_TIMEOUT=<seconds>",
    ):
        assert phrase in text, text


# Without a launcher -----------------------------------------------------------------------


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """torchrun's variables for a world of one, on a free port, and no timeout variable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PPE_DISTRIBUTED_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    variables = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**variables, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    yield monkeypatch
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_the_default_timeout_is_ten_minutes_and_the_variable_or_argument_replace_it() -> None:
    from ppe_core.distributed._env import _resolve_timeout

    assert ppe.distributed.DEFAULT_TIMEOUT == 600
    assert _resolve_timeout(None, {}) == timedelta(minutes=10)
    assert _resolve_timeout(None, {"PPE_DISTRIBUTED_TIMEOUT": " 45 "}) == timedelta(seconds=45)
    assert _resolve_timeout(30, {"PPE_DISTRIBUTED_TIMEOUT": "45"}) == timedelta(seconds=30)
    assert _resolve_timeout(timedelta(hours=1), {}) == timedelta(hours=1)
    with pytest.raises(ConfigurationError, match="timeout must be positive"):
        _resolve_timeout(0, {})


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf"])
def test_a_bad_timeout_variable_raises_before_any_group_exists(
    world_of_one: pytest.MonkeyPatch, value: str
) -> None:
    world_of_one.setenv("PPE_DISTRIBUTED_TIMEOUT", value)
    with pytest.raises(DistributedEnvironmentError, match=r"PPE_DISTRIBUTED_TIMEOUT=.*positive"):
        ppe.distributed.init_from_env("cpu")
    assert not torch.distributed.is_initialized()


def test_shutdown_destroys_the_group_and_is_harmless_without_one(
    world_of_one: pytest.MonkeyPatch,
) -> None:
    ppe.distributed.shutdown()  # no group: nothing to do
    assert ppe.distributed.init_from_env("cpu", timeout=30) == (1, 0, 0)
    assert ppe.distributed.is_distributed()
    ppe.distributed.shutdown()
    assert not ppe.distributed.is_distributed()
    ppe.distributed.shutdown()


def test_only_a_collective_timeout_becomes_a_collective_timeout_error() -> None:
    from ppe_core.distributed import CollectiveTimeoutError
    from ppe_core.distributed._env import timeout_error

    gloo = RuntimeError("[gloo/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation")
    error = timeout_error(gloo, "testing")
    assert isinstance(error, CollectiveTimeoutError) and isinstance(error, RuntimeError)
    assert "while testing" in str(error) and "Timed out waiting 3000ms" in str(error)
    assert timeout_error(RuntimeError("Connection closed by peer"), "testing") is None
    assert timeout_error(ValueError("timed out"), "testing") is None  # not a backend's error
    assert timeout_error(error, "testing") is None  # already explained


def test_timeouts_explained_raises_a_timeout_in_its_block_explained_and_others_unchanged() -> None:
    from ppe_core.distributed import CollectiveTimeoutError, timeouts_explained

    gloo = RuntimeError("[gloo/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation")
    with (
        pytest.raises(CollectiveTimeoutError, match="while reducing") as caught,
        timeouts_explained("reducing"),
    ):
        raise gloo
    assert caught.value.__cause__ is gloo
    other = RuntimeError("Connection closed by peer")
    with pytest.raises(RuntimeError) as passed, timeouts_explained("reducing"):
        raise other
    assert passed.value is other
    with timeouts_explained("reducing"):
        pass  # nothing raised: nothing happens
