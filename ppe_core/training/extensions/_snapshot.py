"""Snapshots: verified, crash-safe checkpoints of the trainer (or any object) with autoload."""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import glob
import hashlib
import io
import json
import logging
import os
import pickletools
import re
import sys
import threading
import time
import warnings
import zipfile
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping
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
    "ERROR_SNAPSHOT_DIR",
    "MANIFEST_SUFFIX",
    "SnapshotError",
    "SnapshotMode",
    "SnapshotRanksError",
    "SnapshotRanksWarning",
    "SnapshotStateError",
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

#: ``snapshot_on_error`` writes into this sub-directory of the output directory, where neither
#: autoload nor ``n_retains`` looks: the state after a failure is not one a run can resume
#: from bit-exactly, so it must never replace or push out a periodic snapshot.
ERROR_SNAPSHOT_DIR = "snapshots_on_error"


def manifest_path(path: str) -> str:
    """The manifest of the snapshot at ``path``: a hidden file beside it.

    Hidden so that PPE's autoload, which takes the newest file whose name starts and ends like
    the snapshot filename template, never mistakes a manifest for a snapshot.
    """
    directory, name = os.path.split(path)
    return os.path.join(directory, "." + name + MANIFEST_SUFFIX)


def _read_manifest(path: str) -> tuple[str, Any]:
    """``(manifest path, parsed JSON)``; the pre-0.2 name ``F.manifest.json`` is read too.

    Raises:
        FileNotFoundError: there is no manifest under either name.
        OSError, ValueError: a manifest exists but cannot be read or parsed.
    """
    hidden = manifest_path(path)
    for candidate in (hidden, path + MANIFEST_SUFFIX):
        try:
            with open(candidate, encoding="utf-8") as f:
                return candidate, json.load(f)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(hidden)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _manifest_problem(manifest: Any) -> str | None:
    """Why ``manifest`` is not a well-formed ppe-core snapshot manifest, or None if it is."""
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        return "it is not a ppe-core snapshot manifest"
    sha256 = manifest.get("sha256")
    if not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
        return f"its sha256 is not a SHA-256 hex digest: {sha256!r}"
    for key in ("size", "iteration", "version"):
        if not (_is_int(manifest.get(key)) and manifest[key] >= 0):
            return f"its {key} is not a non-negative int: {manifest.get(key)!r}"
    created = manifest.get("created")
    if not isinstance(created, (int, float)) or isinstance(created, bool):
        return f"its created time is not a number: {created!r}"
    return None


