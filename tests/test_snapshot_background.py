"""Tests of the snapshot's fast save path: torch.save to the temporary file, host buffer reuse."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions import _snapshot_base
from ppe_extensions._snapshot import (
    MANIFEST_SUFFIX,
    load_snapshot,
    manifest_path,
    verify_snapshot,
)

import ppe_core as ppe
from ppe_core.errors import ConfigurationError, SnapshotError
from ppe_core.writing import SimpleWriter, ThreadWriter, Writer
from ppe_core.writing._writer_base import _LocalFileSystem

E = ppe.training.extensions


class Wide(torch.nn.Module):
    """Big enough that its weight (64 KiB) goes through the reused host buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(128, 128)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def _data(n: int = 8) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"x": torch.randn(4, 128, generator=g), "t": torch.randint(0, 128, (4,), generator=g)}
        for _ in range(n)
    ]


def _trainer(out: Path, *extensions: Any, writer: Writer | None = None) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Wide(), "cpu")
    # Momentum: the optimizer state holds a large buffer too.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return ppe.engine.create_trainer(
        model, optimizer, 1, out_dir=str(out), extensions=list(extensions), writer=writer
    )


def _manifest(path: Path) -> dict[str, Any]:
    return dict(json.loads(Path(manifest_path(str(path))).read_text()))


def _count_path_saves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    paths: list[str] = []
    real = _snapshot_base.save_and_hash

    def spy(state: Any, path: str) -> tuple[int, str]:
        paths.append(path)
        return real(state, path)

    monkeypatch.setattr(_snapshot_base, "save_and_hash", spy)
    return paths


class _LocalFS:
    """A user-supplied file system (PFIO-like interface) that happens to be local: it hands
    every call to the default one, but is not it."""

    def __init__(self) -> None:
        self._local = _LocalFileSystem()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._local, name)


# Writer.save_via_path ---------------------------------------------------------------------
def test_save_via_path_renames_the_complete_file_into_place(tmp_path: Path) -> None:
    writer = SimpleWriter()
    hooks: list[int] = []
    writer._add_cleanup_hook(lambda: hooks.append(1))
    seen: list[str] = []

    def write(path: str) -> int:
        assert not os.path.exists(path)  # a fresh temporary name beside the destination
        seen.append(path)
        Path(path).write_bytes(b"payload")
        return 7

    assert writer.save_via_path("sub/file", str(tmp_path), write) == 7
    assert (tmp_path / "sub" / "file").read_bytes() == b"payload"
    assert os.path.dirname(seen[0]) == str(tmp_path / "sub")
    assert not os.path.exists(seen[0])
    assert hooks == [1]


def test_save_via_path_failure_keeps_the_previous_file(tmp_path: Path) -> None:
    writer = SimpleWriter(out_dir=str(tmp_path))  # the writer's own out_dir wins
    (tmp_path / "file").write_bytes(b"previous")

    def write(path: str) -> None:
        Path(path).write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        writer.save_via_path("file", "ignored", write)
    assert (tmp_path / "file").read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no temporary left


def test_save_via_path_needs_the_local_file_system(tmp_path: Path) -> None:
    writer = SimpleWriter(fs=_LocalFS())
    assert not writer.writes_local_files and SimpleWriter().writes_local_files
    with pytest.raises(ConfigurationError, match="local file system") as info:
        writer.save_via_path("file", str(tmp_path), lambda path: None)
    assert isinstance(info.value, ValueError)


# Snapshots written by path ----------------------------------------------------------------
@pytest.mark.parametrize("writer_class", [SimpleWriter, ThreadWriter])
def test_default_snapshot_is_torch_saved_to_its_file_and_the_manifest_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer_class: type[Writer]
) -> None:
    paths = _count_path_saves(monkeypatch)
    trainer = _trainer(tmp_path, writer=writer_class())
    trainer.extend(E.snapshot(filename="snap_{.iteration}"), trigger=(4, "iteration"))
    trainer.run(_data())
    assert len(paths) == 2
    for iteration in (4, 8):
        path = tmp_path / f"snap_{iteration}"
        data = path.read_bytes()
        manifest = _manifest(path)
        assert manifest["size"] == len(data)
        assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
        assert manifest["iteration"] == iteration
        verify_snapshot(str(path))
    final = load_snapshot(str(tmp_path / "snap_8"))["models"]["main"]
    for key, value in trainer.models["main"].state_dict().items():
        assert torch.equal(final[key], value)
    assert not list(tmp_path.glob(".*.tmp"))


