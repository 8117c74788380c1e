"""Snapshots: verified, crash-safe checkpoints of the trainer (or any object) with autoload."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import os
import pickle
import re
import time
import warnings
from collections.abc import Callable
from typing import IO, Any

import torch

from ppe_core.errors import PPEError, PPEWarning
from ppe_core.training._extension import PRIORITY_SNAPSHOT, Extension
from ppe_core.writing import SimpleWriter, Writer

__all__ = [
    "MANIFEST_SUFFIX",
    "SnapshotError",
    "SnapshotVerificationWarning",
    "UnsafeSnapshotError",
    "load_snapshot",
    "snapshot",
    "snapshot_object",
    "verify_snapshot",
]

#: Each snapshot ``F`` has a manifest ``F + MANIFEST_SUFFIX`` recording its size and SHA-256.
MANIFEST_SUFFIX = ".manifest.json"
_FORMAT = "ppe-core-snapshot"


class SnapshotError(PPEError, RuntimeError):
    """A snapshot could not be written, verified or loaded."""


class UnsafeSnapshotError(SnapshotError):
    """A snapshot needs arbitrary unpickling to load, so it was refused."""


class SnapshotVerificationWarning(PPEWarning):
    """A snapshot failed verification (truncated, corrupt, no manifest) and was skipped."""


def _write_bytes(data: bytes, file_obj: IO[bytes]) -> None:
    file_obj.write(data)


def _complete_manifest(path: str) -> dict[str, Any]:
    """The manifest of ``path`` if the file is complete (its size matches); no hashing."""
    manifest_path = path + MANIFEST_SUFFIX
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise SnapshotError(
            f"{path}: no manifest ({manifest_path}); it was not completed"
        ) from None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{path}: unreadable manifest {manifest_path}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise SnapshotError(f"{path}: {manifest_path} is not a ppe-core snapshot manifest")
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read the snapshot: {exc}") from exc
    if size != manifest.get("size"):
        raise SnapshotError(
            f"{path}: size {size} bytes differs from the manifest's {manifest.get('size')} "
            "(truncated or partially written)"
        )
    return manifest


def verify_snapshot(path: str) -> dict[str, Any]:
    """Check ``path`` against its manifest and return the manifest.

    Raises:
        SnapshotError: the manifest is missing or unreadable, or the file's size or SHA-256
            differs from it (a torn, truncated or modified file).
    """
    manifest = _complete_manifest(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != manifest.get("sha256"):
        raise SnapshotError(f"{path}: SHA-256 differs from the manifest (corrupt or modified)")
    return manifest


def _newest_first(found: list[tuple[dict[str, Any], str]]) -> list[str]:
    """Snapshot paths ordered by the iteration (then time) their manifests record."""
    found.sort(key=lambda mp: (int(mp[0].get("iteration", -1)), float(mp[0]["created"])))
    return [path for _, path in reversed(found)]


def load_snapshot(path: str, *, verify: bool = True) -> Any:
    """Load a snapshot safely: verified, then ``torch.load(weights_only=True)``.

    Nothing in the file is executed: a file that needs arbitrary unpickling is refused.

    Raises:
        SnapshotError: verification failed.
        UnsafeSnapshotError: the file holds objects only full unpickling could build.
    """
    if verify:
        verify_snapshot(path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeSnapshotError(
            f"refusing to load snapshot {path}: it contains objects that only arbitrary "
            f"unpickling can build, which could run code from the file ({exc}). Snapshots "
            "written by ppe-core never need that. If you wrote and trust this file, load it "
            "yourself with torch.load(path, weights_only=False) and pass the result to "
            "load_state_dict."
        ) from None


def _glob_pattern(filename: str) -> str:
    """``"snapshot_iter_{.iteration}"`` -> ``"snapshot_iter_*"`` for finding old snapshots."""
    return re.sub(r"\{[^{}]*\}", "*", glob.escape(filename).replace("[{]", "{").replace("[}]", "}"))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class _Snapshot(Extension):
    """Saves ``target.state_dict()`` (the manager's by default) through the writer."""

    trigger = (1, "epoch")
    priority = PRIORITY_SNAPSHOT
    needs_model_state = True

    def __init__(
        self,
        target: Any = None,
        condition: Callable[[], bool] | None = None,
        writer: Writer | None = None,
        filename: str = "snapshot_iter_{.iteration}",
        snapshot_on_error: bool = False,
        n_retains: int = -1,
        autoload: bool = False,
        saver_rank: int | None = None,
        savefun: Callable[..., Any] | None = None,
    ) -> None:
        if not isinstance(filename, str) or not filename:
            raise TypeError(f"filename must be a non-empty str template, got {filename!r}")
        if target is not None and not hasattr(target, "state_dict"):
            raise TypeError(
                f"snapshot target must have state_dict()/load_state_dict() (a model, an "
                f"optimizer, ...), got {type(target).__name__}"
            )
        if not isinstance(n_retains, int) or n_retains == 0 or n_retains < -1:
            raise ValueError(
                f"n_retains must be -1 (keep all) or a positive int, got {n_retains!r}"
            )
        self._target = target
        self.condition = condition
        self.writer = writer
        self.filename = filename
        self._snapshot_on_error = snapshot_on_error
        self.n_retains = n_retains
        self.autoload = autoload
        self._saver_rank = saver_rank
        self._savefun = savefun or torch.save
        self.loaded_from: str | None = None

    @property
    def default_name(self) -> str:
        return "snapshot" if self._target is None else "snapshot_object"

    def _out_dir(self, manager: Any) -> str:
        writer = self.writer or getattr(manager, "writer", None)
        return str(getattr(writer, "out_dir", None) or manager.out)

    def _writer(self, manager: Any) -> Writer:
        writer = self.writer or getattr(manager, "writer", None)
        if writer is None:
            writer = self.writer = SimpleWriter()
        return writer

    def _state(self, manager: Any) -> Any:
        target = manager if self._target is None else self._target
        return target.state_dict() if hasattr(target, "state_dict") else target

    # Autoload ---------------------------------------------------------------------------------
    def initialize(self, manager: Any) -> None:
        if not self.autoload:
            return
        path, state = self._newest_valid(self._out_dir(manager))
        if path is None:
            return
        target = manager if self._target is None else self._target
        try:
            target.load_state_dict(state)
        except Exception as exc:
            raise SnapshotError(
                f"autoloading snapshot {path} failed: {exc}. Point out_dir elsewhere or remove "
                "the snapshot if it belongs to another model."
            ) from exc
        self.loaded_from = path

    def _files(self, out_dir: str) -> list[str]:
        """Files in ``out_dir`` matching the filename template (not manifests or temp files)."""
        return [
            path
            for path in glob.glob(os.path.join(out_dir, _glob_pattern(self.filename)))
            if not path.endswith(MANIFEST_SUFFIX) and not os.path.basename(path).startswith(".")
        ]

    def _newest_valid(self, out_dir: str) -> tuple[str | None, Any]:
        verified = []
        for path in self._files(out_dir):
            try:
                verified.append((verify_snapshot(path), path))
            except SnapshotError as exc:
                warnings.warn(
                    SnapshotVerificationWarning(f"skipping snapshot: {exc}"), stacklevel=4
                )
        if not verified:
            return None, None
        newest = _newest_first(verified)[0]
        return newest, load_snapshot(newest, verify=False)  # verified above

    # Saving -----------------------------------------------------------------------------------
    def __call__(self, manager: Any) -> None:
        if self.condition is not None and not self.condition():
            return
        self._save(manager)

    def on_error(self, manager: Any, exc: BaseException, tb: Any) -> None:
        if self._snapshot_on_error:
            self._save(manager)

    def _save(self, manager: Any) -> None:
        if self._saver_rank is not None and _rank() != self._saver_rank:
            return
        filename = self.filename.format(manager)
        # Serialize now: the bytes are a consistent copy even for background writers, and the
        # hash that makes the snapshot verifiable is computed from exactly what is written.
        buffer = io.BytesIO()
        self._savefun(self._state(manager), buffer)
        data = buffer.getvalue()
        manifest = {
            "format": _FORMAT,
            "version": 1,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "iteration": int(manager.iteration),
            "created": time.time(),
        }
        writer = self._writer(manager)
        out_dir = manager.out
        writer(filename, out_dir, data, savefun=_write_bytes)
        manifest_bytes = json.dumps(manifest, indent=1).encode()
        writer(filename + MANIFEST_SUFFIX, out_dir, manifest_bytes, savefun=_write_bytes)
        if self.n_retains > 0:
            self._remove_old(self._out_dir(manager), keep=filename)

    def _remove_old(self, out_dir: str, keep: str) -> None:
        """Delete all but the newest ``n_retains`` complete snapshots (never an incomplete one)."""
        complete = []
        for path in self._files(out_dir):
            try:
                complete.append((_complete_manifest(path), path))
            except SnapshotError:
                continue  # not complete (yet): a background save may still be writing it
        for path in _newest_first(complete)[self.n_retains :]:
            if os.path.basename(path) == keep:
                continue
            for victim in (path, path + MANIFEST_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(victim)


def snapshot(
    savefun: Callable[..., Any] | None = None,
    filename: str = "snapshot_iter_{.iteration}",
    *,
    target: Any = None,
    condition: Callable[[], bool] | None = None,
    writer: Writer | None = None,
    snapshot_on_error: bool = False,
    n_retains: int = -1,
    autoload: bool = False,
    saver_rank: int | None = None,
) -> _Snapshot:
    """Take a verified snapshot of the trainer (or ``target``) once per epoch by default.

    Each snapshot ``F`` is written crash-safely through the writer together with a manifest
    ``F.manifest.json`` holding its size and SHA-256, after every other extension of the
    iteration ran. With ``autoload=True``, ``initialize`` resumes from the newest snapshot in
    the output directory that verifies; corrupt or truncated ones are skipped with a
    :class:`SnapshotVerificationWarning`. Loading uses ``torch.load(weights_only=True)``.

    Args:
        savefun: Serializer ``savefun(obj, file)``; ``torch.save`` by default.
        filename: Name template formatted with the manager, e.g. ``"snapshot_iter_{.iteration}"``.
        target: Object whose ``state_dict`` is saved (default: the trainer's manager).
        condition: Skip the snapshot when ``condition()`` is false.
        writer: Writer to save through (default: the manager's).
        snapshot_on_error: Also snapshot when training raises.
        n_retains: Keep only the newest N complete snapshots (-1 keeps all); old files are
            deleted only after the new one is complete.
        autoload: Resume from the newest valid snapshot when training starts.
        saver_rank: Under torch.distributed, only this rank writes (``None``: every rank).
    """
    return _Snapshot(
        target=target,
        condition=condition,
        writer=writer,
        filename=filename,
        snapshot_on_error=snapshot_on_error,
        n_retains=n_retains,
        autoload=autoload,
        saver_rank=saver_rank,
        savefun=savefun,
    )


def snapshot_object(
    target: Any,
    filename: str,
    savefun: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> _Snapshot:
    """Snapshot ``target.state_dict()`` (a model, an optimizer, ...) under ``filename``."""
    return snapshot(savefun, filename, target=target, **kwargs)
