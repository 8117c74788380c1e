"""Tests of BaseTracker (ppe_extensions.tracking): batching, retries, drops, flush, resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import linear_manager
from ppe_extensions._log_report import LogReport
from ppe_extensions.tracking import BaseTracker, TrackerEntry

from ppe_core.errors import ConfigurationError, TrackerWarning
from ppe_core.reporting import report
from ppe_core.training import make_extension
from ppe_core.training.extensions import snapshot
from ppe_core.writing import ProcessWriter, ThreadWriter, Writer

ITERS_PER_EPOCH = 4


class RecordingTracker(BaseTracker):
    """A backend in memory that records what it got and on which thread."""

    def __init__(
        self, *, fail_first: int = 0, block: threading.Event | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.fail_first = fail_first
        self.block = block
        self.calls: list[tuple[str, str]] = []
        self.opened: list[str | None] = []
        self.batches: list[list[TrackerEntry]] = []
        self.params: dict[str, Any] = {}
        self.closed: list[bool] = []
        self.held_step: int | None = None

    def _record(self, what: str) -> None:
        self.calls.append((what, threading.current_thread().name))

    def open_run(self, run_id: str | None) -> str:
        self._record("open_run")
        self.opened.append(run_id)
        return run_id or "run-1"

    def log_metrics(self, entries: Sequence[TrackerEntry]) -> None:
        self._record("log_metrics")
        if self.block is not None:
            self.block.wait(30)
        if self.fail_first > 0:
            self.fail_first -= 1
            raise ConnectionError("server unreachable")
        self.batches.append(list(entries))

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._record("log_params")
        self.params.update(params)

    def last_step(self) -> int | None:
        self._record("last_step")
        return self.held_step

    def close_run(self, failed: bool) -> None:
        self._record("close_run")
        self.closed.append(failed)

    @property
    def steps(self) -> list[int]:
        return [entry.step for batch in self.batches for entry in batch]


def _train(manager: Any, iterations: int | None = None, pause: float = 0.0) -> None:
    """Steps until the stop trigger (or ``iterations`` steps), then finalizes (once).

    ``pause`` seconds pass in each step: the tracker's pump looks at its queue between steps.
    """
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    steps = 0
    while not manager.stop_trigger and steps != iterations:
        with manager.run_iteration(step_optimizers=["main"]):
            loss = manager.models["main"](x).square().mean()
            loss.backward()  # type: ignore[no-untyped-call]
            report({"train/loss": loss})
            time.sleep(pause)
        steps += 1
    manager.finalize()


def _run(
    tmp_path: Path,
    tracker: BaseTracker,
    *,
    trigger: Any = (1, "iteration"),
    max_epochs: int = 3,
    iterations: int | None = None,
    pause: float = 0.0,
) -> LogReport:
    log_report = LogReport(trigger=trigger)
    manager = linear_manager(
        tmp_path, [log_report, tracker], max_epochs=max_epochs, iters_per_epoch=ITERS_PER_EPOCH
    )
    _train(manager, iterations, pause)
    return log_report


def test_every_entry_reaches_the_backend_by_iteration_off_the_training_thread(
    tmp_path: Path,
) -> None:
    tracker = RecordingTracker(batch_size=5)
    log_report = _run(tmp_path, tracker)

    assert tracker.steps == [entry["iteration"] for entry in log_report.log]
    metrics = [entry.metrics for batch in tracker.batches for entry in batch]
    assert metrics == [{k: float(v) for k, v in entry.items()} for entry in log_report.log]
    # Nothing ran on the training thread; the run was opened once, params sent, then closed.
    assert {thread for _, thread in tracker.calls} == {"ppe-tracker-RecordingTracker"}
    assert threading.current_thread().name not in {thread for _, thread in tracker.calls}
    assert [what for what, _ in tracker.calls][:2] == ["open_run", "log_params"]
    assert tracker.closed == [False]
    assert all(len(batch) <= 5 for batch in tracker.batches)
    assert tracker.params["optimizer/main/class"] == "SGD"
    assert tracker.params["optimizer/main/lr"] == 0.05
    assert tracker.params["max_epochs"] == 3
    assert tracker.params["iters_per_epoch"] == ITERS_PER_EPOCH
    report_ = tracker.report
    assert (report_.queued, report_.sent, report_.dropped, report_.unsent) == (12, 12, 0, 0)
    assert report_.params_sent


def test_the_tracker_takes_each_entry_as_it_is_emitted_and_is_never_called_per_step(
    tmp_path: Path,
) -> None:
    # LogReport hands each entry to the tracker when it emits it: the manager never calls the
    # tracker (its trigger never fires), so a step without an entry pays nothing for it.
    called: list[int] = []
    queued_at: dict[int, int] = {}

    class Counting(RecordingTracker):
        def __call__(self, manager: Any) -> None:
            called.append(manager.iteration)
            super().__call__(manager)

    tracker = Counting()
    log_report = LogReport(trigger=(1, "epoch"))

    @make_extension(trigger=(1, "iteration"), priority=-100)  # after both
    def watch(manager: Any) -> None:
        queued_at[manager.iteration] = tracker.report.queued

    manager = linear_manager(
        tmp_path, [log_report, tracker, watch], max_epochs=3, iters_per_epoch=ITERS_PER_EPOCH
    )
    _train(manager)
    assert called == []
    # Queued in the step that emitted the entry (epoch ends: 4, 8, 12), not later.
    assert [queued_at[i] for i in range(1, 13)] == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert tracker.steps == [entry["iteration"] for entry in log_report.log] == [4, 8, 12]


def test_with_an_entry_every_iteration_the_tracker_keeps_steps_on_the_fast_path(
    tmp_path: Path,
) -> None:
    # LogReport at every iteration runs on the manager's fast path (no trigger consulted); a
    # tracker reading it was due every iteration too, and its trigger forced the slow path
    # (every due trigger, every next due iteration) at each step. It now rides the fast path.
    from ppe_core.training._manager import ExtensionsManager

    slow: list[int] = []
    original = ExtensionsManager._run_due_extensions

    def counting(manager: ExtensionsManager, iteration: int) -> bool:
        slow.append(iteration)
        return original(manager, iteration)

    tracker = RecordingTracker()
    ExtensionsManager._run_due_extensions = counting  # type: ignore[method-assign]
    try:
        log_report = _run(tmp_path, tracker)
    finally:
        ExtensionsManager._run_due_extensions = original  # type: ignore[method-assign]
    assert tracker.steps == [entry["iteration"] for entry in log_report.log] == list(range(1, 13))
    assert len(slow) <= 2  # the first step (the schedule is built) and the last (stop)


def test_failed_calls_are_retried_with_backoff(tmp_path: Path) -> None:
    tracker = RecordingTracker(fail_first=2, max_retries=2, retry_backoff=0.01)
    log_report = _run(tmp_path, tracker, max_epochs=1)
    assert tracker.steps == [entry["iteration"] for entry in log_report.log]
    assert tracker.report.failed == 0
    assert tracker.report.last_error == "ConnectionError: server unreachable"


def test_a_backend_that_keeps_failing_is_reported_once_and_counted_at_the_end(
    tmp_path: Path,
) -> None:
    tracker = RecordingTracker(
        fail_first=10**6, max_retries=1, retry_backoff=0, batch_size=1, send_interval=0
    )
    with pytest.warns(TrackerWarning) as record:
        _run(tmp_path, tracker, max_epochs=2, pause=0.02)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages
    # The worker's failure, raised on the training thread with a later entry; then the end's.
    assert "could not send" in messages[0] and "training goes on" in messages[0]
    assert record[0].filename.endswith("_log_report.py")
    final = messages[-1]
    assert "sent 0 of 8 entries" in final
    assert "last error: ConnectionError: server unreachable" in final
    counts = tracker.report
    assert counts.sent == 0
    assert counts.failed + counts.unsent == 8


def test_a_full_queue_drops_with_one_warning_and_the_flush_wait_is_bounded(
    tmp_path: Path,
) -> None:
    block = threading.Event()  # the backend hangs: nothing drains
    tracker = RecordingTracker(
        block=block, queue_size=2, batch_size=1, send_interval=0, flush_timeout=0.2
    )
    try:
        with pytest.warns(TrackerWarning) as record:
            _run(tmp_path, tracker, max_epochs=3, pause=0.01)
    finally:
        block.set()
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages
    # The pump found the queue full while the worker hung; the warning came with a later entry.
    assert "queue is full (2 entries" in messages[0] and "drops the oldest" in messages[0]
    counts = tracker.report
    # Two entries went to the worker (one in the hung call, one waiting for it: the most it
    # holds), two wait in the queue, the other eight were dropped.
    assert (counts.queued, counts.dropped, counts.unsent, counts.sent) == (4, 8, 4, 0)
    assert counts.timed_out
    assert "sent 0 of 12 entries" in messages[1]
    assert "8 dropped because the queue was full" in messages[1]
    assert "4 still queued when the flush gave up after 0.2 s" in messages[1]
    # The training thread never called the backend, even while it hung.
    assert threading.current_thread().name not in {thread for _, thread in tracker.calls}


def test_resume_continues_the_run_and_its_steps(tmp_path: Path) -> None:
    first = RecordingTracker()
    log_report = LogReport(trigger=(1, "iteration"))
    manager = linear_manager(
        tmp_path, [log_report, first], max_epochs=2, iters_per_epoch=ITERS_PER_EPOCH
    )
    _train(manager, iterations=5)
    state = manager.state_dict()
    saved = state["extensions"]["RecordingTracker"]["extension"]
    confirmed = saved.pop("entries_confirmed")  # those of the 5 the backend had by then
    assert saved == {"run_id": "run-1", "run_key": first.run_key, "entries_seen": 5}
    assert 0 <= confirmed <= 5
    assert isinstance(first.run_key, str) and len(first.run_key) == 32

    second = RecordingTracker()
    second.held_step = 6  # the backend already holds steps up to 6 (sent after the snapshot)
    manager = linear_manager(
        tmp_path,
        [LogReport(trigger=(1, "iteration")), second],
        max_epochs=2,
        iters_per_epoch=ITERS_PER_EPOCH,
    )
    manager.load_state_dict(state)
    _train(manager)
    assert second.opened == ["run-1"]
    assert second.steps == [7, 8]  # 6 was held already; nothing restarts at zero
    # 6 was held; so were the unconfirmed of 1-5, handed over again
    assert second.report.skipped == 1 + 5 - confirmed


class ArtifactTracker(RecordingTracker):
    """Records the artifacts it uploads (the base name of each)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.uploaded: list[str] = []

    def log_artifact(self, path: str) -> None:
        self.uploaded.append(Path(path).name)


