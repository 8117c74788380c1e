"""WandbLogger in W&B's offline mode: the run files hold the JSON log's metrics and steps."""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("wandb", reason="needs wandb: pip install -e plugins/ppe_wandb")

import ppe_wandb.plugin
from ppe_extensions.tracking import TrackerEntry
from ppe_wandb import WandbLogger
from wandb.proto import wandb_internal_pb2

import ppe_core as ppe
import ppe_core.testing
from ppe_core.training import extensions
from ppe_core.training.extension import ExtensionEntry

pytestmark = pytest.mark.slow

ITERS_PER_EPOCH = 4


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import ppe_cpu.plugin

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    with ppe_core.testing.plugin_host(ppe_cpu.plugin, ppe_wandb.plugin):
        yield


def _records(path: Path) -> Iterator[Any]:
    """The records of a ``.wandb`` file: W&B's 7-byte header, then LevelDB-log framing
    (32 KiB blocks; each chunk a 7-byte header: CRC-32C, length, type 1 full / 2 first /
    3 middle / 4 last) around ``wandb_internal_pb2.Record`` messages, W&B's own schema."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            break
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            yield wandb_internal_pb2.Record.FromString(pending)


def _key(item: Any) -> str:
    # A key with a "/" ("main/loss") is stored split, as nested_key.
    return str(item.key) if item.key else "/".join(item.nested_key)


def _history(run_dir: Path) -> list[dict[str, Any]]:
    (path,) = run_dir.glob("run-*.wandb")
    rows = []
    for record in _records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({_key(item): json.loads(item.value_json) for item in record.history.item})
    return rows


def _config(run_dir: Path) -> dict[str, Any]:
    (path,) = run_dir.glob("run-*.wandb")
    config: dict[str, Any] = {}
    for record in _records(path):
        if record.WhichOneof("record_type") == "config":
            config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
    return config


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def _trainer(out: Path, max_epochs: int, tracker: Any, *more: Any) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    log = extensions.LogReport(trigger=(1, "iteration"), filename="log.json")
    return ppe.engine.create_trainer(
        model, optimizer, max_epochs, extensions=[log, tracker, *more], out_dir=str(out)
    )


def _data() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        {"x": torch.randn(4, 3, generator=generator), "t": torch.randn(4, 1, generator=generator)}
        for _ in range(ITERS_PER_EPOCH)
    ]


class ThreadRecordingLogger(WandbLogger):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: set[str] = set()

    def log_metrics(self, entries: Sequence[TrackerEntry]) -> None:
        self.threads.add(threading.current_thread().name)
        super().log_metrics(entries)


def _run_dir(root: Path, run_id: str) -> list[Path]:
    # Oldest first: a folder made in the same second as an earlier one gets a "-1" suffix.
    return sorted(root.glob(f"wandb/offline-run-*-{run_id}*"))


def test_the_sender_process_is_the_default() -> None:
    assert WandbLogger(project="ppe").sender == "process"


@pytest.mark.parametrize("sender", ["process", "thread"])
def test_offline_run_files_hold_the_json_logs_metrics_and_steps(
    tmp_path: Path, sender: str
) -> None:
    logger = ThreadRecordingLogger(project="ppe", dir=str(tmp_path), sender=sender)
    trainer = _trainer(tmp_path / "out", 2, logger)
    trainer.run(_data())

    log = json.loads((tmp_path / "out" / "log.json").read_text())
    assert logger.run_id is not None
    (run_dir,) = _run_dir(tmp_path, logger.run_id)
    history = _history(run_dir)
    assert [row["_step"] for row in history] == [entry["iteration"] for entry in log]
    for row, entry in zip(history, log, strict=True):
        assert {k: v for k, v in row.items() if not k.startswith("_")} == entry
    config = _config(run_dir)
    assert config["optimizer/main/class"] == "Adam"
    assert config["optimizer/main/lr"] == 0.01
    assert config["max_epochs"] == 2
    assert logger.sender == sender
    if sender == "process":  # every W&B call ran in the child
        assert logger.sender_pid is not None and logger.sender_pid != os.getpid()
        assert logger.threads == set()
    else:
        assert logger.threads == {"ppe-tracker-ThreadRecordingLogger"}
    assert logger.report.sent == len(log)


def test_resume_continues_the_run_id_and_its_steps(tmp_path: Path) -> None:
    first = WandbLogger(project="ppe", dir=str(tmp_path))
    trainer = _trainer(tmp_path / "a", 1, first)
    trainer.run(_data())

    second = WandbLogger(project="ppe", dir=str(tmp_path))
    resumed = _trainer(tmp_path / "b", 2, second)
    resumed.load_state_dict(trainer.state_dict())
    resumed.run(_data())

    assert first.run_id is not None and second.run_id == first.run_id
    # Offline, each process writes its own run folder for the same id; `wandb sync` joins them.
    before, after = (_history(d) for d in _run_dir(tmp_path, first.run_id))
    assert [row["_step"] for row in before] == [1, 2, 3, 4]
    assert [row["_step"] for row in after] == [5, 6, 7, 8]


def test_the_plugin_registers_the_extension() -> None:
    assert extensions.WandbLogger is WandbLogger


def test_complete_dcp_snapshots_are_saved_whole_with_the_runs_files(tmp_path: Path) -> None:
    # SnapshotMode.DCP writes directories, renamed into place once complete: each one is in
    # the run's files, every file its manifest lists under the directory's name. A directory
    # of the pattern without a manifest (a save killed before it completed, copied out of
    # its temporary directory) and the hidden temporary directories are not.
    import importlib.util

    import torch.distributed as dist

    out = tmp_path / "out"
    if importlib.util.find_spec("numpy") is None:
        # The package's own environment (test_installs_alone) has no numpy, which DCP's object
        # collectives need: the snapshot is refused when created, naming what to install.
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0
        )
        try:
            with pytest.raises(ImportError, match=r"SnapshotMode\.DCP.*pip install numpy"):
                extensions.snapshot(saver_rank=0, snapshot_mode=extensions.SnapshotMode.DCP)
        finally:
            dist.destroy_process_group()
        return
    unfinished = out / "snapshot_iter_99"
    unfinished.mkdir(parents=True)
    (unfinished / "__0_0.distcp").write_bytes(b"partial")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0
    )
    try:
        logger = WandbLogger(project="ppe", dir=str(tmp_path), snapshots=True, sender="thread")
        snap = extensions.snapshot(saver_rank=0, snapshot_mode=extensions.SnapshotMode.DCP)
        trainer = _trainer(
            out, 2, logger, ExtensionEntry(snap, trigger=(ITERS_PER_EPOCH, "iteration"))
        )
        trainer.run(_data())
    finally:
        dist.destroy_process_group()
    assert logger.run_id is not None
    (run_dir,) = _run_dir(tmp_path, logger.run_id)
    files = run_dir / "files"
    saved = sorted(
        str(path.relative_to(files))
        for path in files.rglob("*")
        if path.is_file() and path.parts[len(files.parts)].startswith("snapshot_iter_")
    )
    expected = []
    for name in ("snapshot_iter_4", "snapshot_iter_8"):
        manifest = json.loads((out / name / ".ppe_core_manifest.json").read_text())
        listed = [*manifest["files"], ".ppe_core_manifest.json"]
        expected += [f"{name}/{file}" for file in listed]
        for file in listed:
            assert (files / name / file).read_bytes() == (out / name / file).read_bytes()
    assert saved == sorted(expected)
    assert not list(files.glob(".*"))  # no temporary directory
    assert logger.report.artifacts_sent == 2