def test_custom_savefun_and_custom_fs_save_through_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _count_path_saves(monkeypatch)
    files: list[Any] = []

    def savefun(obj: Any, file_obj: Any) -> None:
        files.append(file_obj)
        torch.save(obj, file_obj)

    custom = _trainer(tmp_path / "a", E.snapshot(savefun=savefun, filename="snap"))
    custom.run(_data(2))
    other_fs = _trainer(
        tmp_path / "b", E.snapshot(filename="snap"), writer=ThreadWriter(fs=_LocalFS())
    )
    other_fs.run(_data(2))
    assert paths == []
    # As in PPE, savefun gets the writer's open temporary file, renamed into place after.
    assert files and all(f.name.endswith(".tmp") and f.closed for f in files)
    for run in ("a", "b"):
        state = load_snapshot(str(tmp_path / run / "snap"))  # verified against the manifest
        assert state["models"]["main"]["fc.weight"].shape == (128, 128)


def test_background_snapshots_reusing_host_buffers_equal_synchronous_ones(
    tmp_path: Path,
) -> None:
    every = (1, "iteration")  # each snapshot refills the previous one's host buffers
    sync = _trainer(tmp_path / "sync")
    sync.extend(E.snapshot(filename="snap_{.iteration}"), trigger=every)
    sync.run(_data())
    background = _trainer(tmp_path / "bg", writer=ThreadWriter())
    background.extend(E.snapshot(filename="snap_{.iteration}"), trigger=every)
    background.run(_data())
    for iteration in range(1, 9):
        name = f"snap_{iteration}"
        expected = load_snapshot(str(tmp_path / "sync" / name))
        saved = load_snapshot(str(tmp_path / "bg" / name))
        for key, value in expected["models"]["main"].items():
            assert torch.equal(saved["models"]["main"][key], value), (iteration, key)
        momentum = expected["optimizers"]["main"]["state"][0]["momentum_buffer"]
        assert torch.equal(saved["optimizers"]["main"]["state"][0]["momentum_buffer"], momentum)


def test_host_copy_refills_matching_buffers_only() -> None:
    big = torch.arange(128 * 128, dtype=torch.float32).reshape(128, 128)
    small = torch.ones(3)
    buffers: dict[Any, list[torch.Tensor]] = {}
    first = _snapshot_base.host_copy({"big": big, "small": small, "n": [1]}, buffers)
    assert first["big"].data_ptr() != big.data_ptr() and torch.equal(first["big"], big)
    big.add_(1.0)  # training goes on
    assert torch.equal(first["big"], big - 1.0)  # the copy is the state when it was taken
    second = _snapshot_base.host_copy({"big": big, "small": small, "n": [1]}, buffers)
    assert second["big"].data_ptr() == first["big"].data_ptr()  # refilled, not reallocated
    assert torch.equal(second["big"], big) and not second["big"].requires_grad
    assert second["small"].data_ptr() != first["small"].data_ptr()  # small ones: fresh copies
    # A different shape, dtype or a non-contiguous view never lands in a mismatching buffer.
    for other in (big.t(), big.double(), big.reshape(64, 256)):
        third = _snapshot_base.host_copy({"big": other}, dict(buffers))
        assert torch.equal(third["big"], other) and third["big"].stride() == other.stride()
        assert third["big"].data_ptr() != second["big"].data_ptr()


def test_host_buffers_are_not_reused_for_a_custom_savefun(tmp_path: Path) -> None:
    kept: list[Any] = []

    def savefun(obj: Any, file_obj: Any) -> None:
        kept.append(obj)  # a savefun may keep what it was given
        torch.save(obj, file_obj)

    trainer = _trainer(tmp_path, writer=ThreadWriter())
    trainer.extend(
        E.snapshot(savefun=savefun, filename="snap_{.iteration}"), trigger=(1, "iteration")
    )
    trainer.run(_data(3))
    weights = [state["models"]["main"]["fc.weight"] for state in kept]
    assert len({w.data_ptr() for w in weights}) == 3
    assert not torch.equal(weights[0], weights[2])


