"""Snapshots: verified, crash-safe checkpoints of the trainer (or any object) with autoload."""

from __future__ import annotations

import contextlib
import copy
import enum
import glob
import hashlib
import io
import json
import logging
import os
import pickle
import re
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import IO, Any

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError, PPEError, PPEWarning
from ppe_core.runtime import map_tensors
from ppe_core.training._extension import PRIORITY_SNAPSHOT, Extension
from ppe_core.training._ranks import device_of, object_device
from ppe_core.training._resume import record_ranks
from ppe_core.training._state import PPE_CORE_STATE_KEY
from ppe_core.writing import SimpleWriter, Writer

__all__ = [
    "MANIFEST_SUFFIX",
    "SnapshotError",
    "SnapshotMode",
    "SnapshotRanksError",
    "SnapshotRanksWarning",
    "SnapshotVerificationWarning",
    "UnsafeSnapshotError",
    "load_snapshot",
    "manifest_path",
    "snapshot",
    "snapshot_object",
    "verify_snapshot",
]

#: Each snapshot ``dir/F`` has a manifest ``dir/.F.manifest.json`` (see :func:`manifest_path`)
#: recording its size and SHA-256.
MANIFEST_SUFFIX = ".manifest.json"
_FORMAT = "ppe-core-snapshot"


def manifest_path(path: str) -> str:
    """The manifest of the snapshot at ``path``: a hidden file beside it.

    Hidden so that PPE's autoload, which takes the newest file whose name starts and ends like
    the snapshot filename template, never mistakes a manifest for a snapshot.
    """
    directory, name = os.path.split(path)
    return os.path.join(directory, "." + name + MANIFEST_SUFFIX)


def _read_manifest(path: str) -> tuple[str, Any]:
    """``(manifest path, parsed JSON)``; the pre-0.2 name ``F.manifest.json`` is read too."""
    hidden = manifest_path(path)
    for candidate in (hidden, path + MANIFEST_SUFFIX):
        try:
            with open(candidate, encoding="utf-8") as f:
                return candidate, json.load(f)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(hidden)


class SnapshotError(PPEError, RuntimeError):
    """A snapshot could not be written, verified or loaded."""


class UnsafeSnapshotError(SnapshotError):
    """A snapshot needs arbitrary unpickling to load, so it was refused."""


class SnapshotVerificationWarning(PPEWarning):
    """A snapshot failed verification or could not be read (truncated, corrupt) and was skipped."""


class SnapshotRanksError(SnapshotError):
    """A snapshot that needs every rank (DISTRIBUTED or SHARDED mode, or one autoloading a
    snapshot to resume) is registered on some ranks only, or with another trigger there.

    Raised when the extensions start, on every rank that has it, instead of hanging in a
    collective the other ranks never reach (or training ranks that resumed differently).
    """


class SnapshotRanksWarning(PPEWarning):
    """A DEFAULT-mode snapshot is registered on some ranks only (or with another trigger).

    It then issues no collective (nothing hangs) but cannot gather the other ranks' RNG and
    loader states: a run resumed from it is bit-exact on the saving rank only.
    """


class SnapshotMode(enum.Enum):
    """How snapshots are taken under ``torch.distributed`` (PPE's ``snapshot_mode``).

    ``DEFAULT``: one process writes (under torch.distributed ``saver_rank``, rank 0 by
    default), with every rank's RNG and loader states gathered into the file when every rank
    has the snapshot; no rank waits for the write. ``DISTRIBUTED``: the same, but the process
    group must exist when the snapshot is created, every rank must have the snapshot, and
    every rank waits at a barrier until the saver wrote (PPE's behaviour). ``SHARDED``: every
    rank writes its own part under ``<filename>/<rank>`` (for sharded states such as FSDP's),
    and ``saver_rank`` marks the directory complete.
    """

    DEFAULT = enum.auto()
    DISTRIBUTED = enum.auto()
    SHARDED = enum.auto()


_log = logging.getLogger("ppe_core.snapshot")


def _write_bytes(data: bytes, file_obj: IO[bytes]) -> None:
    file_obj.write(data)


def _writes_in_background(writer: Any) -> bool:
    """Whether ``writer`` saves in a worker (ThreadWriter, ProcessWriter, the queue writers)."""
    from ppe_core.writing import ProcessQueueWriter, ProcessWriter, ThreadQueueWriter, ThreadWriter

    return isinstance(writer, (ThreadWriter, ProcessWriter, ThreadQueueWriter, ProcessQueueWriter))


#: Host copies of tensors at least this large are kept for the next snapshot and refilled:
#: allocating a fresh buffer of that size costs page faults on every snapshot (about 30 ms
#: for 50 MB), several times the copy itself.
_REUSE_BYTES = 1 << 16

