"""Tests of BaseTracker's sender process (``sender="process"``): the backend's calls run in a
child process rebuilt from the pickled tracker; counts, errors and deaths reach the parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import linear_manager, profile_entry_steps
from ppe_extensions._log_report import LogReport
from ppe_extensions.tracking import BaseTracker, TrackerEntry

from ppe_core.errors import ConfigurationError, TrackerWarning
from ppe_core.reporting import report

ITERS_PER_EPOCH = 4


class FileTracker(BaseTracker):
    """A backend that writes what it gets into ``directory`` (it runs in another process).

    ``fail``: ``"raise"`` makes every ``log_metrics`` raise, ``"exit"`` kills the sender
    process after a line on stderr; ``delay`` seconds pass in each ``log_metrics``.
    """

    def __init__(
        self,
        directory: str,
        *,
        fail: str | None = None,
        delay: float = 0.0,
        held_step: int | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("sender", "process")
        super().__init__(**kwargs)
        self.directory = directory
        self.fail = fail
        self.delay = delay
        self.held_step = held_step

    def _append(self, name: str, record: Any) -> None:
        with open(os.path.join(self.directory, name), "a", encoding="utf-8") as file_obj:
            file_obj.write(json.dumps(record, default=str) + "\n")

    def open_run(self, run_id: str | None) -> str:
        self._append("opened.jsonl", {"run_id": run_id, "pid": os.getpid()})
        return run_id or "run-1"

    def log_metrics(self, entries: Sequence[TrackerEntry]) -> None:
        time.sleep(self.delay)
        if self.fail == "raise":
            raise ValueError(f"boom in process {os.getpid()}")
        if self.fail == "exit":
            print("the sender gives up", file=sys.stderr, flush=True)
            os._exit(3)
        for entry in entries:
            self._append("entries.jsonl", {"step": entry.step, "metrics": entry.metrics})

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._append("params.jsonl", dict(params))

    def last_step(self) -> int | None:
        return self.held_step

    def close_run(self, failed: bool) -> None:
        self._append("closed.jsonl", failed)


def _read(directory: Path, name: str) -> list[Any]:
    path = directory / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train(manager: Any, iterations: int | None = None, pause: float = 0.0) -> None:
    # `pause` seconds pass in each step: the pump looks at its queue between steps.
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    steps = 0
    while not manager.stop_trigger and steps != iterations:
        with manager.run_iteration(step_optimizers=["main"]):
            loss = manager.models["main"](x).square().mean()
            loss.backward()
            report({"train/loss": loss})
            time.sleep(pause)
        steps += 1
    manager.finalize()


def _run(
    tmp_path: Path,
    tracker: BaseTracker,
    *,
    max_epochs: int = 3,
    iterations: int | None = None,
    pause: float = 0.0,
) -> LogReport:
    log_report = LogReport(trigger=(1, "iteration"))
    manager = linear_manager(
        tmp_path / "out",
        [log_report, tracker],
        max_epochs=max_epochs,
        iters_per_epoch=ITERS_PER_EPOCH,
    )
    _train(manager, iterations, pause)
    return log_report


def test_every_entry_is_sent_by_a_sender_process(tmp_path: Path) -> None:
    tracker = FileTracker(str(tmp_path), batch_size=5)
    log_report = _run(tmp_path, tracker)

    assert tracker.sender == "process"
    assert tracker.sender_pid is not None and tracker.sender_pid != os.getpid()
    opened = _read(tmp_path, "opened.jsonl")
    assert opened == [{"run_id": None, "pid": tracker.sender_pid}]
    entries = _read(tmp_path, "entries.jsonl")
    assert [e["step"] for e in entries] == [entry["iteration"] for entry in log_report.log]
    assert [e["metrics"] for e in entries] == [
        {k: float(v) for k, v in entry.items()} for entry in log_report.log
    ]
    (params,) = _read(tmp_path, "params.jsonl")
    assert params["optimizer/main/class"] == "SGD"
    assert params["iters_per_epoch"] == ITERS_PER_EPOCH
    assert _read(tmp_path, "closed.jsonl") == [False]
    counts = tracker.report
    assert (counts.queued, counts.sent, counts.dropped, counts.unsent) == (12, 12, 0, 0)
    assert counts.params_sent
    assert tracker.run_id == "run-1"  # the child's run id reached the parent
    assert tracker.state_dict()["run_id"] == "run-1"


def test_an_exception_in_the_childs_client_surfaces_in_the_parent(tmp_path: Path) -> None:
    tracker = FileTracker(str(tmp_path), fail="raise", max_retries=1, retry_backoff=0)
    with pytest.warns(TrackerWarning) as record:
        _run(tmp_path, tracker, max_epochs=1)
    final = str(record[-1].message)
    pid = tracker.sender_pid
    assert pid is not None and pid != os.getpid()
    assert f"last error: ValueError: boom in process {pid}" in final
    assert "sent 0 of 4 entries" in final
    counts = tracker.report
    assert counts.sent == 0 and counts.failed + counts.unsent == 4
    assert counts.last_error == f"ValueError: boom in process {pid}"


def test_a_sender_process_that_dies_is_reported_with_its_stderr(tmp_path: Path) -> None:
    tracker = FileTracker(str(tmp_path), fail="exit")
    with pytest.warns(TrackerWarning) as record:
        _run(tmp_path, tracker, max_epochs=2)
    final = str(record[-1].message)
    assert "the sender process exited with code 3: the sender gives up" in final
    assert "sent 0 of 8 entries" in final
    counts = tracker.report
    assert counts.sent == 0 and counts.failed + counts.unsent == 8


def test_entries_after_the_sender_process_died_count_as_failed_not_dropped(
    tmp_path: Path,
) -> None:
    # The child exits at its first batch. Until the parent notices, entries wait (a queue of
    # two: the oldest are dropped); from then on the pump no longer waits for the child to
    # finish what it holds, so later entries fail at once (counted) instead of being dropped.
    tracker = FileTracker(str(tmp_path), fail="exit", queue_size=2, batch_size=1, send_interval=0)
    manager = linear_manager(
        tmp_path / "out",
        [LogReport(trigger=(1, "iteration")), tracker],
        max_epochs=1000,
        iters_per_epoch=ITERS_PER_EPOCH,
    )
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    noticed: int | None = None
    dropped_then = 0
    steps = 0
    with pytest.warns(TrackerWarning) as record:
        while noticed is None or steps < noticed + 30:
            with manager.run_iteration(step_optimizers=["main"]):
                manager.models["main"](x).square().mean().backward()
                time.sleep(0.01)
            steps += 1
            if noticed is None and "exited with code 3" in (tracker.report.last_error or ""):
                noticed, dropped_then = steps, tracker.report.dropped
            assert steps < 3000, "the sender process's death was never reported"
        manager.finalize()
    counts = tracker.report
    assert counts.dropped == dropped_then  # none after the death was noticed
    assert counts.failed >= 30 and counts.sent == 0
    # The entries the child held when it died are unsent; the rest failed or were dropped.
    assert counts.failed + counts.unsent + counts.dropped == counts.queued + counts.dropped == steps
    assert "exited with code 3" in (counts.last_error or "")  # not lost to later counts
    assert "the sender process exited with code 3" in str(record[-1].message)


def test_an_entry_that_cannot_be_pickled_fails_its_batch_not_the_sender(tmp_path: Path) -> None:
    # A CSV log writes any value as text; a postprocess that adds a lock to two entries makes
    # their batches unpicklable: those fail with the reason, the rest still reach the child.
    def add_lock(entry: dict[str, Any]) -> None:
        if entry["iteration"] in (3, 7):
            entry["handle"] = threading.Lock()

    tracker = FileTracker(str(tmp_path), batch_size=1, send_interval=0)
    log_report = LogReport(trigger=(1, "iteration"), format="csv", postprocess=add_lock)
    manager = linear_manager(
        tmp_path / "out", [log_report, tracker], max_epochs=3, iters_per_epoch=ITERS_PER_EPOCH
    )
    with pytest.warns(TrackerWarning) as record:
        _train(manager, pause=0.01)
    steps = [entry["step"] for entry in _read(tmp_path, "entries.jsonl")]
    assert steps == [i for i in range(1, 13) if i not in (3, 7)]
    counts = tracker.report
    assert (counts.sent, counts.failed, counts.unsent) == (10, 2, 0)
    final = str(record[-1].message)
    assert "2 refused" in final and "cannot pickle" in final, final


def test_a_slow_sender_drops_with_one_warning_and_is_killed_after_the_flush_timeout(
    tmp_path: Path,
) -> None:
    tracker = FileTracker(
        str(tmp_path), delay=60, queue_size=2, batch_size=1, send_interval=0, flush_timeout=0.5
    )
    with pytest.warns(TrackerWarning) as record:
        _run(tmp_path, tracker, pause=0.01)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages
    assert "queue is full (2 entries" in messages[0]
    counts = tracker.report
    # Two in the child (one in the slow call, one waiting: the most it holds), two in the
    # queue, eight dropped.
    assert counts.queued == 4 and counts.dropped == 8
    assert counts.timed_out and counts.sent == 0 and counts.unsent == 4
    assert "8 dropped because the queue was full" in messages[1]
    assert "4 still queued when the flush gave up after 0.5 s" in messages[1]
    assert tracker.sender_pid is not None
    assert not _alive(tracker.sender_pid)


def test_a_full_queue_keeps_the_newest_entries(tmp_path: Path) -> None:
    # The backend takes 0.5 s per batch and training 12 steps of 10 ms: the first two entries
    # reach the child at once, the others wait in a queue of two, each new one dropping the
    # oldest; when training ends the two newest are still there and are sent.
    tracker = FileTracker(
        str(tmp_path), delay=0.5, queue_size=2, batch_size=1, send_interval=0, flush_timeout=30
    )
    with pytest.warns(TrackerWarning) as record:
        _run(tmp_path, tracker, pause=0.01)
    assert "queue is full" in str(record[0].message)
    assert "8 dropped because the queue was full" in str(record[-1].message)
    steps = [entry["step"] for entry in _read(tmp_path, "entries.jsonl")]
    assert len(steps) == 4 and steps[2:] == [11, 12], steps
    assert steps == sorted(steps)
    counts = tracker.report
    assert (counts.queued, counts.sent, counts.dropped, counts.unsent) == (4, 4, 8, 0)


@pytest.mark.parametrize("sender", ["thread", "process"])
def test_no_tracker_code_runs_on_the_training_thread_per_entry(tmp_path: Path, sender: str) -> None:
    # LogReport's listener is the queue's own append (C code): profiled on the training
    # thread, a step with an entry calls no Python function of ppe_extensions.tracking.
    tracker = FileTracker(str(tmp_path), batch_size=5, sender=sender)
    manager = linear_manager(  # 12 of its 16 steps: training goes on (no finalize)
        tmp_path / "out",
        [LogReport(trigger=(1, "iteration")), tracker],
        max_epochs=4,
        iters_per_epoch=ITERS_PER_EPOCH,
    )
    files, appended_to = profile_entry_steps(manager, 12)
    assert tracker._pump is not None
    queue = tracker._pump.items
    manager.finalize()
    assert [name for name in files if f"ppe_core{os.sep}tracking" in name] == []
    assert any("_log_report.py:_emit" in name for name in files)  # it did profile
    assert sum(1 for target in appended_to if target is queue) == 11
    steps = [entry["step"] for entry in _read(tmp_path, "entries.jsonl")]
    assert steps == list(range(1, 13))


def test_resume_in_a_sender_process_continues_the_run_and_its_steps(tmp_path: Path) -> None:
    first = FileTracker(str(tmp_path / "a"))
    (tmp_path / "a").mkdir()
    log_report = LogReport(trigger=(1, "iteration"))
    manager = linear_manager(
        tmp_path / "out", [log_report, first], max_epochs=2, iters_per_epoch=ITERS_PER_EPOCH
    )
    _train(manager, iterations=5)
    state = manager.state_dict()
    assert state["extensions"]["FileTracker"]["extension"]["run_id"] == "run-1"

    (tmp_path / "b").mkdir()
    second = FileTracker(str(tmp_path / "b"), held_step=6)
    manager = linear_manager(
        tmp_path / "out",
        [LogReport(trigger=(1, "iteration")), second],
        max_epochs=2,
        iters_per_epoch=ITERS_PER_EPOCH,
    )
    manager.load_state_dict(state)
    _train(manager)
    # The resumed run is opened by a sender process (not this one), with the snapshot's run id.
    assert _read(tmp_path / "b", "opened.jsonl") == [{"run_id": "run-1", "pid": second.sender_pid}]
    assert second.sender_pid is not None and second.sender_pid != os.getpid()
    assert [e["step"] for e in _read(tmp_path / "b", "entries.jsonl")] == [7, 8]
    assert second.report.skipped == 1


def test_a_tracker_that_cannot_run_in_a_process_falls_back_to_a_thread(tmp_path: Path) -> None:
    class Local(FileTracker):  # a class in a function: the child could not import it
        pass

    local = Local(str(tmp_path))
    with pytest.warns(TrackerWarning, match=r"sends from a thread.*defined in a function"):
        log_report = _run(tmp_path, local, max_epochs=1)
    assert local.sender == "thread" and local.sender_pid is None
    assert len(_read(tmp_path, "entries.jsonl")) == len(log_report.log) == 4

    unpicklable = FileTracker(str(tmp_path / "u"), params={"lock": threading.Lock()})
    (tmp_path / "u").mkdir()
    with pytest.warns(TrackerWarning, match=r"sends from a thread.*cannot be pickled"):
        _run(tmp_path, unpicklable, max_epochs=1)
    assert unpicklable.sender == "thread"
    assert len(_read(tmp_path / "u", "entries.jsonl")) == 4
    with pytest.raises(ConfigurationError, match="sender must be one of 'thread', 'process'"):
        FileTracker(str(tmp_path), sender="fork")


# Trains without end with a FileTracker in a sender process; the test SIGKILLs it.
_ORPHAN_SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from helpers import linear_manager, profile_entry_steps
from ppe_core.reporting import report
from ppe_extensions._log_report import LogReport
from test_tracking_sender import FileTracker

tracker = FileTracker(sys.argv[2], send_interval=0)
manager = linear_manager(
    sys.argv[3], [LogReport(trigger=(1, "iteration")), tracker], max_epochs=10**6,
    iters_per_epoch=4,
)
x = torch.randn(8, 4)
while True:
    with manager.run_iteration(step_optimizers=["main"]):
        loss = manager.models["main"](x).square().mean()
        loss.backward()
        report({"train/loss": loss})
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as file_obj:
            return file_obj.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_sender_process_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_ORPHAN_SCRIPT)
    tests = str(Path(__file__).parent)
    command = [sys.executable, str(script), tests, str(tmp_path), str(tmp_path / "out")]
    parent = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_read(tmp_path, "entries.jsonl")) < 3 and parent.poll() is None:
            assert time.monotonic() < deadline, "the sender sent nothing in 120 s"
            time.sleep(0.1)
        assert parent.poll() is None, parent.communicate()[1]
        (opened,) = _read(tmp_path, "opened.jsonl")
        child = opened["pid"]
        assert child != parent.pid and _alive(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.communicate()
    deadline = time.monotonic() + 15
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
    # It saw its parent go (stdin EOF), sent what it had and closed the run as failed.
    assert _read(tmp_path, "closed.jsonl") == [True]


# A Trainer with a FileTracker in its sender process and DataLoader workers; after iteration 6
# an extension has `kill` signal the whole process group, as a scheduler's preemption does.
_PREEMPTED_SCRIPT = """
import os, subprocess, sys, torch
sys.path.insert(0, sys.argv[1])
import ppe_core as ppe
from test_tracking_sender import FileTracker