def test_failed_path_save_raises_and_keeps_the_previous_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _snapshot_base.save_and_hash
    calls: list[str] = []

    def second_fails(state: Any, path: str) -> tuple[int, str]:
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"torn")  # half-written, then the disk fails
            raise OSError("no space left on device")
        return real(state, path)

    monkeypatch.setattr(_snapshot_base, "save_and_hash", second_fails)
    trainer = _trainer(tmp_path, writer=ThreadWriter())
    trainer.extend(E.snapshot(filename="snap_{.iteration}"), trigger=(4, "iteration"))
    with pytest.raises(SnapshotError, match="background snapshot save failed"):
        trainer.run(_data(12))  # snap_8 fails in the background; raised before snap_12
    verify_snapshot(str(tmp_path / "snap_4"))  # the previous one is intact
    assert not (tmp_path / "snap_8").exists()
    assert not Path(manifest_path(str(tmp_path / "snap_8"))).exists()
    assert not (tmp_path / "snap_12").exists()
    # No temporary file and no manifest but the first snapshot's.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".snap_4" + MANIFEST_SUFFIX, "snap_4"]


def test_a_failed_flush_to_disk_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError("I/O error")

    # The writer flushes what the snapshot's torch.save wrote (save_via_path), in its worker.
    monkeypatch.setattr(_snapshot_base.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="I/O error"):
        SimpleWriter().save_via_path(
            "file",
            str(tmp_path),
            lambda tmp: _snapshot_base.save_and_hash({"x": torch.ones(2)}, tmp),
        )
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


def test_the_final_snapshot_of_a_background_writer_is_saved_without_a_host_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run() would wait for it at once: it is saved in the training thread, from the state."""
    copies: list[int] = []
    real = _snapshot_base.host_copy

    def counting(obj: Any, reuse: Any = None) -> Any:
        copies.append(1)
        return real(obj, reuse)

    monkeypatch.setattr(_snapshot_base, "host_copy", counting)
    trainer = _trainer(tmp_path, writer=ThreadWriter())
    trainer.extend(E.snapshot(filename="snap_{.iteration}"), trigger=(4, "iteration"))
    trainer.run(_data())
    assert len(copies) == 1  # snap_4 only; snap_8 is the last iteration's
    final = load_snapshot(str(tmp_path / "snap_8"))  # verified against its manifest
    weight = trainer.models["main"].fc.weight.detach()
    assert torch.equal(final["models"]["main"]["fc.weight"], weight)


def test_snapshot_on_error_with_a_background_writer_is_written_before_the_error_propagates(
    tmp_path: Path,
) -> None:
    class Boom(RuntimeError):
        pass

    def fail_at_6(manager: Any) -> None:
        if manager.iteration == 6:
            raise Boom("stop here")

    trainer = _trainer(tmp_path, writer=ThreadWriter())
    trainer.extend(
        E.snapshot(filename="snap_{.iteration}", snapshot_on_error=True), trigger=(4, "iteration")
    )
    trainer.extend(fail_at_6, trigger=(1, "iteration"))
    with pytest.raises(Boom):
        trainer.run(_data())
    error_snapshot = load_snapshot(str(tmp_path / "snapshots_on_error" / "snap_6"))
    assert error_snapshot["models"]["main"]["fc.weight"].shape == (128, 128)


@pytest.fixture
def world_of_one(tmp_path: Path) -> Any:
    """A single-process gloo group (what the distributed snapshot modes need)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0
    )
    try:
        yield dist
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("writer", [SimpleWriter, ThreadWriter])
@pytest.mark.parametrize("mode", ["DISTRIBUTED", "SHARDED"])
def test_distributed_snapshot_modes_write_every_snapshot_the_last_one_too(
    tmp_path: Path, world_of_one: Any, writer: type[Writer], mode: str
) -> None:
    out = tmp_path / "out"
    trainer = _trainer(out, writer=writer())
    snapshot_mode = getattr(E.SnapshotMode, mode)
    trainer.extend(
        E.snapshot(filename="snap_{.iteration}", snapshot_mode=snapshot_mode, saver_rank=0),
        trigger=(4, "iteration"),
    )
    trainer.run(_data())
    for it in (4, 8):  # 8: the last iteration's, saved in the training thread
        path = out / f"snap_{it}" / "0" if mode == "SHARDED" else out / f"snap_{it}"
        assert load_snapshot(str(path))["models"]["main"]["fc.weight"].shape == (128, 128)
        if mode == "SHARDED":
            assert (out / f"snap_{it}" / "complete").exists()