_BufferKey = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


def _reuse_key(t: torch.Tensor) -> _BufferKey | None:
    """Key of a host buffer ``t`` can be copied into, or None for tensors always copied afresh.

    Only plain dense tensors (no subclass, quantized, sparse or conjugate/negative views) large
    enough to matter; a refilled buffer is then identical to ``t.to("cpu", copy=True)``.
    """
    if (
        type(t) not in (torch.Tensor, torch.nn.Parameter)
        or t.layout is not torch.strided
        or t.is_quantized
        or t.is_conj()
        or t.is_neg()
        or t.numel() * t.element_size() < _REUSE_BYTES
        or not t.is_contiguous()
    ):
        return None
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


def _host_copy(obj: Any, reuse: dict[_BufferKey, list[torch.Tensor]] | None = None) -> Any:
    """A copy of a state whose tensors are host tensors of their own and whose other values are
    deep copies: what a background save reads while training goes on changing the originals.

    Args:
        obj: The state (nested containers of tensors and other values).
        reuse: Host buffers no save reads any more (those of the previous snapshot, whose save
            finished). Large tensors are copied into a matching one instead of a new
            allocation; on return it holds this copy's large buffers, for the next call.
    """
    if reuse is None:
        return map_tensors(obj, lambda t: t.detach().to("cpu", copy=True), leaf=copy.deepcopy)
    free, used = dict(reuse), reuse
    used.clear()

    def copy_tensor(t: torch.Tensor) -> torch.Tensor:
        key = _reuse_key(t)
        if key is None:
            return t.detach().to("cpu", copy=True)
        buffers = free.get(key)
        if buffers:
            host = buffers.pop()
            host.copy_(t.detach())
        else:
            host = t.detach().to("cpu", copy=True)
        used.setdefault(key, []).append(host)
        return host

    return map_tensors(obj, copy_tensor, leaf=copy.deepcopy)


def _save_and_hash(state: Any, path: str) -> tuple[int, str]:
    """``torch.save(state, path)``, then ``(size, SHA-256)`` of the file it wrote.

    Given a path, torch.save writes from C++ without holding the GIL, and reading the file back
    in chunks releases it too; serializing into a Python buffer instead holds the GIL for the
    whole copy (tens of ms per 50 MB), stalling the training thread. The file is flushed to
    disk (in a helper thread) while it is hashed, so the writer's own ``fsync`` that follows
    finds nothing left to write; a failed flush is raised here.
    """
    torch.save(state, path)
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))
    failure: list[OSError] = []

    def flush() -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            failure.append(exc)

    flusher = threading.Thread(target=flush, name="ppe_core snapshot fsync", daemon=True)
    flusher.start()
    try:
        result = _file_digest(path)
    finally:
        flusher.join()
        os.close(fd)
    if failure:
        raise failure[0]
    return result


def _file_digest(path: str) -> tuple[int, str]:
    """``(size, SHA-256 hex digest)`` of the file at ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    chunk = bytearray(1 << 20)
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(chunk):
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


def _complete_manifest(path: str) -> dict[str, Any]:
    """The manifest of ``path`` if the file is complete (its size matches); no hashing."""
    where = manifest_path(path)
    try:
        where, manifest = _read_manifest(path)
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no manifest ({where}); it was not completed") from None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{path}: unreadable manifest {where}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise SnapshotError(f"{path}: {where} is not a ppe-core snapshot manifest")
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
    if _file_digest(path)[1] != manifest.get("sha256"):
        raise SnapshotError(f"{path}: SHA-256 differs from the manifest (corrupt or modified)")
    return manifest


def load_snapshot(path: str, *, verify: bool = True) -> Any:
    """Load a snapshot safely: verified, then ``torch.load(weights_only=True)``.

    Nothing in the file is executed: a file that needs arbitrary unpickling is refused.
    ``verify=False`` loads a file without a manifest (one written by PPE, for example).

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


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _rank() -> int:
    dist = _dist()
    return int(dist.get_rank()) if dist is not None else 0


def _world_size() -> int:
    dist = _dist()
    return int(dist.get_world_size()) if dist is not None else 1


class _Candidate:
    """A file that may be a snapshot: its path, manifest (if any) and age."""

    __slots__ = ("manifest", "path", "when")

    def __init__(self, path: str) -> None:
        self.path = path
        self.manifest: dict[str, Any] | None = None
        try:
            _, manifest = _read_manifest(path)
            if isinstance(manifest, dict) and manifest.get("format") == _FORMAT:
                self.manifest = manifest
        except (OSError, ValueError):
            pass
        when: Any = None if self.manifest is None else self.manifest.get("created")
        if not isinstance(when, (int, float)):
            try:
                when = os.path.getmtime(path)
            except OSError:
                when = 0.0
        self.when = float(when)


