"""Tests of ppe_core.writing: crash-safe saves, synchronous and background writers."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import IO, Any

import pytest
import torch

from ppe_core.writing import (
    ProcessQueueWriter,
    ProcessWriter,
    SimpleWriter,
    ThreadQueueWriter,
    ThreadWriter,
    Writer,
    WriterError,
    WriterFinalizedError,
)

# Forking a multi-threaded process warns from Python 3.12 on; spawn is slower but clean there.
MP_CONTEXT = "fork" if sys.version_info < (3, 12) and sys.platform == "linux" else "spawn"


def _trained_state() -> dict[str, Any]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 3)).pow(2).mean()
    loss.backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _assert_same_state(loaded: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, value in expected["model"].items():
        assert torch.equal(loaded["model"][key], value)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def write_bytes(target: bytes, file_obj: IO[bytes]) -> None:
    file_obj.write(target)


class _PartialThenFail:
    """A savefun that writes half of the data, then fails (e.g. disk full, bad object)."""

    def __call__(self, target: bytes, file_obj: IO[bytes]) -> None:
        file_obj.write(target[: len(target) // 2])
        raise OSError("simulated failure halfway through the save")


def test_simple_writer_saves_with_torch_save_and_leaves_no_temp_file(tmp_path: Path) -> None:
    state = _trained_state()
    writer = SimpleWriter()
    writer("snapshot", str(tmp_path), state)
    loaded = torch.load(tmp_path / "snapshot", weights_only=True)
    _assert_same_state(loaded, state)
    assert _leftovers(tmp_path) == []


def test_failed_save_keeps_the_previous_file_and_removes_the_temp_file(tmp_path: Path) -> None:
    writer = SimpleWriter(out_dir=str(tmp_path))
    writer("data", "", b"old content", savefun=write_bytes)
    with pytest.raises(OSError, match="halfway"):
        writer("data", "", b"new content that never lands", savefun=_PartialThenFail())
    assert (tmp_path / "data").read_bytes() == b"old content"
    assert _leftovers(tmp_path) == []


def test_a_process_killed_mid_save_leaves_the_old_file_intact(tmp_path: Path) -> None:
    (tmp_path / "state").write_bytes(b"complete old state")
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from ppe_core.writing import SimpleWriter

        def slow(target, f):
            f.write(b"torn new st")
            f.flush()
            os.fsync(f.fileno())
            print("writing", flush=True)
            time.sleep(60)

        SimpleWriter()("state", {str(tmp_path)!r}, None, savefun=slow)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "writing\n"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    assert (tmp_path / "state").read_bytes() == b"complete old state"
    # The next save still works and replaces the file.
    SimpleWriter()("state", str(tmp_path), b"complete new state", savefun=write_bytes)
    assert (tmp_path / "state").read_bytes() == b"complete new state"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_save_fsyncs_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def recording_replace(src: str, dst: str) -> None:
        events.append(("replace", os.path.basename(src) + " -> " + os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    SimpleWriter()("snap", str(tmp_path), b"payload", savefun=write_bytes)

    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync", "replace", "fsync"]
    tmp_name = os.path.basename(events[0][1])
    assert tmp_name.startswith(".snap.") and tmp_name.endswith(".tmp")
    assert events[1][1] == f"{tmp_name} -> snap"
    assert events[2][1] == str(tmp_path.resolve())


def test_append_keeps_existing_content(tmp_path: Path) -> None:
    writer = SimpleWriter()
    writer("log.jsonl", str(tmp_path), b"first\n", savefun=write_bytes, append=True)
    writer("log.jsonl", str(tmp_path), b"second\n", savefun=write_bytes, append=True)
    assert (tmp_path / "log.jsonl").read_bytes() == b"first\nsecond\n"


def test_writer_out_dir_wins_and_subdirectories_are_created(tmp_path: Path) -> None:
    own = tmp_path / "own"
    writer = SimpleWriter(out_dir=str(own))
    writer("snapshots/iter_10", str(tmp_path / "ignored"), b"x", savefun=write_bytes)
    assert (own / "snapshots" / "iter_10").read_bytes() == b"x"
    assert not (tmp_path / "ignored").exists()


def test_empty_out_dir_means_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    SimpleWriter()("here", "", b"x", savefun=write_bytes)
    assert (tmp_path / "here").read_bytes() == b"x"
    assert _leftovers(tmp_path) == []


def test_unfinalized_queue_writer_completes_its_saves_at_exit(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import time
        from ppe_core.writing import ThreadQueueWriter

        def slow(target, f):
            time.sleep(0.5)
            f.write(target)

        writer = ThreadQueueWriter(savefun=slow, out_dir={str(tmp_path)!r})
        writer("late", "", b"saved at exit")
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert (tmp_path / "late").read_bytes() == b"saved at exit"


def test_savefun_kwargs_are_passed_on(tmp_path: Path) -> None:
    def save_with_suffix(target: bytes, file_obj: IO[bytes], suffix: bytes) -> None:
        file_obj.write(target + suffix)

    SimpleWriter(savefun=save_with_suffix, suffix=b"!")("f", str(tmp_path), b"hi")
    assert (tmp_path / "f").read_bytes() == b"hi!"


def test_base_writer_call_is_abstract(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError):
        Writer()("f", str(tmp_path), b"")


def test_thread_writer_saves_in_background_and_finalize_waits(tmp_path: Path) -> None:
    state = _trained_state()
    writer = ThreadWriter(out_dir=str(tmp_path))
    writer("snap_1", "", state)
    writer("snap_2", "", state)  # waits for snap_1 first
    writer.finalize()
    for name in ("snap_1", "snap_2"):
        _assert_same_state(torch.load(tmp_path / name, weights_only=True), state)
    assert _leftovers(tmp_path) == []
    with pytest.raises(WriterFinalizedError):
        writer("snap_3", "", state)


def test_thread_writer_reports_a_failed_save(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"old")
    writer = ThreadWriter(savefun=_PartialThenFail(), out_dir=str(tmp_path))
    writer("data", "", b"new data")
    with pytest.raises(WriterError, match="halfway") as info:
        writer.finalize()
    assert isinstance(info.value.__cause__, OSError)
    assert (tmp_path / "data").read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_thread_queue_writer_saves_queued_files_in_order(tmp_path: Path) -> None:
    writer = ThreadQueueWriter(savefun=write_bytes, out_dir=str(tmp_path))
    for i in range(5):
        writer("log", "", f"line {i}\n".encode(), append=True)
    writer("snap", "", b"snapshot")
    writer.finalize()
    writer.finalize()  # idempotent
    assert (tmp_path / "log").read_text().splitlines() == [f"line {i}" for i in range(5)]
    assert (tmp_path / "snap").read_bytes() == b"snapshot"
    assert _leftovers(tmp_path) == []
    with pytest.raises(WriterFinalizedError):
        writer("snap", "", b"late")


def test_thread_queue_writer_reports_failures_at_finalize(tmp_path: Path) -> None:
    writer = ThreadQueueWriter(out_dir=str(tmp_path))
    writer("bad", "", b"data", savefun=_PartialThenFail())
    writer("good", "", b"data", savefun=write_bytes)
    with pytest.raises(WriterError, match=r"'bad'.*halfway"):
        writer.finalize()
    assert (tmp_path / "good").read_bytes() == b"data"
    assert not (tmp_path / "bad").exists()
    assert _leftovers(tmp_path) == []


def test_process_writer_saves_in_a_child_process(tmp_path: Path) -> None:
    state = _trained_state()
    writer = ProcessWriter(out_dir=str(tmp_path), mp_context=MP_CONTEXT)
    writer("snap", "", state)
    writer.finalize()
    _assert_same_state(torch.load(tmp_path / "snap", weights_only=True), state)
    assert _leftovers(tmp_path) == []


def test_process_queue_writer_saves_and_reports_failures(tmp_path: Path) -> None:
    writer = ProcessQueueWriter(out_dir=str(tmp_path), mp_context=MP_CONTEXT)
    writer("a", "", {"x": torch.arange(3)})
    writer("b", "", b"data", savefun=_PartialThenFail())
    with pytest.raises(WriterError, match=r"'b'.*halfway"):
        writer.finalize()
    assert torch.equal(torch.load(tmp_path / "a", weights_only=True)["x"], torch.arange(3))
    assert not (tmp_path / "b").exists()
    assert _leftovers(tmp_path) == []


def test_manager_uses_a_simple_writer_on_its_out_dir(tmp_path: Path) -> None:
    from ppe_core.training.manager import ExtensionsManager

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = ExtensionsManager(model, optimizer, 1, iters_per_epoch=1, out_dir=str(tmp_path / "r"))
    assert isinstance(manager.writer, SimpleWriter)
    assert (tmp_path / "r").is_dir()
    buffer = io.BytesIO()
    torch.save(manager.state_dict(), buffer)
    manager.writer("state", manager.out, buffer.getvalue(), savefun=write_bytes)
    assert (tmp_path / "r" / "state").read_bytes() == buffer.getvalue()


# --- PPE compatibility: the writer classes' signatures and subclassing hooks -------------------

_WRITER_CLASSES = [
    "Writer",
    "SimpleWriter",
    "StandardWriter",
    "ThreadWriter",
    "ProcessWriter",
    "QueueWriter",
    "ThreadQueueWriter",
    "ProcessQueueWriter",
    "TensorBoardWriter",
]


@pytest.mark.parametrize("name", _WRITER_CLASSES)
def test_writer_signatures_accept_what_ppe_accepts(name: str) -> None:
    import inspect

    import pytorch_pfn_extras

    import ppe_core

    ours, theirs = getattr(ppe_core.writing, name), getattr(pytorch_pfn_extras.writing, name)
    for method in ["__init__", "__call__", "save", "initialize", "finalize", "create_worker"]:
        if not hasattr(theirs, method):
            continue
        ppe_params = list(inspect.signature(getattr(theirs, method)).parameters.values())
        our_params = inspect.signature(getattr(ours, method)).parameters
        positional = [p.name for p in our_params.values() if p.kind <= p.POSITIONAL_OR_KEYWORD]
        for index, param in enumerate(ppe_params):
            if param.kind is param.VAR_KEYWORD:
                assert any(p.kind is p.VAR_KEYWORD for p in our_params.values()), (method, param)
                continue
            assert param.name in our_params, (method, param.name)
            if param.kind is param.POSITIONAL_OR_KEYWORD:
                assert positional[index] == param.name, (method, param.name)
    for hook in ["create_worker", "create_queue", "create_consumer", "consume", "create_task"]:
        assert hasattr(ours, hook) == hasattr(theirs, hook), hook


def test_ppe_style_subclasses_of_the_base_writers_work(tmp_path: Path) -> None:
    import queue
    import threading

    from ppe_core.writing import QueueWriter, StandardWriter

    class MyThreadWriter(StandardWriter[threading.Thread]):
        def create_worker(
            self,
            filename: str,
            out_dir: str,
            target: Any,
            *,
            savefun: Any = None,
            append: bool = False,
            **savefun_kwargs: Any,
        ) -> threading.Thread:
            return threading.Thread(
                target=self.save, args=(filename, out_dir, target, savefun, append)
            )

    class MyQueueWriter(QueueWriter[threading.Thread]):
        def create_queue(self) -> Any:
            return queue.Queue()

        def create_consumer(self, q: Any) -> threading.Thread:
            return threading.Thread(target=self.consume, args=(q,))

    standard = MyThreadWriter(savefun=write_bytes, out_dir=str(tmp_path))
    standard("one", "", b"1")
    standard("two", "", b"2")
    standard.finalize()
    queued = MyQueueWriter(savefun=write_bytes, out_dir=str(tmp_path))
    queued("three", "", b"3")
    queued("bad", "", b"xx", savefun=_PartialThenFail())
    with pytest.raises(WriterError, match="'bad'"):
        queued.finalize()
    assert [(tmp_path / n).read_bytes() for n in ["one", "two", "three"]] == [b"1", b"2", b"3"]
    assert not (tmp_path / "bad").exists()


def test_consume_runs_ppe_layout_items_and_acknowledges_each(tmp_path: Path) -> None:
    import queue

    task = SimpleWriter(savefun=write_bytes, out_dir=str(tmp_path))
    writer = ThreadQueueWriter(out_dir=str(tmp_path))
    q: queue.Queue[Any] = queue.Queue()
    for name in ["a", "b"]:
        q.put((task, name, "", name.encode(), None, False))
    q.put(None)
    writer.consume(q)
    q.join()  # returns only if every item, the stop marker included, was acknowledged
    writer.finalize()
    assert (tmp_path / "a").read_bytes() == b"a" and (tmp_path / "b").read_bytes() == b"b"


def test_process_writers_default_to_multiprocessing_process() -> None:
    import multiprocessing

    worker = ProcessWriter().create_worker("f", "", b"", savefun=write_bytes)
    assert isinstance(worker, multiprocessing.Process)


class _CountedPickles:
    """A savefun that counts how often the parent process pickles it."""

    pickled = 0

    def __getstate__(self) -> dict[str, Any]:
        type(self).pickled += 1
        return {}

    def __call__(self, target: bytes, file_obj: IO[bytes]) -> None:
        file_obj.write(target)


def test_process_queue_writer_sends_its_task_once_not_per_save(tmp_path: Path) -> None:
    _CountedPickles.pickled = 0
    writer = ProcessQueueWriter(
        savefun=_CountedPickles(), out_dir=str(tmp_path), mp_context=MP_CONTEXT
    )
    for name in ["a", "b", "c"]:
        writer(name, "", name.encode())
    writer.finalize()
    assert [(tmp_path / n).read_bytes() for n in "abc"] == [b"a", b"b", b"c"]
    # At most once, when a spawned consumer starts (a forked one inherits it).
    assert _CountedPickles.pickled <= 1


def test_tensorboard_writer_lives_in_writing_which_does_not_import_extensions() -> None:
    code = (
        "import sys, ppe_core.writing as w\n"
        "from ppe_extensions._tensorboard_writer import TensorBoardWriter\n"
        "assert w.TensorBoardWriter is TensorBoardWriter\n"
        "from ppe_extensions._tensorboard import TensorBoardWriter as T\n"
        "assert T is TensorBoardWriter\n"
    )
    check = (
        "import sys, ppe_core.writing as w\n"
        "w.TensorBoardWriter\n"
        "loaded = [m for m in sys.modules if m.startswith('ppe_core.training.extensions')]\n"
        "assert not loaded, loaded\n"
    )
    for script in (code, check):
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