torch.manual_seed(0)
model = ppe.to(torch.nn.Sequential(torch.nn.Linear(4, 1)), "cpu")


class Wrapped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = model

    def forward(self, x):
        return {"loss": self.net(x).square().mean()}


wrapped = ppe.to(Wrapped(), "cpu")
data = torch.utils.data.TensorDataset(torch.randn(40, 4))
loader = torch.utils.data.DataLoader(
    [{"x": row[0]} for row in data], batch_size=4, num_workers=2
)


def preempt(manager):
    if manager.iteration == 6:
        subprocess.run(["kill", "-TERM", "--", f"-{os.getpgid(0)}"])


E = ppe.training.extensions
trainer = ppe.engine.create_trainer(
    wrapped,
    torch.optim.SGD(wrapped.parameters(), lr=0.1),
    3,
    out_dir=sys.argv[3],
    extensions=[
        E.LogReport(trigger=(1, "iteration")),
        FileTracker(sys.argv[2], send_interval=0),
        ppe.training.ExtensionEntry(E.snapshot(autoload=True), trigger=(100, "iteration")),
        ppe.training.make_extension(trigger=(1, "iteration"), priority=-1000)(preempt),
    ],
)
trainer.run(loader)
"""


@pytest.mark.slow  # a fresh interpreter imports torch; DataLoader workers start
def test_a_preempted_run_flushes_its_tracker_and_the_sender_process_ends(tmp_path: Path) -> None:
    # The scheduler's SIGTERM reaches the sender process too: it keeps sending until the
    # trainer's finalize closes its pipe, so the tracker has every iteration up to the stop.
    script = tmp_path / "train.py"
    script.write_text(_PREEMPTED_SCRIPT)
    tests = str(Path(__file__).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    result = subprocess.run(
        [sys.executable, str(script), tests, str(tmp_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        start_new_session=True,
    )
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "interrupted at iteration 6; snapshot_iter_6 written" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert [e["step"] for e in _read(tmp_path, "entries.jsonl")] == list(range(1, 7))
    assert len(_read(tmp_path, "closed.jsonl")) == 1
    (opened,) = _read(tmp_path, "opened.jsonl")
    deadline = time.monotonic() + 15
    while _alive(opened["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(opened["pid"]), "the sender process outlived the preempted run"
