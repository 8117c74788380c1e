"""What failures leave behind: error snapshots, temporary files of killed saves, orphaned data
files, orphaned writer processes, and setup mistakes that surfaced only at the first snapshot."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._snapshot import load_snapshot, manifest_path

import ppe_core as ppe

E = ppe.training.extensions
SCRIPTS = Path(__file__).parent / "scripts"
ERROR_SNAPSHOT_DIR = "snapshots_on_error"  # _snapshot.ERROR_SNAPSHOT_DIR, spelt out as the API


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}


def _script(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


# Item 9: an error snapshot never makes resume worse ---------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("reference")
    _script("error_resume_training.py", str(out))
    return _weights(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("writer", "fail_at"),
    [
        ("simple", 38),  # fetching batch 8: right after the periodic snapshot of iteration 7
        ("thread", 48),  # iteration 9: newer than every periodic snapshot
    ],
)
def test_error_snapshot_never_spoils_bit_exact_resume(
    tmp_path: Path, uninterrupted: dict[str, torch.Tensor], writer: str, fail_at: int
) -> None:
    marker = tmp_path / "failed_once"
    args = ("--writer", writer, "--fail-at", str(fail_at), "--marker", str(marker))
    failed = _script("error_resume_training.py", str(tmp_path), *args, check=False)
    assert failed.returncode != 0 and "simulated read error" in failed.stderr
    periodic = Path(manifest_path(str(tmp_path / "snapshot_iter_7")))
    assert "on_error" not in json.loads(periodic.read_text())  # not overwritten

    _script("error_resume_training.py", str(tmp_path), *args)  # autoload resumes
    resumed = _weights(tmp_path)
    assert resumed.keys() == uninterrupted.keys()
    for key in resumed:
        assert torch.equal(resumed[key], uninterrupted[key]), f"{key} differs after resume"
    # The state at the failure is kept for inspection, marked as such.
    iteration = (fail_at - 1) // 5
    error_snapshot = tmp_path / ERROR_SNAPSHOT_DIR / f"snapshot_iter_{iteration}"
    assert json.loads(Path(manifest_path(str(error_snapshot))).read_text())["on_error"] is True
    assert load_snapshot(str(error_snapshot))["_start_iteration"] == iteration
    # n_retains (2) counted periodic snapshots only (and the one the end of training adds, at
    # iteration 30); the error snapshot is still there.
    assert sorted(p.name for p in tmp_path.glob("snapshot_iter_*")) == [
        "snapshot_iter_28",
        "snapshot_iter_30",
    ]
    assert error_snapshot.exists()


# Item 10: leftovers of killed processes ---------------------------------------------------


class _Stuck:
    """``stuck_writer.py MODE`` in a subprocess, started and waited for until it is ready."""

    def __init__(self, mode: str, out: Path, context: str | None = None) -> None:
        self.pid_file = out.parent / f"{out.name}-{mode}.pid"
        args = [sys.executable, str(SCRIPTS / "stuck_writer.py"), mode, str(out)]
        args += [str(self.pid_file)] + ([context] if context else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=_env())
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"
        self.worker = int(self.pid_file.read_text())

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if _alive(self.worker) and self.worker != self.proc.pid:  # on a failure: clean up
            os.kill(self.worker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def stuck() -> Iterator[list[_Stuck]]:
    started: list[_Stuck] = []
    yield started
    for process in started:
        process.close()


def _temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*.tmp"))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_temp_files_of_killed_saves_are_removed_at_the_next_start_only_if_dead(
    tmp_path: Path, stuck: list[_Stuck]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    killed = _Stuck("thread-save", out)
    stuck.append(killed)
    live = _Stuck("thread-save", out / "other_run")  # still saving, in a sub-directory
    stuck.append(live)
    (killed_temp,) = [n for n in _temps(out) if f"{killed.proc.pid}-" in n]
    killed.kill()
    # A leftover of a dead writer on another host sharing the file system: its pid means
    # nothing here, so it stays.
    foreign_host = "0" * 8 if f".{'0' * 8}-" not in killed_temp else "1" * 8
    foreign = out / f".snapshot_iter_3.{foreign_host}-{killed.proc.pid}-0123abcd.tmp"
    foreign.write_bytes(b"partial")
    assert (out / killed_temp).stat().st_size >= 1 << 20  # what the kill left behind

    _train(out, 1)  # the next run in that directory

    remaining = _temps(out)
    assert killed_temp not in remaining
    assert foreign.name in remaining
    live_temps = [n for n in remaining if str(live.proc.pid) in n]
    assert len(live_temps) == 1  # the live writer's file is untouched


def _train(out: Path, epochs: int, *extensions: Any) -> Any:
    torch.manual_seed(0)
    model = ppe.to(torch.nn.Linear(3, 1), "cpu")

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.inner(x).square().mean()}

    wrapped = ppe.to(Loss(), "cpu")
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.1),
        epochs,
        out_dir=str(out),
        extensions=list(extensions),
    )
    g = torch.Generator().manual_seed(0)
    trainer.run([{"x": torch.randn(2, 3, generator=g)} for _ in range(2)])
    return trainer


def test_n_retains_retires_own_data_files_whose_manifest_a_kill_prevented(tmp_path: Path) -> None:
    import pytorch_pfn_extras as ppe09

    # Killed right after snapshot_iter_6 was renamed into place, before its manifest was.
    killed = _script("killed_before_manifest.py", str(tmp_path), "3", "6", check=False)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "snapshot_iter_6").exists()
    assert not Path(manifest_path(str(tmp_path / "snapshot_iter_6"))).exists()
    # A snapshot written by PPE in the same directory, older than everything: retired too
    # (it loads as a snapshot state); a file of the series that does not load stays.
    model = torch.nn.Linear(3, 1)
    manager = ppe09.training.ExtensionsManager(model, {}, 1, iters_per_epoch=1)
    ppe_file = tmp_path / "snapshot_iter_1"
    torch.save(manager.state_dict(), ppe_file)
    os.utime(ppe_file, (1, 1))
    (tmp_path / "snapshot_iter_0").write_text("not a snapshot")

    _script("killed_before_manifest.py", str(tmp_path), "5")  # resumes, snapshots at 8 and 10
    assert sorted(p.name for p in tmp_path.glob("snapshot_iter_*")) == [
        "snapshot_iter_0",
        "snapshot_iter_10",
        "snapshot_iter_8",
    ]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    ("mode", "context"),
    [("queue-idle", "fork"), ("queue-idle", "spawn"), ("process-save", "fork")],
)
def test_writer_processes_exit_when_the_trainer_is_killed(
    tmp_path: Path, stuck: list[_Stuck], mode: str, context: str
) -> None:
    process = _Stuck(mode, tmp_path, context)
    stuck.append(process)
    assert process.worker != process.proc.pid and _alive(process.worker)
    process.kill()
    deadline = time.monotonic() + 10
    while _alive(process.worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(process.worker), f"the {mode} worker outlived its parent"


# Item 17: mistakes found at setup, and a full disk named ----------------------------------


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    mount = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d; r=$?; umount $d; rmdir $d"
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount + "; exit $r"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare and a tmpfs mount")
def test_a_full_disk_is_named_with_the_synchronous_and_a_background_writer(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    command = (
        f"mount -t tmpfs -o size=1M tmpfs {disk} && "
        f"exec {sys.executable} {SCRIPTS / 'full_disk.py'} {disk}"
    )
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["simple"].startswith("DiskFullError: [Errno 28] no space left")
    assert "'snapshot_iter_2'" in lines["simple"] and "inline_container" in lines["simple"]
    # The background save's failure is re-raised by the snapshot, with the same diagnosis.
    assert lines["thread"].startswith("SnapshotError: a background snapshot save failed")
    assert "DiskFullError" in lines["thread"] and "'snapshot_iter_2'" in lines["thread"]
    assert lines["simple leftovers"] == lines["thread leftovers"] == "[]"


def test_error_snapshots_are_not_autoloaded(tmp_path: Path) -> None:
    class Boom(RuntimeError):
        pass

    def fail_at_3(manager: Any) -> None:
        if manager.iteration == 3:
            raise Boom("stop here")

    with pytest.raises(Boom):
        _train(
            tmp_path,
            2,
            ppe.training.ExtensionEntry(
                E.snapshot(snapshot_on_error=True, autoload=True), trigger=(2, "iteration")
            ),
            ppe.training.make_extension(trigger=(1, "iteration"))(fail_at_3),
        )
    assert (tmp_path / ERROR_SNAPSHOT_DIR / "snapshot_iter_3").exists()
    trainer = _train(
        tmp_path,
        2,
        ppe.training.ExtensionEntry(E.snapshot(autoload=True), trigger=(2, "iteration")),
    )
    snapshot = trainer.manager.get_extension("_Snapshot")
    assert snapshot.loaded_from == str(tmp_path / "snapshot_iter_2")
