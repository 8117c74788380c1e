"""Tests of ``Writer.submit``: one background mechanism for every file a run writes.

A background snapshot is a job run by the writer's own worker (the queue writer's consumer
thread, the thread writer's worker slot), in order with the other extensions' saves, instead of a
thread of the snapshot's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._snapshot import load_snapshot, verify_snapshot

import ppe_core as ppe
from ppe_core.errors import WriterFinalizedError
from ppe_core.writing import (
    ProcessQueueWriter,
    ProcessWriter,
    SimpleWriter,
    ThreadQueueWriter,
    ThreadWriter,
    Writer,
)

E = ppe.training.extensions


def _data(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 8, generator=g), "t": torch.randn(4, 2, generator=g)}] * n


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = torch.nn.functional.mse_loss(self.fc(x), t)
        ppe.reporting.report({"loss": loss})
        return {"loss": loss}


@pytest.mark.parametrize(
    ("writer_class", "worker"),
    [(ThreadQueueWriter, "ppe_core.ThreadQueueWriter"), (ThreadWriter, "ppe_core.ThreadWriter")],
)
def test_snapshots_and_the_log_are_written_by_the_writers_one_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer_class: type[Writer], worker: str
) -> None:
    """Every file but the last snapshot (saved in the training thread at the end, from the
    state itself) is written by the writer's worker: no thread of the snapshot's."""
    written: list[tuple[str, str]] = []
    real = Writer._destination

    def recording(self: Writer, filename: str, out_dir: str) -> str:
        written.append((filename, threading.current_thread().name))
        return real(self, filename, out_dir)

    monkeypatch.setattr(Writer, "_destination", recording)
    torch.manual_seed(0)
    model = ppe.to(_Model(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        out_dir=str(tmp_path),
        writer=writer_class(),
        extensions=[E.LogReport(trigger=(2, "iteration"))],
    )
    trainer.extend(E.snapshot(filename="snap_{.iteration}"), trigger=(2, "iteration"))
    trainer.run(_data(8))
    threads = {name for filename, name in written if "snap_8" not in filename}
    assert threads == {worker}
    assert {f for f, _ in written if "snap_8" not in f} >= {"log", "snap_2", "snap_6"}
    for name in ("snap_2", "snap_4", "snap_6", "snap_8"):
        verify_snapshot(str(tmp_path / name))


def test_a_job_runs_after_the_saves_queued_before_it(tmp_path: Path) -> None:
    writer = ThreadQueueWriter()
    gate = threading.Event()
    writer("first", str(tmp_path), b"", savefun=lambda data, f: gate.wait(10))
    future = writer.submit(lambda: (tmp_path / "first").exists())
    assert not future.done()  # queued behind the blocked save
    gate.set()
    assert future.result(timeout=10) is True
    writer.finalize()
    with pytest.raises(WriterFinalizedError, match="create a new writer"):
        writer.submit(lambda: None)


@pytest.mark.parametrize("writer_class", [SimpleWriter, ThreadWriter, ThreadQueueWriter])
def test_a_failed_job_is_the_submitters_to_report(writer_class: type[Writer]) -> None:
    writer = writer_class()

    def fail() -> None:
        raise OSError("disk on fire")

    future = writer.submit(fail)
    assert isinstance(future.exception(timeout=10), OSError)
    writer.finalize()  # not reported again as a WriterError


@pytest.mark.parametrize("writer_class", [ProcessWriter, ProcessQueueWriter])
def test_process_writers_run_jobs_in_this_process_one_at_a_time(
    writer_class: type[Writer],
) -> None:
    """A job is a closure over this process's state (no pickling): it runs in a thread here,
    after the previous job finished."""
    writer = writer_class()
    assert writer.in_background
    running: list[int] = []
    overlap: list[bool] = []

    def job(i: int) -> int:
        running.append(i)
        overlap.append(len(running) > 1)
        time.sleep(0.05)
        running.remove(i)
        return os.getpid()

    futures = [writer.submit(lambda i=i: job(i)) for i in range(3)]
    writer.finalize()  # waits for the last job
    assert [f.result(timeout=0) for f in futures] == [os.getpid()] * 3
    assert overlap == [False] * 3


_KILLED_MID_JOB = textwrap.dedent(
    """
    import sys, time, torch
    from ppe_core.writing import ThreadQueueWriter

    out, marker = sys.argv[1], sys.argv[2]
    writer = ThreadQueueWriter()
    big = {"w": torch.arange(1 << 20, dtype=torch.float32)}

    def write(path):
        with open(path, "wb") as f:  # half of a new snapshot, then the kill
            f.write(b"x" * 4096)
            f.flush()
        open(marker, "w").close()
        time.sleep(60)

    writer.submit(lambda: writer.save_via_path("snap", out, write))
    time.sleep(60)
    """
)


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL and dead-writer cleanup are POSIX")
def test_a_kill_mid_job_leaves_the_previous_file_and_its_temporary_is_removed_next_time(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    previous = {"w": torch.ones(3)}
    SimpleWriter().save_via_path("snap", str(out), lambda path: torch.save(previous, path))
    marker = tmp_path / "writing"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_MID_JOB, str(out), str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "the job never started writing"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert torch.equal(torch.load(out / "snap", weights_only=True)["w"], previous["w"])
    leftovers = [p.name for p in out.iterdir() if p.name != "snap"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".snap.")  # the job's temporary
    SimpleWriter().initialize(str(out))  # the next run's writer: its writer process is dead
    assert sorted(p.name for p in out.iterdir()) == ["snap"]


def test_a_background_snapshot_failure_in_the_writers_worker_is_raised_by_the_next_one(
    tmp_path: Path,
) -> None:
    """The job's failure reaches the snapshot (SnapshotError), not the writer's own report."""
    calls: list[int] = []

    def savefun(state: Any, f: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("no space left")
        torch.save(state, f)

    torch.manual_seed(0)
    model = ppe.to(_Model(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        out_dir=str(tmp_path),
        writer=ThreadQueueWriter(),
    )
    trainer.extend(E.snapshot(savefun=savefun, filename="s_{.iteration}"), trigger=(2, "iteration"))
    with pytest.raises(ppe.errors.SnapshotError, match="background snapshot save failed"):
        trainer.run(_data(8))
    assert load_snapshot(str(tmp_path / "s_2"))["_start_iteration"] == 2
    assert not (tmp_path / "s_4").exists()
