"""A damaged run lock: something not a file at the lock path, a lock file deleted while held.

A directory (or FIFO) at ``out_dir/.ppe_core_run.lock`` is refused at start with a clear error.
A lock file deleted or replaced while a run holds it is noticed by the holder at its next
write into ``out_dir``: it warns and takes the lock again, or, if a second run took the
directory meanwhile, raises before writing anything more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from run_lock_helpers import Holder, batches, make_trainer

import ppe_core as ppe
from ppe_core.errors import ConfigurationError, OutputDirectoryInUseError, RunLockWarning
from ppe_core.training._run_lock import RUN_LOCK_FILENAME

E = ppe.training.extensions


def _trainer(out: Path, *extensions: Any) -> Any:
    """run_lock_helpers' trainer with a snapshot at every iteration (a write into out_dir)."""
    trainer = make_trainer(out, *extensions)
    trainer.extend(E.snapshot(filename="snap_{.iteration}"), trigger=(1, "iteration"))
    return trainer


def _holder(out: Path) -> tuple[int, int] | None:
    """The pid in the lock file and the file's inode; None if there is no lock file."""
    path = out / RUN_LOCK_FILENAME
    if not path.exists():
        return None
    return json.loads(path.read_text())["pid"], path.stat().st_ino


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_non_file_at_the_lock_path_is_refused_at_start_naming_it_and_the_fix(
    tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    lock = out / RUN_LOCK_FILENAME
    if kind == "directory":
        lock.mkdir()
    else:
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(lock)
    trainer = _trainer(out)
    with pytest.raises(ConfigurationError) as info:
        trainer.run(batches())
    message = str(info.value)
    assert str(lock) in message and ("a directory" if kind == "directory" else "a FIFO") in message
    assert "remove it" in message and "another out_dir" in message
    assert sorted(os.listdir(out)) == [RUN_LOCK_FILENAME]  # nothing written


@pytest.mark.parametrize("damage", ["deleted", "replaced"])
def test_a_lock_file_deleted_while_held_is_taken_again_at_the_next_write(
    tmp_path: Path, damage: str
) -> None:
    out = tmp_path / "out"
    seen: dict[int, tuple[int, int] | None] = {}

    @ppe.training.make_extension(trigger=(1, "iteration"), priority=ppe.training.PRIORITY_WRITER)
    def damage_lock(manager: Any) -> None:
        seen[manager.iteration] = _holder(out)
        if manager.iteration == 2:
            path = out / RUN_LOCK_FILENAME
            path.unlink()
            if damage == "replaced":  # another file, which nobody locks
                path.write_text(json.dumps({"pid": 1, "host": "elsewhere"}))

    trainer = _trainer(out, damage_lock)
    with pytest.warns(
        RunLockWarning,
        match=r"was (deleted|replaced by another file) while this run held it.*took the lock again",
    ):
        trainer.run(batches())
    assert trainer.iteration == 4
    pid = os.getpid()
    assert seen[1] is not None and seen[1][0] == pid
    # The snapshot of iteration 2 (the next write) took the lock again: a new file, this pid.
    assert seen[3] is not None and seen[3][0] == pid and seen[3][1] != seen[1][1]
    assert seen[4] == seen[3]
    assert sorted(p.name for p in out.glob("snap_*") if "." not in p.name) == [
        f"snap_{i}" for i in range(1, 5)
    ]
    assert not (out / RUN_LOCK_FILENAME).exists()  # released at the end


@pytest.mark.slow
def test_a_second_run_let_in_by_a_deleted_lock_file_stops_the_first_before_its_next_write(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    second: list[Holder] = []

    @ppe.training.make_extension(trigger=(1, "iteration"), priority=ppe.training.PRIORITY_WRITER)
    def let_in_a_second_run(manager: Any) -> None:
        if manager.iteration != 2:
            return
        (out / RUN_LOCK_FILENAME).unlink()
        # A real run (run_lock_helpers.Holder), paused once it holds the directory.
        second.append(Holder(out))

    trainer = _trainer(out, let_in_a_second_run)
    try:
        with pytest.raises(OutputDirectoryInUseError) as info:
            trainer.run(batches())
        pid = second[0].pids[0]
        message = str(info.value)
        assert f"pid {pid}" in message and "deleted" in message
        assert "another out_dir" in message
        assert trainer.iteration == 2
        # The first run wrote no snapshot after the second took the directory...
        assert sorted(p.name for p in out.glob("snap_*")) == ["snap_1"]
        # ... and did not remove the second run's lock file when it ended.
        holder = _holder(out)
        assert holder is not None and holder[0] == pid
        code, out_text, err = second[0].finish()
        assert code == 0 and "done" in out_text, err[-3000:]
    finally:
        for run in second:
            run.close()