def _parse_manifest(path: str) -> dict[str, Any] | None:
    """The manifest of the snapshot at ``path``; None only when there is none at all.

    Raises:
        SnapshotError: a manifest exists but is unreadable (bad JSON, truncated, another
            schema, wrong types). That is a failed check, never "no manifest": loading the
            file unchecked would switch verification off for exactly the damaged snapshots.
    """
    where = manifest_path(path)
    try:
        where, manifest = _read_manifest(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{path}: unreadable manifest {where}: {exc}") from exc
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise SnapshotError(f"{path}: unreadable manifest {where}: {problem}")
    return dict(manifest)


class SnapshotError(PPEError, RuntimeError):
    """A snapshot could not be written, verified or loaded."""


class UnsafeSnapshotError(SnapshotError):
    """A snapshot needs arbitrary unpickling to load, so it was refused."""


class SnapshotStateError(SnapshotError, TypeError):
    """A state to snapshot holds a value that the safe loader could not rebuild at resume."""


class SnapshotVerificationWarning(PPEWarning):
    """A file was skipped at autoload: it failed verification, could not be read (truncated,
    corrupt, an unreadable manifest), is not a snapshot, or links out of the output directory."""


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


def _write_bytes(data: bytes, file_obj: IO[bytes] | str | os.PathLike[str]) -> None:
    """Writes the manifest's bytes; a custom writer may pass its savefun a path (as in PPE)."""
    if isinstance(file_obj, (str, os.PathLike)):
        with open(file_obj, "wb") as f:
            f.write(data)
    else:
        file_obj.write(data)


def _written_digest(writer: Any, path: str) -> tuple[int, str] | None:
    """``(size, SHA-256)`` of the file a writer (or custom savefun) just wrote at ``path``;
    None when it is not there (yet): a custom writer may write elsewhere or later."""
    fs = getattr(writer, "fs", None)
    try:
        if fs is None or (isinstance(writer, Writer) and writer.writes_local_files):
            return _file_digest(path)
        digest = hashlib.sha256()
        size = 0
        with fs.open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        return size, digest.hexdigest()
    except FileNotFoundError:
        return None


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
    manifest = _parse_manifest(path)
    if manifest is None:
        raise SnapshotError(f"{path}: no manifest ({manifest_path(path)}); it was not completed")
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read the snapshot: {exc}") from exc
    if size != manifest["size"]:
        raise SnapshotError(
            f"{path}: size {size} bytes differs from the manifest's {manifest['size']} "
            "(truncated or partially written)"
        )
    return manifest


def verify_snapshot(path: str) -> dict[str, Any]:
    """Check ``path`` against its manifest and return the manifest.

    Raises:
        SnapshotError: the manifest is missing or unreadable (bad JSON, truncated, another
            schema), or the file's size or SHA-256 differs from it (a torn, truncated or
            modified file).
    """
    manifest = _complete_manifest(path)
    if _file_digest(path)[1] != manifest["sha256"]:
        raise SnapshotError(f"{path}: SHA-256 differs from the manifest (corrupt or modified)")
    return manifest


# Safe loading ---------------------------------------------------------------------------------
# torch.load(weights_only=True) rebuilds tensors and plain containers only. The classes below
# are allow-listed for the duration of a snapshot load (never globally): building each runs no
# code from the file (numpy arrays and scalars, dates and times, paths). torch>=2.5 scopes an
# allow-list (torch.serialization.safe_globals); with an older torch none is used, and the save
# refuses such values instead (see _loadable_state).
_SCOPED_ALLOWLIST = hasattr(torch.serialization, "safe_globals")

#: defaultdict factories a snapshot may rebuild (calling them runs no code from the file).
_FACTORIES: tuple[type, ...] = (
    *(list, dict, set, frozenset, tuple, int, float, complex, str, bytes, bool),
    *(OrderedDict, Counter),
)


def _rebuild_defaultdict(factory: Any, items: dict[Any, Any]) -> defaultdict[Any, Any]:
    """Rebuilds a saved ``defaultdict`` (the safe loader cannot fill one item by item)."""
    return defaultdict(factory, items)


class _DefaultDictState(tuple):  # type: ignore[type-arg]
    """``(default_factory, items)`` of a defaultdict, pickled as a call to
    :func:`_rebuild_defaultdict`. A tuple, so that a background snapshot's host copy keeps it."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_rebuild_defaultdict, (self[0], self[1]))


def _numpy() -> Any:
    """numpy if it is imported already (a state holding numpy values imported it), else None."""
    return sys.modules.get("numpy")


def _allowlist() -> list[Any]:
    """What a snapshot load allow-lists beyond torch's defaults (see the comment above)."""
    import datetime
    import pathlib

    allowed: list[Any] = [
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
        datetime.timezone,
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.PosixPath,
        pathlib.WindowsPath,
        _rebuild_defaultdict,
        *_FACTORIES,
    ]
    try:
        import numpy as np
    except ImportError:
        return allowed
    core: Any = np._core if hasattr(np, "_core") else np.core  # numpy 2 / numpy 1
    multiarray = core.multiarray
    allowed += [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype]
    # The dtype classes of every builtin dtype (numpy.dtypes.Float32DType, ...).
    allowed += sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGSUVOMm"}, key=str)
    return allowed


def _load_scope() -> contextlib.AbstractContextManager[Any]:
    if not _SCOPED_ALLOWLIST:
        return contextlib.nullcontext()
    return torch.serialization.safe_globals(_allowlist())


#: Globals torch's safe loader accepts by default or that this module allow-lists by name.
_TORCH_SAFE_GLOBALS = frozenset(
    {"collections.OrderedDict", "collections.Counter", "_codecs.encode", "builtins.set"}
)


def _allowed_name(name: str) -> bool:
    if name.startswith("torch.") or name in _TORCH_SAFE_GLOBALS:
        return True
    if not _SCOPED_ALLOWLIST:
        return False
    return name in {f"{obj.__module__}.{obj.__qualname__}" for obj in _allowlist()}


def _pickle_globals(stream: IO[bytes]) -> Iterator[str]:
    """The globals (``module.name``) one pickle in ``stream`` refers to, read without loading.

    Raises ValueError (or another error) when the bytes are not a well-formed pickle.
    """
    strings: list[str] = []
    memo: dict[Any, str] = {}
    for opcode, arg, _ in pickletools.genops(stream):
        name = opcode.name
        if name == "GLOBAL":
            yield str(arg).replace(" ", ".")
        elif name == "STACK_GLOBAL":
            yield ".".join(strings[-2:])
        elif "UNICODE" in name or "STRING" in name:
            strings.append(arg.decode("latin-1") if isinstance(arg, bytes) else str(arg))
        elif name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif name.endswith("GET") and arg in memo:
            strings.append(memo[arg])


def _refused_globals(data: bytes) -> list[str]:
    """The globals outside the safe loader's allow-list that the pickle in ``data`` (a torch
    archive, or a plain or legacy-torch pickle stream) would need to build its objects.

    Empty when ``data`` is not a well-formed pickle at all (text, random bytes, a zip that is
    not a torch archive): such a file is simply not a snapshot, whereas a well-formed pickle
    naming, e.g., ``os.system`` is one that only arbitrary unpickling could load.
    """
    is_zip = data[:4] == b"PK\x03\x04"  # torch.save's format since torch 1.6
    stream = io.BytesIO(data)
    try:
        if is_zip:
            with zipfile.ZipFile(stream) as archive:
                pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
                if not pickles:
                    return []
                names = list(_pickle_globals(io.BytesIO(archive.read(pickles[0]))))
        else:
            names = list(_pickle_globals(stream))  # the object, or legacy torch's magic number
    except Exception:  # any failure to parse: not a well-formed pickle
        return []
    # The legacy torch format's later pickles (protocol, system info, the object), as far as
    # they are whole: names from a pickle cut short do not count.
    for _ in range(0 if is_zip else 3):
        try:
            names += list(_pickle_globals(stream))
        except Exception:  # the end of the pickles, or a torn one
            break
    return sorted({name for name in names if not _allowed_name(name)})


def load_snapshot(path: str, *, verify: bool = True) -> Any:
    """Load a snapshot safely: verified, then ``torch.load(weights_only=True)``.

    Nothing in the file is executed: a file that needs arbitrary unpickling is refused.
    ``verify=False`` loads a file without a manifest (one written by PPE, for example).
    Besides tensors and plain Python values, numpy arrays and scalars, ``datetime`` values,
    ``pathlib`` paths and ``defaultdict`` s load: building them runs no code from the file.

    Raises:
        SnapshotError: verification failed, or the file is not a snapshot (text, random
            bytes, a torn file, a zip that is not a torch archive).
        UnsafeSnapshotError: the file holds objects only full unpickling could build.
    """
    if verify:
        verify_snapshot(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read the snapshot: {exc}") from exc
    try:
        with _load_scope(), warnings.catch_warnings():
            # A plain pickle (not a torch file) makes torch warn about its protocol; the file
            # is then refused or skipped below, with a message of ours.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # each failure is classified below
        refused = _refused_globals(data)
        if refused:
            raise UnsafeSnapshotError(
                f"refusing to load snapshot {path}: it contains objects ({', '.join(refused)}) "
                "that only arbitrary unpickling can build, which could run code from the "
                "file. Snapshots written by ppe-core never need that. If you wrote and trust "
                "this file, load it yourself with torch.load(path, weights_only=False) and pass "
                "the result to load_state_dict."
            ) from None
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise SnapshotError(
            f"{path}: not a readable snapshot (truncated, or not a file torch.save wrote): "
            f"{type(exc).__name__}: {reason[:200]}"
        ) from exc


#: Leaf types torch's safe loader rebuilds by default.
_PLAIN_TYPES: frozenset[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes, bytearray, torch.Tensor}
    | {torch.nn.Parameter, torch.Size, torch.dtype, torch.device, torch.layout}
)


def _known_loadable(value: Any) -> bool:
    """Whether the safe loader rebuilds ``value`` (a leaf) under :func:`_load_scope`."""
    if not _SCOPED_ALLOWLIST:
        return False
    import datetime
    import pathlib

    if type(value) in (datetime.date, datetime.timedelta, datetime.timezone):
        return True
    if type(value) in (datetime.datetime, datetime.time):
        return value.tzinfo is None or type(value.tzinfo) is datetime.timezone
    if type(value) in (
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.PosixPath,
        pathlib.WindowsPath,
    ):
        return True
    np = _numpy()
    if np is None or not isinstance(value, np.generic):
        return False
    # A numpy scalar's type decides (a log may hold thousands): test-loaded once per type.
    known = _NUMPY_SCALARS.get(type(value))
    if known is None:
        known = _NUMPY_SCALARS[type(value)] = _round_trips(value)
    return known


#: numpy scalar and dtype classes -> whether the safe loader rebuilds them (test-loaded once).
_NUMPY_SCALARS: dict[type, bool] = {}


def _round_trips(value: Any) -> bool:
    """Whether ``value`` alone survives ``torch.save`` and the safe load (for leaves of other
    types, e.g. classes the user allow-listed with ``torch.serialization.add_safe_globals``)."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        buffer.seek(0)
        with _load_scope():
            torch.load(buffer, weights_only=True)
    except Exception:  # refused or unpicklable: either way it cannot round-trip
        return False
    return True


def _loadable_state(state: Any, describe: Callable[[list[Any]], str]) -> Any:
    """``state``, checked to load back through :func:`load_snapshot`, with each
    ``defaultdict`` replaced by a form the safe loader rebuilds (containers on its path are
    copied; the rest is shared).

    Run when a snapshot is taken, so that a value the resume would refuse stops training at
    once, naming where it is, instead of being found at the resume after a crash.

    Raises:
        SnapshotStateError: a value is of a type the safe loader cannot rebuild.
    """

    def refuse(value: Any, path: list[Any]) -> SnapshotStateError:
        kind = type(value)
        hint = (
            f"Save its value ({kind.__name__}.{value.name}.value) and convert it back in "
            "load_state_dict"
            if isinstance(value, enum.Enum)
            else "Save plain values (numbers, strings, lists, dicts, tensors, numpy arrays) and "
            "convert them back in load_state_dict"
        )
        what = f"{kind.__module__}.{kind.__qualname__}"
        if what == "numpy.ndarray":
            what += f" of dtype {value.dtype}"
        return SnapshotStateError(
            f"snapshot not taken: {describe(path)} holds a {what}, which "
            "torch.load(weights_only=True) cannot rebuild without "
            f"running code from the file, so resuming from the snapshot would fail. {hint}, or "
            f"allow-list the class with torch.serialization.add_safe_globals([{kind.__name__}])"
            " in the training script (it must run before the resume too)."
        )

    def keys(path: tuple[Any, ...]) -> list[Any]:
        """``(((), "a"), 0)`` -> ``["a", 0]``: paths are built only for the message."""
        found = []
        while path:
            path, key = path
            found.append(key)
        return found[::-1]

    def walk(value: Any, path: tuple[Any, ...]) -> Any:
        kind = type(value)
        if kind in _PLAIN_TYPES or isinstance(value, torch.Tensor):
            return value
        if kind in (dict, OrderedDict, Counter):
            changed: dict[Any, Any] = {}
            for key, item in value.items():
                if type(key) not in _PLAIN_TYPES:
                    walk(key, (path, key))
                new = walk(item, (path, key))
                if new is not item:
                    changed[key] = new
            if not changed:
                return value
            copied: Any = kind({key: changed.get(key, item) for key, item in value.items()})
            if hasattr(value, "_metadata"):  # a module state_dict's, read by load_state_dict
                copied._metadata = value._metadata
            return copied
        if kind is defaultdict:
            factory = value.default_factory
            if factory is not None and factory not in _FACTORIES and not _round_trips(factory):
                raise refuse(factory, keys((path, "default_factory")))
            if not _SCOPED_ALLOWLIST:
                raise refuse(value, keys(path))
            return _DefaultDictState((factory, walk(dict(value), path)))
        if kind in (list, tuple):
            items = [walk(item, (path, i)) for i, item in enumerate(value)]
            if all(new is old for new, old in zip(items, value, strict=True)):
                return value
            return kind(items)
        if kind is set or (kind is frozenset and _SCOPED_ALLOWLIST):
            for item in value:
                walk(item, (path, "<set item>"))
            return value
        np = _numpy()
        if np is not None and kind is np.ndarray and _SCOPED_ALLOWLIST:
            dtype_class = type(value.dtype)
            if dtype_class not in _NUMPY_SCALARS:  # test-loaded once per dtype class
                _NUMPY_SCALARS[dtype_class] = _round_trips(np.empty(0, dtype=value.dtype))
            if not _NUMPY_SCALARS[dtype_class]:
                raise refuse(value, keys(path))
            if value.dtype.hasobject:
                for i, item in enumerate(value.flat):
                    walk(item, (path, f"<array item {i}>"))
            return value
        if _known_loadable(value) or _round_trips(value):
            return value
        raise refuse(value, keys(path))

    return walk(state, ())


def _describe_path(of_manager: bool, path: list[Any]) -> str:
    """Where ``path`` (keys from the state's root) is, naming the extension in a manager state."""
    keys = "".join(f"[{key!r}]" for key in path) or "its root"
    if of_manager and len(path) >= 2 and path[0] == "extensions":
        rest = path[3:] if path[2:3] == ["extension"] else path[2:]
        where = "".join(f"[{key!r}]" for key in rest) or "its root"
        return f"the state of extension {path[1]!r} (at {where}; in the snapshot: {keys})"
    return f"the snapshot's state (at {keys})"


def _name_iteration(template: str) -> Callable[[str], int | None]:
    """Reads the iteration from a file name (relative to the output directory) made from the
    ``template``, e.g. 30 from ``snapshot_iter_30``; None if the name does not tell."""
    parts = re.split(r"(\{[^{}]*\})", template)
    regex, found = "", False
    for i, part in enumerate(parts):
        if i % 2 == 0:
            regex += re.escape(part.replace("{{", "{").replace("}}", "}"))
        elif not found and re.fullmatch(r"\{\.iteration(?:![rsa])?(?::[^{}]*)?\}", part):
            regex, found = regex + r"(?P<iteration>\d+)", True
        else:
            regex += ".*?"
    pattern = re.compile(regex)

    def iteration(name: str) -> int | None:
        match = pattern.fullmatch(name) if found else None
        return None if match is None else int(match["iteration"])

    return iteration


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
    """A file that may be a snapshot: its path, manifest, iteration and why it cannot be used.

    ``problem`` is set when the file must be skipped whatever its contents (an unreadable
    manifest, a symbolic link out of the output directory); ``iteration`` (from the manifest,
    else the name) orders candidates, never the manifest's clock time, which a wrong clock or
    a copied file makes meaningless; the file's modification time only breaks ties.
    """

    __slots__ = ("iteration", "manifest", "mtime", "path", "problem")

    def __init__(self, path: str, out_dir: str, name_iteration: Callable[[str], int | None]):
        self.path = path
        self.manifest: dict[str, Any] | None = None
        self.problem: str | None = None
        try:
            self.mtime = os.path.getmtime(path)
        except OSError:
            self.mtime = 0.0
        real, real_out = os.path.realpath(path), os.path.realpath(out_dir)
        try:
            inside = os.path.commonpath([real, real_out]) == real_out
        except ValueError:  # another drive
            inside = False
        if not inside:
            # Loading it would resume from a file the run never wrote (another run's, or one
            # planted through the link); it must be copied in to be used.
            self.problem = (
                f"{path} is a symbolic link to {real} (or lies under one), outside the output "
                f"directory {real_out}; copy the file into the directory to resume from it"
            )
        else:
            try:
                self.manifest = _parse_manifest(path)
            except SnapshotError as exc:
                self.problem = str(exc)
        relative = os.path.relpath(path, out_dir)
        self.iteration = (
            self.manifest["iteration"] if self.manifest is not None else name_iteration(relative)
        )


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
        # What a writer's __call__ receives as savefun, as in PPE (None: the writer's default).
        self._given_savefun = savefun
        self._written: list[str] = []  # paths written, for n_retains with a callable filename
        # Files without a manifest that n_retains looked into: path -> ((mtime, size), what
        # _orphan found), so each is loaded once, not at every snapshot.
        self._orphans: dict[str, tuple[tuple[float, int], tuple[int, float, str] | None]] = {}
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
        target = manager if self._target is None else self._target
        state: Any
        if isinstance(target, Mapping):
            state = {key: value.state_dict() for key, value in target.items()}
        else:
            state = target.state_dict() if hasattr(target, "state_dict") else target
        if self._target is None and isinstance(state, dict):
            # The world size, and every rank's resume data when gathered (__call__).
            internal = state.setdefault(PPE_CORE_STATE_KEY, {})
            record_ranks(internal, _world_size(), self._rank_states)
        # Checked when taken, so that "saved fine, refused at resume" cannot happen.
        return _loadable_state(state, functools.partial(_describe_path, self._target is None))

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
        self._setup(manager)
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

    def _setup(self, manager: Any) -> None:
        """Checks, before training, what would otherwise fail only at the first snapshot.

        The filename template is formatted with the manager (a misspelt attribute raises
        here, not after an epoch of training), and a writer of the snapshot's own is
        initialized (creating its directory and removing temporary files that writers
        killed in an earlier run left behind).
        """
        if isinstance(self.filename, str):
            try:
                self.filename.format(manager)
            except (AttributeError, KeyError, IndexError, ValueError) as exc:
                raise ConfigurationError(
                    f"snapshot filename template {self.filename!r} cannot be formatted with "
                    f"the manager ({type(exc).__name__}: {exc}); use fields of the manager "
                    "such as '{.iteration}' or '{.epoch}', e.g. 'snapshot_iter_{.iteration}'"
                ) from None
        if self.writer is not None and self.writer is not getattr(manager, "writer", None):
            self.writer.initialize(manager.out)

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
        """The newest snapshot (by iteration) that verifies, or, without a manifest, that loads.

        Snapshots with a manifest are verified against it; files without one (written by
        PPE, or by a run killed between the two writes, whose data file is complete because
        writers rename it into place) are loaded as they are. A file with an unreadable
        manifest, one that is not a snapshot (text, random bytes, not a dict) and a symbolic
        link out of ``out_dir`` are skipped with a :class:`SnapshotVerificationWarning`,
        falling back to the next newest. A file that only arbitrary unpickling could load
        raises :class:`UnsafeSnapshotError`.
        """
        name_iteration = _name_iteration(self.filename) if isinstance(self.filename, str) else None
        candidates = [
            _Candidate(path, out_dir, name_iteration or (lambda name: None))
            for path in self._files(out_dir)
        ]
        unordered = [c for c in candidates if c.iteration is None and c.problem is None]
        for candidate in unordered:
            # Neither a manifest nor the name tells the iteration: the state does.
            try:
                state = self._load_unverified(candidate.path)
            except UnsafeSnapshotError:
                raise
            except SnapshotError as exc:
                # Not a snapshot (text, random bytes): said now, as it has no place in line.
                warnings.warn(SnapshotVerificationWarning(f"skipping: {exc}"), stacklevel=4)
                candidates.remove(candidate)
                continue
            start = state.get("_start_iteration") if isinstance(state, Mapping) else None
            candidate.iteration = start if _is_int(start) else -1
        candidates.sort(
            key=lambda c: (-1 if c.iteration is None else c.iteration, c.mtime), reverse=True
        )
        for candidate in candidates:
            path = candidate.path
            try:
                if candidate.problem is not None:
                    raise SnapshotError(candidate.problem)
                if candidate.manifest is not None:
                    verify_snapshot(path)
                    state = load_snapshot(path, verify=False)
                else:
                    state = self._load_unverified(path)
                if not isinstance(state, Mapping):
                    raise SnapshotError(
                        f"{path} holds a {type(state).__name__}, not a snapshot's state dict"
                    )
            except UnsafeSnapshotError:
                raise
            except SnapshotError as exc:
                warnings.warn(
                    SnapshotVerificationWarning(f"skipping snapshot: {exc}"), stacklevel=4
                )
                continue
            if candidate.manifest is None:
                _log.info("loaded %s without a manifest (not written by ppe-core)", path)
            return path, state
        return None, None

    @staticmethod
    def _load_unverified(path: str) -> Any:
        try:
            return load_snapshot(path, verify=False)
        except UnsafeSnapshotError:
            raise
        except SnapshotError as exc:
            detail = str(exc).removeprefix(f"{path}: ")
            message = f"{path}: unreadable snapshot without a manifest: {detail}"
            raise SnapshotError(message) from exc

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
        """With ``snapshot_on_error``, saves the state as it is into :data:`ERROR_SNAPSHOT_DIR`.

        The failure may have struck mid-iteration (RNG states advanced by a failed loader
        call, an optimizer step half done), so this snapshot is for inspection or a manual,
        not bit-exact, restart: it goes where autoload and ``n_retains`` never look, and the
        periodic snapshots, from which autoload resumes exactly, stay as they were. No
        barrier: the other ranks may not be failing.
        """
        if self._snapshot_on_error and self._is_saver():
            filename = os.path.join(ERROR_SNAPSHOT_DIR, self._filename(manager))
            self._write(manager, filename, final=True, on_error=True)
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

    def _write(
        self, manager: Any, filename: str, final: bool = False, on_error: bool = False
    ) -> None:
        """Writes the snapshot; ``final``: nothing trains after it (the end, or an error), so
        a background writer's save is done in this thread, from the state itself;
        ``on_error``: an error snapshot (see :meth:`on_error`)."""
        writer = self._writer(manager)
        iteration = int(manager.iteration)
        out_dir, files_dir = manager.out, self._out_dir(manager)
        background = _writes_in_background(writer)
        by_path = self._path_writer(writer, background)
        save: Callable[..., None] = writer.__call__
        if background:
            # A background writer's __call__ would save later, in its worker: the snapshot
            # calls its save() itself, in this thread (final) or in one thread of the snapshot's.
            def save(name: str, directory: str, data: Any, *, savefun: Any) -> None:
                writer.save(name, directory, data, savefun or self._savefun, False)

            # The previous snapshot's files come first (n_retains), and its host buffers are free.
            self._wait_in_flight()
        if not background or final:
            state = self._state(manager)
            self._commit(
                save, filename, out_dir, files_dir, state, iteration, by_path, on_error, writer
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
                self._commit(
                    save, filename, out_dir, files_dir, state, iteration, by_path, writer=writer
                )
            except BaseException as exc:  # reported by the next snapshot or at finalize
                self._background_error = exc

        thread = threading.Thread(target=run, name=f"ppe_core snapshot {filename}", daemon=False)
        self._in_flight = thread
        thread.start()

    def _path_writer(self, writer: Writer, background: bool) -> Writer | None:
        """``writer`` when the snapshot can be ``torch.save``-d straight to its temporary file.

        That is when the serializer is torch.save, the files are local, and the writer saves
        the standard way: ppe-core's background writers (whose :meth:`Writer.save` the
        snapshot's thread calls) or a plain :class:`SimpleWriter`. Otherwise None: the writer
        is called with the state and ``savefun``, as in PPE (see :meth:`_commit`).
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
        on_error: bool = False,
        writer: Any = None,
    ) -> None:
        """Serializes ``state``, writes it and its manifest, and applies ``n_retains``.

        With ``by_path`` (see :meth:`_path_writer`) torch.save writes the temporary file itself;
        otherwise the writer is called as PPE calls it, with the state and the custom
        ``savefun`` (which the standard writers call with the open temporary file, renamed
        into place after; a custom writer may pass it the final path), and the file is read
        back for the manifest's hash. A file the writer did not put at ``files_dir/filename``
        (yet) gets no manifest. An error
        snapshot (``on_error``) is marked so in its manifest and is not a periodic snapshot:
        ``n_retains`` neither counts it nor runs after it.
        """
        # The hash that makes the snapshot verifiable is computed from exactly what is written.
        if by_path is not None:
            size, sha256 = by_path.save_via_path(
                filename, out_dir, lambda tmp: _save_and_hash(state, tmp)
            )
        else:
            save(filename, out_dir, state, savefun=self._given_savefun)
            written = _written_digest(writer, os.path.join(files_dir, filename))
            if written is None:
                return
            size, sha256 = written
        manifest = {
            "format": _FORMAT,
            "version": 1,
            "sha256": sha256,
            "size": size,
            "iteration": iteration,
            "created": time.time(),
        }
        if on_error:
            manifest["on_error"] = True
        manifest_bytes = json.dumps(manifest, indent=1).encode()
        save(manifest_path(filename), out_dir, manifest_bytes, savefun=_write_bytes)
        if on_error:
            return
        path = os.path.join(files_dir, filename)
        if path in self._written:
            self._written.remove(path)
        self._written.append(path)
        if self.n_retains > 0:
            self._remove_old(files_dir, keep=path)

    def _remove_old(self, out_dir: str, keep: str) -> None:
        """Delete all but the newest ``n_retains`` complete snapshots (never an incomplete one).

        Complete snapshots are those with a complete manifest, and ppe-core's own data files
        whose manifest a kill prevented (see :meth:`_orphan`). Other files stay: those with
        a manifest they do not match (a background save may still be writing them) and those
        ppe-core did not write (PPE's snapshots).
        """
        complete = []
        for path in self._files(out_dir):
            try:
                manifest = _complete_manifest(path)
            except SnapshotError:
                orphan = self._orphan(path)
                if orphan is not None:
                    complete.append(orphan)
                continue
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
            self._orphans.pop(path, None)

    def _orphan(self, path: str) -> tuple[int, float, str] | None:
        """``(iteration, mtime, path)`` if ``path`` is a snapshot ppe-core wrote whose manifest
        a kill prevented; None otherwise.

        Writers rename a data file into place complete, so such a file is a whole snapshot.
        It is told from PPE's by ppe-core's resume data (``_ppe_core``, a key PPE never
        writes) inside: finding that costs a load (memory-mapped), done once per file and
        only for files without any manifest. A file with a manifest it does not match is not
        an orphan: it may be being written.
        """
        if any(os.path.exists(m) for m in (manifest_path(path), path + MANIFEST_SUFFIX)):
            return None
        try:
            stat = os.stat(path)
        except OSError:
            return None
        key = (stat.st_mtime, stat.st_size)
        cached = self._orphans.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        found: tuple[int, float, str] | None = None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # unreadable, or not ours: it stays, as PPE's files do
            state = None
        if isinstance(state, dict) and "_ppe_core" in state:
            iteration = state.get("_start_iteration")
            found = (iteration if isinstance(iteration, int) else -1, stat.st_mtime, path)
        del state
        self._orphans[path] = (key, found)
        return found


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
    (without holding the GIL) and the SHA-256 is read back from it. Otherwise the writer is
    called as PPE calls it, ``writer(filename, out_dir, state, savefun=savefun)``: the
    standard writers call ``savefun(state, file)`` with the open temporary file (written
    atomically), a custom writer may pass it the final path; the file is read back for the
    manifest.

    Args:
        savefun: Serializer ``savefun(obj, file)``, given to the writer as in PPE;
            ``torch.save`` by default.
        filename: Name template formatted with the manager, e.g.
            ``"snapshot_iter_{.iteration}"``, or a callable ``filename(manager) -> str``.
        target: Object whose ``state_dict`` is saved, or a dict of such objects (default:
            the manager).
        condition: Skip the snapshot when ``condition()`` is false.
        writer: Writer to save through (default: the manager's); not together with
            ``savefun``, as in PPE.
        snapshot_on_error: Also snapshot when training raises, into the
            :data:`ERROR_SNAPSHOT_DIR` sub-directory: for inspection, never autoloaded (the
            state after a failure is not bit-exactly resumable) and never counted by
            ``n_retains``.
        n_retains: Keep only the newest N complete snapshots (N > 0; otherwise all are kept);
            old files are deleted only after the new one is complete. ppe-core's own data
            files whose manifest a kill prevented count too; PPE's files are never deleted.
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
        ConfigurationError: When training starts: ``filename`` cannot be formatted with the
            manager, or the snapshot's own writer's directory is an existing file.
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
