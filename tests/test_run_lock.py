"""One run per output directory: a second process is refused, a dead holder is taken over.

Real processes hold the directory (run_lock_helpers.Holder: tests/scripts/locked_training.py
pauses while training); the second run is this test process or another real run, also under
torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from run_lock_helpers import SCRIPT, Holder, batches, clean_env, make_trainer

import ppe_core as ppe
from ppe_core.errors import OutputDirectoryInUseError, RunLockWarning
from ppe_core.training import ExtensionsManager
from ppe_core.training._run_lock import RUN_LOCK_FILENAME

E = ppe.training.extensions


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    """Holders to clean up after the test, whatever happened."""
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.close()


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    return int(proc.stdout)


@pytest.mark.slow
def test_second_process_is_refused_naming_the_holder_and_the_first_finishes(
    tmp_path: Path, holders: list[Holder]
) -> None:
    out = tmp_path / "out"
    holder = Holder(out)
    holders.append(holder)
    before = sorted(os.listdir(out))
    with pytest.raises(OutputDirectoryInUseError) as info:
        make_trainer(out).run(batches())
    message = str(info.value)
    for part in (
        os.path.realpath(out),
        f"pid {holder.pids[0]}",
        repr(socket.gethostname()),
        "since",
    ):
        assert part in message
    assert "another out_dir" in message and "delete" in message and RUN_LOCK_FILENAME in message
    assert sorted(os.listdir(out)) == before  # the refused run wrote nothing
    code, stdout, stderr = holder.finish()
    assert code == 0, stderr[-3000:]
    assert "done" in stdout and "Warning" not in stderr
    log = json.loads((out / "log").read_text())
    assert [entry["epoch"] for entry in log] == [1, 2]  # the holder's own log, whole
    assert not (out / RUN_LOCK_FILENAME).exists()  # released (and removed) at the end


@pytest.mark.slow
def test_sigkilled_holder_is_taken_over_with_a_warning(
    tmp_path: Path, holders: list[Holder]
) -> None:
    out = tmp_path / "out"
    # With DataLoader worker processes: forked while the lock was held, they outlive the
    # killed process for a moment and must not keep its lock alive.
    holder = Holder(out, "--workers", "2")
    holders.append(holder)
    os.kill(holder.pids[0], signal.SIGKILL)
    holder.proc.wait(timeout=60)
    assert (out / RUN_LOCK_FILENAME).exists()  # the file stays; the lock died with the process
    trainer = make_trainer(out)
    with pytest.warns(RunLockWarning, match=rf"taking over .* pid {holder.pids[0]} on host"):
        trainer.run(batches())
    assert trainer.iteration == 4
    assert not (out / RUN_LOCK_FILENAME).exists()


def test_stray_lock_file_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pid = _dead_pid()
    stray = {"pid": pid, "host": "node7", "since": "2026-01-02 03:04:05 UTC", "job": None}
    (out / RUN_LOCK_FILENAME).write_text(json.dumps(stray))
    trainer = make_trainer(out)
    with pytest.warns(RunLockWarning, match=rf"pid {pid} on host 'node7'.*2026-01-02 03:04:05"):
        trainer.run(batches())
    assert trainer.iteration == 4
    assert not (out / RUN_LOCK_FILENAME).exists()


def _lock_holder_pid(out: Path) -> int | None:
    path = out / RUN_LOCK_FILENAME
    return json.loads(path.read_text())["pid"] if path.exists() else None


def test_the_lock_is_held_from_start_to_finalize_and_is_per_process(tmp_path: Path) -> None:
    """Taken before any extension's initialize, held while training, gone after finalize;
    runs of one process one after another and side by side share it."""
    out = tmp_path / "out"
    seen: list[int | None] = []

    class Probe(ppe.training.Extension):
        trigger = (1, "iteration")

        def initialize(self, manager: Any) -> None:
            seen.append(_lock_holder_pid(out))  # autoload would read the directory here

        def __call__(self, manager: Any) -> None:
            seen.append(_lock_holder_pid(out))

    first = make_trainer(out, Probe())
    first.run(batches())
    assert seen == [os.getpid()] * 5
    assert _lock_holder_pid(out) is None
    second = make_trainer(out, Probe())  # the same process again (a notebook, a test)
    second.run(batches())
    assert len(seen) == 10

    # Two live managers of one process on one directory share its lock (the first one may
    # be an abandoned run a notebook still references); the last to finish releases it.
    model = torch.nn.Linear(2, 1)
    a, b = (
        ExtensionsManager(model, {}, 1, iters_per_epoch=2, out_dir=str(out), extensions=[Probe()])
        for _ in range(2)
    )
    for manager in (a, b):
        with manager.run_iteration():
            pass
    with a.run_iteration():
        pass  # a's stop trigger fired: finalized
    assert _lock_holder_pid(out) == os.getpid()
    with b.run_iteration():
        pass
    assert _lock_holder_pid(out) is None


def test_an_abandoned_manager_releases_the_lock_when_collected(tmp_path: Path) -> None:
    import gc

    out = tmp_path / "out"
    model = torch.nn.Linear(2, 1)
    manager = ExtensionsManager(
        model, {}, 5, iters_per_epoch=2, out_dir=str(out), extensions=[E.LogReport()]
    )
    with manager.run_iteration():
        pass  # started, never finalized: e.g. a loop left with break
    assert _lock_holder_pid(out) == os.getpid()
    del manager
    gc.collect()
    assert not (out / RUN_LOCK_FILENAME).exists()
    # Another process can now train there.
    probe = subprocess.run(
        [sys.executable, "-c", _TAKE_AND_REPORT, str(out)], capture_output=True, text=True,
        env=clean_env(), timeout=120, check=False,
    )  # fmt: skip
    assert probe.returncode == 0 and probe.stdout.strip() == "locked", probe.stderr[-2000:]


_TAKE_AND_REPORT = """
import sys, torch, ppe_core as ppe
model = torch.nn.Linear(2, 1)
manager = ppe.training.ExtensionsManager(
    model, {}, 1, iters_per_epoch=1, out_dir=sys.argv[1],
    extensions=[ppe.training.extensions.LogReport()],
)
manager.start_extensions()
print("locked")
"""


def test_a_manager_without_extensions_takes_no_lock(tmp_path: Path) -> None:
    out = tmp_path / "out"
    model = torch.nn.Linear(2, 1)
    manager = ExtensionsManager(model, {}, 1, iters_per_epoch=3, out_dir=str(out))
    while not manager.stop_trigger:
        with manager.run_iteration():
            assert not (out / RUN_LOCK_FILENAME).exists()
    assert manager.iteration == 3


def test_a_failed_run_releases_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "out"

    @ppe.training.make_extension(trigger=(2, "iteration"))
    def fail(manager: Any) -> None:
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError):
        make_trainer(out, fail).run(batches())
    assert not (out / RUN_LOCK_FILENAME).exists()
    # and an extension failing in initialize (the run never starts) releases it too
    bad = ppe.training.make_extension(initializer=lambda m: 1 / 0)(lambda m: None)
    with pytest.raises(ZeroDivisionError):
        make_trainer(out, bad).run(batches())
    assert not (out / RUN_LOCK_FILENAME).exists()


_TORCHRUN_TIMEOUT = 150


@pytest.mark.slow
def test_torchrun_job_holds_one_lock_and_a_second_job_is_refused(
    tmp_path: Path, holders: list[Holder]
) -> None:
    out = tmp_path / "out"
    first = Holder(out, torchrun=True)  # both ranks train: they do not refuse each other
    holders.append(first)
    started = time.monotonic()
    second = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(SCRIPT), str(out)],
        capture_output=True, text=True, timeout=_TORCHRUN_TIMEOUT, env=clean_env(), check=False,
    )  # fmt: skip
    assert second.returncode != 0
    assert time.monotonic() - started < _TORCHRUN_TIMEOUT
    assert "OutputDirectoryInUseError" in second.stderr
    assert f"pid {first.pids[0]}" in second.stderr or f"pid {first.pids[1]}" in second.stderr
    assert "TORCHELASTIC_RUN_ID=" in second.stderr  # the holder's job is named
    code, stdout, stderr = first.finish()
    assert code == 0, stderr[-3000:]
    assert stdout.count("done") == 2
    assert [entry["epoch"] for entry in json.loads((out / "log").read_text())] == [1, 2]
    assert not (out / RUN_LOCK_FILENAME).exists()