class _Snapshot(Extension):
    """Saves ``target.state_dict()`` (the manager's by default) through the writer."""

    trigger = (1, "epoch")
    priority = PRIORITY_SNAPSHOT
    runs_last = True  # after this iteration's triggers, so their saved states include it
    needs_model_state = True

    def __init__(
        self,
        target: Any = None,
        condition: Callable[[], bool] | None = None,
        writer: Writer | None = None,
        filename: str | Callable[[Any], str] = "snapshot_iter_{.iteration}",
        snapshot_on_error: bool = False,
        n_retains: int = -1,
        autoload: bool = False,
        savefun: Callable[..., Any] | None = None,
        saver_rank: int | None = None,
    ) -> None:
        if not (callable(filename) or (isinstance(filename, str) and filename)):
            raise ArgumentTypeError(
                f"filename must be a non-empty str template (e.g. 'snapshot_iter_{{.iteration}}')"
                f" or a callable taking the manager, got {filename!r}"
            )
        if autoload and not isinstance(filename, str):
            raise ConfigurationError(
                "autoload=True needs a str filename template to find earlier snapshots; a "
                "callable filename cannot be matched against the files in out_dir"
            )
        if isinstance(target, Mapping):
            bad = [k for k, v in target.items() if not hasattr(v, "state_dict")]
            if bad:
                raise ArgumentTypeError(
                    f"snapshot target values must have state_dict()/load_state_dict(); {bad} do not"
                )
        elif target is not None and not hasattr(target, "state_dict"):
            raise ArgumentTypeError(
                f"snapshot target must have state_dict()/load_state_dict() (a model, an "
                f"optimizer, ...) or be a dict of such objects, got {type(target).__name__}"
            )
        if isinstance(n_retains, bool) or not isinstance(n_retains, int):
            raise ArgumentTypeError(f"n_retains must be an int (-1 keeps all), got {n_retains!r}")
        self._target = target
        self.condition = condition
        self.writer = writer
        self.filename = filename
        self._snapshot_on_error = snapshot_on_error
        self.n_retains = n_retains
        self.autoload = autoload
        self._saver_rank = saver_rank
        self._savefun = savefun or torch.save
        self._written: list[str] = []  # paths written, for n_retains with a callable filename
        # With a background writer: the save in flight (at most one) and its failure, if any.
        self._in_flight: threading.Thread | None = None
        self._background_error: BaseException | None = None
        # The large host buffers of the last background snapshot, refilled by the next one.
        self._host_buffers: dict[_BufferKey, list[torch.Tensor]] = {}
        #: The path of the snapshot autoload restored, or None.
        self.loaded_from: str | None = None
        # Set by initialize: the ranks lacking this snapshot (see ranks_lacking), and whether
        # every rank has it, so that it may issue collectives.
        self._lacking: tuple[int, ...] | None = None
        self._collective = False
        # Where this rank trains: object collectives put their payload there (NCCL).
        self._device: torch.device | None = None
        # Every rank's resume data, gathered for the save in progress (the saver's only).
        self._rank_states: list[Any] | None = None

    #: The mode named in :attr:`collectives` (subclasses: DISTRIBUTED, SHARDED).
    _mode = "DEFAULT"

    @property
    def collectives(self) -> str | None:
        """The collectives this snapshot issues under torch.distributed (see ``_ranks``).

        Gathering every rank's resume data (when it saves the manager) and comparing what
        autoload found; None when it does neither (it saves another object, without autoload).
        """
        if self._target is not None and not self.autoload and self._mode == "DEFAULT":
            return None
        return (
            f"snapshot(mode={self._mode}, autoload={self.autoload}, manager={self._target is None})"
        )

    def _out_dir(self, manager: Any) -> str:
        writer = self.writer or getattr(manager, "writer", None)
        return str(getattr(writer, "out_dir", None) or manager.out)

    def _writer(self, manager: Any) -> Writer:
        writer = self.writer or getattr(manager, "writer", None)
        if writer is None:
            writer = self.writer = SimpleWriter()
        return writer

    def _state(self, manager: Any) -> Any:
        if self._target is None:
            state = manager.state_dict()
            if isinstance(state, dict):
                # The world size, and every rank's resume data when gathered (__call__).
                internal = state.setdefault(PPE_CORE_STATE_KEY, {})
                record_ranks(internal, _world_size(), self._rank_states)
            return state
        target = self._target
        if isinstance(target, Mapping):
            return {key: value.state_dict() for key, value in target.items()}
        return target.state_dict() if hasattr(target, "state_dict") else target

    def _restore(self, state: Any, manager: Any) -> None:
        target = manager if self._target is None else self._target
        if isinstance(target, Mapping):
            for key, value in target.items():
                value.load_state_dict(state[key])
        else:
            target.load_state_dict(state)

    def _is_saver(self) -> bool:
        """Whether this process writes: all alone, or ``saver_rank`` (default 0) of a group."""
        if _world_size() < 2:
            return True
        return _rank() == self._saver()

    def _saver(self) -> int:
        return 0 if self._saver_rank is None else self._saver_rank

    def _agree(self) -> bool:
        """Whether this snapshot may issue collectives: every rank has it, as agreed at start.

        Otherwise (some ranks lack it) it must not, or the ranks having it would wait forever;
        :meth:`_disagree` then warns (DEFAULT mode) or raises (the modes that need every rank).
        """
        if _world_size() < 2 or self.collectives is None:
            return False
        if self._lacking == ():
            return True
        self._disagree(self._lacking)
        return False

    def _ranks_message(self, lacking: tuple[int, ...] | None) -> str:
        world = _world_size()
        if lacking is None:
            where = (
                f"was registered after the manager of rank {_rank()} started, so the "
                f"{world} ranks could not agree on it"
            )
        else:
            having = [r for r in range(world) if r not in lacking]
            where = (
                f"is registered on ranks {having} but not on ranks {list(lacking)} (or there "
                "with another trigger or epoch length)"
            )
        return f"snapshot {self.name!r} (SnapshotMode.{self._mode}) {where}"

    def _disagree(self, lacking: tuple[int, ...] | None) -> None:
        warnings.warn(
            SnapshotRanksWarning(
                f"{self._ranks_message(lacking)}. It takes its snapshots without any "
                f"collective (so nothing waits for the other ranks), but then holds only rank "
                f"{self._saver()}'s RNG and loader states: a run resumed from it is bit-exact "
                f"on rank {self._saver()} only. Register the same snapshot on every rank "
                "(ppe-core's Trainer does) to save every rank's states."
            ),
            stacklevel=4,
        )

    def _gather_rank_states(self, manager: Any) -> list[Any] | None:
        """Every rank's resume data on the saver (None elsewhere): one ``gather_object``."""
        import torch.distributed as dist

        resume_state_dict = getattr(manager, "resume_state_dict", None)
        own = resume_state_dict() if callable(resume_state_dict) else {}
        saver = self._saver()
        gathered: list[Any] | None = [None] * _world_size() if _rank() == saver else None
        with object_device(self._device):
            dist.gather_object(own, gathered, dst=saver)
        return gathered

    def _check_ranks_agree(self, path: str | None, out_dir: str) -> None:
        """Under torch.distributed, raise on every rank unless all chose the same snapshot.

        One rank writes the snapshots, so a rank that cannot see its files (another
        ``out_dir``, a node without the shared filesystem) would silently start afresh while
        the others resume: the ranks would train different models.
        """
        dist = _dist()
        if dist is None or _world_size() < 2:
            return
        if not self._collective:
            if path is not None:
                raise SnapshotRanksError(
                    f"{self._ranks_message(self._lacking)}, and it found {path} to resume from: "
                    "the ranks without it would not restore it, and the ranks would train "
                    "different models. Register the same snapshot(autoload=True) on every "
                    "rank (ppe-core's Trainer does), or load the snapshot on every rank "
                    "yourself (manager.load_state_dict(load_snapshot(path))) without autoload."
                )
            return
        mine: tuple[str, Any] | None = None
        if path is not None:
            try:
                digest = _read_manifest(path)[1].get("sha256")
            except (OSError, ValueError, AttributeError):
                digest = None
            mine = (os.path.relpath(path, out_dir), digest)
        everyone: list[Any] = [None] * _world_size()
        with object_device(self._device):
            dist.all_gather_object(everyone, mine)
        if any(other != mine for other in everyone):
            chosen = ", ".join(
                f"rank {r}: {'nothing' if c is None else c[0]}" for r, c in enumerate(everyone)
            )
            raise SnapshotError(
                f"autoload found different snapshots on different ranks ({chosen}) in "
                f"{out_dir}. Under torch.distributed one rank writes the snapshots, so every rank "
                "must read the same out_dir (one directory, on a filesystem shared by all nodes)"
            )

    # Autoload ---------------------------------------------------------------------------------
    def initialize(self, manager: Any) -> str | None:  # type: ignore[override]
        """Restores the newest snapshot when ``autoload`` is set.

        Returns:
            The restored file's name relative to the output directory (as PPE returns it),
            or None.

        Raises:
            SnapshotRanksError: Under torch.distributed, a mode that needs every rank (or an
                autoload that found a snapshot) while some ranks lack this snapshot.
        """
        ranks_lacking = getattr(manager, "ranks_lacking", None)
        self._lacking = ranks_lacking(self.name) if callable(ranks_lacking) and self.name else None
        self._collective = self._agree()
        if self._collective:
            self._device = device_of(getattr(manager, "raw_models", {}).values())
        if not self.autoload:
            return None
        out_dir = self._out_dir(manager)
        path, state = self._newest_valid(out_dir)
        self._check_ranks_agree(path, out_dir)
        if path is None:
            return None
        try:
            self._restore(state, manager)
        except Exception as exc:
            raise SnapshotError(
                f"autoloading snapshot {path} failed: {exc}. Point out_dir elsewhere or remove "
                "the snapshot if it belongs to another model."
            ) from exc
        self.loaded_from = path
        return os.path.relpath(path, out_dir)

    def _files(self, out_dir: str) -> list[str]:
        """Files in ``out_dir`` matching the filename template (not manifests or temp files)."""
        if not isinstance(self.filename, str):
            return [path for path in self._written if os.path.exists(path)]
        return [
            path
            for path in glob.glob(os.path.join(out_dir, _glob_pattern(self.filename)))
            if not path.endswith(MANIFEST_SUFFIX)
            and not os.path.basename(path).startswith(".")
            and os.path.isfile(path)
        ]

    def _newest_valid(self, out_dir: str) -> tuple[str | None, Any]:
        """The newest snapshot that verifies (or, without a manifest, that loads).

        Snapshots with a manifest are verified against it; files without one (written by
        PPE, or by a run killed between the two writes, whose data file is complete because
        writers rename it into place) are loaded as they are. Unreadable ones are skipped
        with a :class:`SnapshotVerificationWarning`, falling back to the next newest.
        """
        candidates = [_Candidate(path) for path in self._files(out_dir)]
        candidates.sort(
            key=lambda c: (c.when, int((c.manifest or {}).get("iteration", -1))), reverse=True
        )
        for candidate in candidates:
            path = candidate.path
            try:
                if candidate.manifest is not None:
                    verify_snapshot(path)
                    return path, load_snapshot(path, verify=False)
                state = self._load_unverified(path)
            except UnsafeSnapshotError:
                raise
            except SnapshotError as exc:
                warnings.warn(
                    SnapshotVerificationWarning(f"skipping snapshot: {exc}"), stacklevel=4
                )
                continue
            _log.info("loaded %s without a manifest (not written by ppe-core)", path)
            return path, state
        return None, None

    @staticmethod
    def _load_unverified(path: str) -> Any:
        try:
            return load_snapshot(path, verify=False)
        except UnsafeSnapshotError:
            raise
        except (OSError, RuntimeError, EOFError, ValueError) as exc:
            # torch.load of a torn file fails with RuntimeError (bad zip) or EOFError.
            raise SnapshotError(
                f"{path}: unreadable snapshot without a manifest (truncated?): {exc}"
            ) from exc

    # Saving -----------------------------------------------------------------------------------
    def __call__(self, manager: Any) -> None:
        # Every rank reaches this iteration's trigger alike (agreed at start), so the gather
        # comes before the condition, which only the saver's answer decides.
        if self._collective and self._target is None:
            self._rank_states = self._gather_rank_states(manager)
        try:
            if self.condition is not None and not self.condition():
                return
            # When training stops after this iteration, run() would wait for a background save
            # at once: saving in this thread spares the host copy of the whole state.
            self._save(manager, final=bool(getattr(manager, "stop_trigger", False)))
        finally:
            self._rank_states = None
        # No barrier: no rank reads the file while training, and the writes are atomic, so a
        # rank failing meanwhile at worst loses this snapshot (resume takes the previous one).

    def on_error(self, manager: Any, exc: BaseException, tb: Any) -> None:
        if self._snapshot_on_error:
            self._save(manager, final=True)  # no barrier: the other ranks may not be failing
        self._wait_in_flight(raise_error=False)  # the run's error is the one to report

    def finalize(self, manager: Any) -> None:
        self._host_buffers.clear()  # after the last save (waited for below) nothing reads them
        self._wait_in_flight()
        # A writer given to the snapshot alone is finalized here (flushing background
        # writes); the manager's writer is the manager's to finalize.
        if self.writer is not None and self.writer is not getattr(manager, "writer", None):
            self.writer.finalize()

    def _filename(self, manager: Any) -> str:
        filename = self.filename
        return str(filename(manager)) if callable(filename) else filename.format(manager)

    def _save(self, manager: Any, final: bool = False) -> None:
        if not self._is_saver():
            return
        self._write(manager, self._filename(manager), final)

    def _write(self, manager: Any, filename: str, final: bool = False) -> None:
        """Writes the snapshot; ``final``: nothing trains after it (the end, or an error), so
        a background writer's save is done in this thread, from the state itself."""
        writer = self._writer(manager)
        iteration = int(manager.iteration)
        out_dir, files_dir = manager.out, self._out_dir(manager)
        background = _writes_in_background(writer)
        by_path = self._path_writer(writer, background)
        if not background:
            self._commit(
                writer.__call__,
                filename,
                out_dir,
                files_dir,
                self._state(manager),
                iteration,
                by_path,
            )
            return

        # A background writer's __call__ would save later, in its worker: the snapshot calls
        # its save() itself, in this thread (final) or in one thread of the snapshot's.
        def save(name: str, directory: str, data: bytes, *, savefun: Any) -> None:
            writer.save(name, directory, data, savefun, False)

        # The previous snapshot's files come first (n_retains), and its host buffers are free.
        self._wait_in_flight()
        if final:
            self._commit(
                save, filename, out_dir, files_dir, self._state(manager), iteration, by_path
            )
            return
        # Training pauses only to copy the state to host memory; the serialization, the hash
        # and both files are done by the snapshot's thread (data file first, then its manifest,
        # so a crash never leaves a manifest without data). Buffers are not reused when a
        # custom savefun, which might keep what it was given, serializes.
        reuse = self._host_buffers if self._savefun is torch.save else None
        state = _host_copy(self._state(manager), reuse)

        def run() -> None:
            try:
                self._commit(save, filename, out_dir, files_dir, state, iteration, by_path)
            except BaseException as exc:  # reported by the next snapshot or at finalize
                self._background_error = exc

        thread = threading.Thread(target=run, name=f"ppe_core snapshot {filename}", daemon=False)
        self._in_flight = thread
        thread.start()

    def _path_writer(self, writer: Writer, background: bool) -> Writer | None:
        """``writer`` when the snapshot can be ``torch.save``-d straight to its temporary file.

        That is when the serializer is torch.save, the files are local, and the writer saves
        the standard way: ppe-core's background writers (whose :meth:`Writer.save` the
        snapshot's thread calls) or a plain :class:`SimpleWriter`. Otherwise None: the state is
        serialized into memory and written through the writer as before.
        """
        if self._savefun is not torch.save or not isinstance(writer, Writer):
            return None
        if not writer.writes_local_files or type(writer).save is not Writer.save:
            return None
        if background or type(writer).__call__ is SimpleWriter.__call__:
            return writer
        return None

    def _wait_in_flight(self, raise_error: bool = True) -> None:
        """Waits for the background save in flight; re-raises its failure (as SnapshotError)."""
        thread, self._in_flight = self._in_flight, None
        if thread is not None:
            thread.join()
        error, self._background_error = self._background_error, None
        if error is not None:
            self._host_buffers.clear()  # the error's traceback may still reach the last copy
        if error is not None and raise_error:
            raise SnapshotError(
                f"a background snapshot save failed: {type(error).__name__}: {error}. The "
                "previous complete snapshots are untouched; check the disk and the writer."
            ) from error

    def _commit(
        self,
        save: Callable[..., None],
        filename: str,
        out_dir: str,
        files_dir: str,
        state: Any,
        iteration: int,
        by_path: Writer | None = None,
    ) -> None:
        """Serializes ``state``, writes it and its manifest, and applies ``n_retains``.

        With ``by_path`` (see :meth:`_path_writer`) torch.save writes the temporary file itself;
        otherwise ``savefun`` serializes into memory and ``save`` writes the bytes.
        """
        # The hash that makes the snapshot verifiable is computed from exactly what is written.
        if by_path is not None:
            size, sha256 = by_path.save_via_path(
                filename, out_dir, lambda tmp: _save_and_hash(state, tmp)
            )
        else:
            buffer = io.BytesIO()
            self._savefun(state, buffer)
            data = buffer.getvalue()
            size, sha256 = len(data), hashlib.sha256(data).hexdigest()
            save(filename, out_dir, data, savefun=_write_bytes)
        manifest = {
            "format": _FORMAT,
            "version": 1,
            "sha256": sha256,
            "size": size,
            "iteration": iteration,
            "created": time.time(),
        }
        manifest_bytes = json.dumps(manifest, indent=1).encode()
        save(manifest_path(filename), out_dir, manifest_bytes, savefun=_write_bytes)
        path = os.path.join(files_dir, filename)
        if path in self._written:
            self._written.remove(path)
        self._written.append(path)
        if self.n_retains > 0:
            self._remove_old(files_dir, keep=path)

    def _remove_old(self, out_dir: str, keep: str) -> None:
        """Delete all but the newest ``n_retains`` complete snapshots (never an incomplete one).

        Files without a complete manifest (being written, or not written by ppe-core) stay.
        """
        complete = []
        for path in self._files(out_dir):
            try:
                manifest = _complete_manifest(path)
            except SnapshotError:
                continue  # not complete (yet): a background save may still be writing it
            complete.append((int(manifest.get("iteration", -1)), float(manifest["created"]), path))
        complete.sort(reverse=True)
        for _, _, path in complete[self.n_retains :]:
            if os.path.abspath(path) == os.path.abspath(keep):
                continue
            for victim in (path, manifest_path(path), path + MANIFEST_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(victim)
            with contextlib.suppress(ValueError):
                self._written.remove(path)


class _DistributedSnapshot(_Snapshot):
    """Only ``saver_rank`` writes; every rank then waits at a barrier (PPE's DISTRIBUTED).

    Every rank must have it (checked when the extensions start).
    """

    _mode = "DISTRIBUTED"

    def __init__(self, saver_rank: int = 0, **kwargs: Any) -> None:
        super().__init__(saver_rank=saver_rank, **kwargs)
        dist = _dist()
        if dist is None:
            raise SnapshotError(
                "snapshot_mode=SnapshotMode.DISTRIBUTED needs torch.distributed to be "
                "initialized (init_process_group) before the snapshot is created"
            )
        size = _world_size()
        if not 0 <= saver_rank < size:
            raise ConfigurationError(
                f"saver_rank must be in [0, {size}) for a world of {size} processes, got "
                f"{saver_rank}"
            )

    def _disagree(self, lacking: tuple[int, ...] | None) -> None:
        _raise_disagreement(self, lacking)

    def __call__(self, manager: Any) -> None:
        super().__call__(manager)
        dist = _dist()
        if dist is not None and self._collective:
            dist.barrier()  # PPE's DISTRIBUTED mode: no rank goes on before the saver wrote


def _raise_disagreement(snapshot: _Snapshot, lacking: tuple[int, ...] | None) -> None:
    """For the modes that need every rank: fail at start instead of hanging at a save."""
    raise SnapshotRanksError(
        f"{snapshot._ranks_message(lacking)}. This mode needs every rank at each snapshot, "
        "so training would hang at the first one. Register the same snapshot, with the same "
        "trigger, on every rank, or use snapshot_mode=SnapshotMode.DEFAULT, which needs no "
        "other rank."
    )


class _ShardedSnapshot(_Snapshot):
    """Every rank writes ``<filename>/<rank>``; ``saver_rank`` then marks it complete.

    Every rank must have it (checked when the extensions start). Each rank's part holds its
    own resume data, so nothing is gathered.
    """

    _mode = "SHARDED"

    def __init__(
        self,
        filename: str = "snapshot_iter_{.iteration}",
        saver_rank: int = 0,
        **kwargs: Any,
    ) -> None:
        if _dist() is None:
            raise SnapshotError(
                "snapshot_mode=SnapshotMode.SHARDED needs torch.distributed to be initialized "
                "(init_process_group) before the snapshot is created"
            )
        self._snapshot_dir = filename
        super().__init__(filename=os.path.join(filename, str(_rank())), **kwargs)
        self._sharded_saver = saver_rank

    def _is_saver(self) -> bool:
        return True  # every rank writes its own shard

    def _disagree(self, lacking: tuple[int, ...] | None) -> None:
        _raise_disagreement(self, lacking)

    def _gather_rank_states(self, manager: Any) -> list[Any] | None:
        return None  # each rank's part holds its own resume data

    def _check_ranks_agree(self, path: str | None, out_dir: str) -> None:
        pass  # _newest_valid compares the ranks' snapshot directories

    def _save(self, manager: Any, final: bool = False) -> None:
        super()._save(manager, final)
        self._wait_in_flight()  # every rank's part is on disk before the directory is complete
        dist = _dist()
        if dist is not None and self._collective:
            dist.barrier()
        if _rank() == self._sharded_saver:
            directory = self._snapshot_dir.format(manager)
            self._writer(manager)(
                os.path.join(directory, "complete"), manager.out, b"", savefun=_write_bytes
            )

    def _newest_valid(self, out_dir: str) -> tuple[str | None, Any]:
        path, state = super()._newest_valid(out_dir)
        chosen = None if path is None else os.path.dirname(os.path.relpath(path, out_dir))
        dist = _dist()
        if dist is not None and self._collective:
            everyone: list[Any] = [None] * _world_size()
            with object_device(self._device):
                dist.all_gather_object(everyone, chosen)
            if any(other != chosen for other in everyone):
                raise SnapshotError(
                    f"the ranks found different newest sharded snapshots {everyone} in "
                    f"{out_dir}; remove the incomplete ones"
                )
        return path, state


def snapshot(
    savefun: Callable[..., Any] | None = None,
    filename: str | Callable[[Any], str] = "snapshot_iter_{.iteration}",
    *,
    target: Any = None,
    condition: Callable[[], bool] | None = None,
    writer: Writer | None = None,
    snapshot_on_error: bool = False,
    n_retains: int = -1,
    autoload: bool = False,
    saver_rank: int | None = None,
    snapshot_mode: SnapshotMode = SnapshotMode.DEFAULT,
) -> _Snapshot:
    """Take a verified snapshot of the trainer (or ``target``) once per epoch by default.

    Each snapshot ``F`` is written crash-safely through the writer together with a manifest
    ``F.manifest.json`` holding its size and SHA-256, after every other extension of the
    iteration ran. With ``autoload=True``, ``initialize`` resumes from the newest snapshot in
    the output directory: one with a manifest must verify, one without (written by PPE) must
    load; unreadable ones are skipped with a :class:`SnapshotVerificationWarning`. Loading
    uses ``torch.load(weights_only=True)``.

    With a background writer (``ThreadWriter``, ``ProcessWriter``, the queue writers) training
    pauses only to copy the state to host memory, into buffers kept from one snapshot to the
    next (one host copy of the state stays allocated); the file is written by a thread of the
    snapshot's. With the default ``torch.save`` and local files, torch writes the file itself
    (without holding the GIL) and the SHA-256 is read back from it; a custom ``savefun``
    serializes into memory instead.

    Args:
        savefun: Serializer ``savefun(obj, file)``; ``torch.save`` by default.
        filename: Name template formatted with the manager, e.g.
            ``"snapshot_iter_{.iteration}"``, or a callable ``filename(manager) -> str``.
        target: Object whose ``state_dict`` is saved, or a dict of such objects (default:
            the manager).
        condition: Skip the snapshot when ``condition()`` is false.
        writer: Writer to save through (default: the manager's); not together with
            ``savefun``, as in PPE.
        snapshot_on_error: Also snapshot when training raises.
        n_retains: Keep only the newest N complete snapshots (N > 0; otherwise all are kept);
            old files are deleted only after the new one is complete.
        autoload: Resume from the newest valid snapshot when training starts.
        saver_rank: Under torch.distributed, only this rank writes (``None``: rank 0), with
            every rank's RNG and loader states gathered into the file when every rank has
            the snapshot (otherwise it warns and saves its own); without a process group the
            one process writes. With ``autoload``, every rank restores the same snapshot
            (checked), each with its own RNG and loader states.
        snapshot_mode: How ranks share the work under torch.distributed (:class:`SnapshotMode`).

    Raises:
        ArgumentTypeError: Both ``savefun`` and ``writer`` are given (a ``TypeError``, as in
            PPE), or an argument has the wrong type.
    """
    if savefun is not None and writer is not None:
        raise ArgumentTypeError(
            "savefun and writer cannot be given together (as in PPE): pass the writer alone, "
            "or savefun alone to write through the manager's writer"
        )
    kwargs: dict[str, Any] = {
        "target": target,
        "condition": condition,
        "writer": writer,
        "filename": filename,
        "snapshot_on_error": snapshot_on_error,
        "n_retains": n_retains,
        "autoload": autoload,
        "savefun": savefun,
    }
    if snapshot_mode is SnapshotMode.DEFAULT:
        return _Snapshot(saver_rank=saver_rank, **kwargs)
    if not isinstance(snapshot_mode, SnapshotMode):
        raise ArgumentTypeError(
            f"snapshot_mode must be a SnapshotMode (DEFAULT, DISTRIBUTED or SHARDED), got "
            f"{snapshot_mode!r}"
        )
    if saver_rank is None:
        raise ConfigurationError(
            f"snapshot_mode=SnapshotMode.{snapshot_mode.name} needs saver_rank= (e.g. 0)"
        )
    if snapshot_mode is SnapshotMode.DISTRIBUTED:
        return _DistributedSnapshot(saver_rank=saver_rank, **kwargs)
    return _ShardedSnapshot(saver_rank=saver_rank, **kwargs)


def snapshot_object(
    target: Any,
    filename: str | Callable[[Any], str],
    savefun: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> _Snapshot:
    """Snapshot ``target.state_dict()`` (a model, an optimizer, a dict of them) as ``filename``.

    Takes the keyword arguments of :func:`snapshot`.
    """
    return snapshot(savefun, filename, target=target, **kwargs)