def _slow_save(target: Any, file_obj: Any) -> None:
    time.sleep(0.5)  # the background save is still running when training ends
    torch.save(target, file_obj)


@pytest.mark.parametrize("writer_class", [ThreadWriter, ProcessWriter])
def test_a_snapshot_of_the_last_iteration_on_a_background_writer_is_uploaded(
    tmp_path: Path, writer_class: type[Writer]
) -> None:
    # Training ends before the stop trigger (a hand-written loop that stops at iteration 6),
    # so the snapshot of iteration 6 goes to the background writer; extensions finalize
    # before the writer, and the tracker's last look for artifacts must come after that save.
    tracker = ArtifactTracker(artifacts="snapshot_iter_*")
    manager = linear_manager(
        tmp_path,
        [LogReport(trigger=(1, "iteration")), tracker],
        max_epochs=10,
        iters_per_epoch=ITERS_PER_EPOCH,
        writer=writer_class(),
    )
    manager.extend(
        snapshot(filename="snapshot_iter_{.iteration}", savefun=_slow_save),
        trigger=(3, "iteration"),
    )
    _train(manager, iterations=6)
    written = sorted(p.name for p in tmp_path.glob("snapshot_iter_*") if "." not in p.name)
    assert written == ["snapshot_iter_3", "snapshot_iter_6"]
    assert sorted(name for name in tracker.uploaded if "." not in name) == written
    assert tracker.report.artifacts_sent == len(tracker.uploaded)


def test_arguments_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="queue_size must be an integer >= 1"):
        RecordingTracker(queue_size=0)
    with pytest.raises(ConfigurationError, match="flush_timeout must be seconds >= 0"):
        RecordingTracker(flush_timeout=-1)


@pytest.mark.parametrize(
    ("name", "package"), [("MLflowLogger", "ppe_mlflow"), ("WandbLogger", "ppe_wandb")]
)
def test_a_tracker_that_is_not_installed_is_named_with_its_install_command(
    name: str, package: str
) -> None:
    from ppe_core.training import extensions

    # The test's plugin host has the built-ins and the device plugins only.
    with pytest.raises(AttributeError, match=f"pip install -e plugins/{package}"):
        getattr(extensions, name)


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _pump(
    capacity: int,
    interval: float,
    deliver: Any,
    *,
    finished: Any = lambda: 0,
    on_full: Any = lambda: None,
) -> Any:
    """A pump of batches of 100 (so at most 200 entries in flight)."""
    from ppe_extensions.tracking._channel import Pump

    return Pump(
        capacity=capacity,
        batch_size=100,
        interval=interval,
        deliver=deliver,
        finished=finished,
        on_full=on_full,
        name="test-pump",
    )


def test_the_pump_hands_whole_batches_bounds_what_is_in_flight_and_drops_the_oldest() -> None:
    delivered: list[list[int] | None] = []
    finished = {"count": -(10**9)}  # nothing may be handed over yet
    full: list[int] = []
    pump = _pump(
        250,
        60.0,
        lambda batch: delivered.append(None if batch is None else [e["iteration"] for e in batch]),
        finished=lambda: finished["count"],
        on_full=lambda: full.append(len(pump.items)),
    )
    for i in range(600):
        pump.put({"iteration": i})
    _wait_for(lambda: full)  # a look found it full: each put pushed out the oldest
    assert delivered == [] and full[0] == 250
    assert [entry["iteration"] for entry in pump.items] == list(range(350, 600))
    assert pump.dropped(600) == 350

    finished["count"] = 0  # the backend is free: two whole batches, then the limit
    _wait_for(lambda: len(delivered) == 2)
    time.sleep(0.2)  # several looks: 50 entries wait, which fill no batch within 60 s
    assert delivered == [list(range(350, 450)), list(range(450, 550))]
    finished["count"] = 200
    time.sleep(0.2)
    assert len(delivered) == 2
    assert (pump.taken, len(pump.items), pump.dropped(600)) == (200, 50, 350)

    pump.close()  # the rest, whatever the interval, then the end
    assert pump.join(5)
    assert delivered[2:] == [list(range(550, 600)), None]
    assert pump.dropped(600) == 350


def test_the_pump_sends_a_partial_batch_after_send_interval() -> None:
    delivered: list[tuple[float, int]] = []
    pump = _pump(
        100,
        0.2,
        lambda batch: delivered.append((time.monotonic(), -1 if batch is None else len(batch))),
    )
    start = time.monotonic()
    for i in range(10):
        pump.put({"iteration": i})
    _wait_for(lambda: delivered)
    took = delivered[0][0] - start
    assert delivered[0][1] == 10
    assert 0.15 <= took < 2.0, took  # about send_interval (looks every 50 ms)
    pump.close()
    assert pump.join(5)
    assert [count for _, count in delivered] == [10, -1]
