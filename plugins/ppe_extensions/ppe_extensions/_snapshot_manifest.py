"""Snapshot manifests, verification and safe loading: what makes a snapshot file trustworthy.

A snapshot ``F`` is trusted when its manifest ``.F.manifest.json`` (size and SHA-256) matches it,
and it is loaded with ``torch.load(weights_only=True)`` so that nothing in the file runs. The
state is checked when a snapshot is taken, so that every saved snapshot also loads back.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import io
import json
import os
import pickletools
import re
import sys
import time
import warnings
import zipfile
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterator
from typing import IO, Any

import torch

from ppe_core.errors import (
    SnapshotError,
    SnapshotStateError,
    SnapshotVerificationWarning,
    UnsafeSnapshotError,
)
from ppe_core.writing import Writer
from ppe_extensions._snapshot_sharding import dtensor_type

__all__ = [
    "MANIFEST_SUFFIX",
    "SnapshotError",
    "SnapshotStateError",
    "SnapshotVerificationWarning",
    "UnsafeSnapshotError",
    "load_snapshot",
    "manifest_path",
    "read_manifest",
    "verify_snapshot",
    "write_bytes",
]

#: Each snapshot ``dir/F`` has a manifest ``dir/.F.manifest.json`` (see :func:`manifest_path`)
#: recording its size and SHA-256.
MANIFEST_SUFFIX = ".manifest.json"
_FORMAT = "ppe-core-snapshot"


def manifest_path(path: str | os.PathLike[str]) -> str:
    """The manifest of the snapshot at ``path``: a hidden file beside it.

    Hidden so that PPE's autoload, which takes the newest file whose name starts and ends like
    the snapshot filename template, never mistakes a manifest for a snapshot.
    """
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, "." + name + MANIFEST_SUFFIX)


def read_manifest(path: str) -> tuple[str, Any]:
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


def parse_manifest(path: str) -> dict[str, Any] | None:
    """The manifest of the snapshot at ``path``; None only when there is none at all.

    Raises:
        SnapshotError: a manifest exists but is unreadable (bad JSON, truncated, another
            schema, wrong types). That is a failed check, never "no manifest": loading the
            file unchecked would switch verification off for exactly the damaged snapshots.
    """
    where = manifest_path(path)
    try:
        where, manifest = read_manifest(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{path}: unreadable manifest {where}: {exc}") from exc
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise SnapshotError(f"{path}: unreadable manifest {where}: {problem}")
    return dict(manifest)


def manifest_bytes(size: int, sha256: str, iteration: int, on_error: bool) -> bytes:
    """The manifest of a snapshot of ``size`` bytes with this digest, taken at ``iteration``.

    ``on_error`` marks an error snapshot (see ``snapshot_on_error``).
    """
    manifest: dict[str, Any] = {
        "format": _FORMAT,
        "version": 1,
        "sha256": sha256,
        "size": size,
        "iteration": iteration,
        "created": time.time(),
    }
    if on_error:
        manifest["on_error"] = True
    return json.dumps(manifest, indent=1).encode()


def write_bytes(data: bytes, file_obj: IO[bytes] | str | os.PathLike[str]) -> None:
    """Writes the manifest's bytes; a custom writer may pass its savefun a path (as in PPE)."""
    if isinstance(file_obj, (str, os.PathLike)):
        with open(file_obj, "wb") as f:
            f.write(data)
    else:
        file_obj.write(data)


def written_digest(writer: Any, path: str) -> tuple[int, str] | None:
    """``(size, SHA-256)`` of the file a writer (or custom savefun) just wrote at ``path``;
    None when it is not there (yet): a custom writer may write elsewhere or later."""
    fs = getattr(writer, "fs", None)
    try:
        if fs is None or (isinstance(writer, Writer) and writer.writes_local_files):
            return file_digest(path)
        digest = hashlib.sha256()
        size = 0
        with fs.open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        return size, digest.hexdigest()
    except FileNotFoundError:
        return None


def file_digest(path: str) -> tuple[int, str]:
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


def complete_manifest(path: str) -> dict[str, Any]:
    """The manifest of ``path`` if the file is complete (its size matches); no hashing."""
    manifest = parse_manifest(path)
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


def verify_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check ``path`` against its manifest and return the manifest.

    Raises:
        SnapshotError: the manifest is missing or unreadable (bad JSON, truncated, another
            schema), or the file's size or SHA-256 differs from it (a torn, truncated or
            modified file).
    """
    path = os.fspath(path)
    manifest = complete_manifest(path)
    if file_digest(path)[1] != manifest["sha256"]:
        raise SnapshotError(f"{path}: SHA-256 differs from the manifest (corrupt or modified)")
    return manifest


# Safe loading ---------------------------------------------------------------------------------
# torch.load(weights_only=True) rebuilds tensors and plain containers only. The classes below
# are allow-listed for the duration of a snapshot load (never globally): building each runs no
# code from the file (numpy arrays and scalars, dates and times, paths). torch>=2.5 scopes an
# allow-list (torch.serialization.safe_globals); with an older torch none is used, and the save
# refuses such values instead (see loadable_state).
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


def load_snapshot(path: str | os.PathLike[str], *, verify: bool = True) -> Any:
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
    path = os.fspath(path)
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


def loads_as_state(path: str) -> Any:
    """The state in ``path`` if it loads safely as a snapshot state (a mapping), else None.

    For judging a file without a manifest (PPE's, or one whose manifest a kill prevented)
    cheaply: memory-mapped, so a large file costs no copy; a torch file of the old format
    (which cannot be mapped) is read whole. Never raises for the file's contents.
    """
    try:
        with _load_scope(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a zip archive (or not a torch file): the careful path decides
        try:
            state = load_snapshot(path, verify=False)
        except Exception:
            return None
    return state if isinstance(state, dict) else None


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


def loadable_state(
    state: Any,
    describe: Callable[[list[Any]], str],
    sharded: Callable[[str], Exception] | None = None,
) -> Any:
    """``state``, checked to load back through :func:`load_snapshot`, with each
    ``defaultdict`` replaced by a form the safe loader rebuilds (containers on its path are
    copied; the rest is shared).

    Run when a snapshot is taken, so that a value the resume would refuse stops training at
    once, naming where it is, instead of being found at the resume after a crash.

    Args:
        state: The state to save.
        describe: Where a key path (from the state's root) is, for the messages.
        sharded: Given, a DTensor (sharded) in the state is refused with the error it makes
            from where the tensor is (for the modes that write one rank's state).

    Raises:
        SnapshotStateError: a value is of a type the safe loader cannot rebuild.
    """
    dtensor = None if sharded is None else dtensor_type()

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
        if kind in _PLAIN_TYPES:
            return value
        if isinstance(value, torch.Tensor):
            if sharded is not None and dtensor is not None and isinstance(value, dtensor):
                raise sharded(describe(keys(path)))
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


def save_and_hash(state: Any, path: str) -> tuple[int, str]:
    """``torch.save(state, path)``, then ``(size, SHA-256)`` of the file it wrote.

    Given a path, torch.save writes from C++ without holding the GIL, and reading the file back
    in chunks releases it too; serializing into a Python buffer instead holds the GIL for the
    whole copy (tens of ms per 50 MB), stalling the training thread. The writer that called
    this (``save_via_path``) then flushes the file to disk and renames it into place.
    """
    torch.save(state, path)
    return file_digest(path)


def describe_path(of_manager: bool, path: list[Any]) -> str:
    """Where ``path`` (keys from the state's root) is, naming the extension in a manager state."""
    keys = "".join(f"[{key!r}]" for key in path) or "its root"
    if of_manager and len(path) >= 2 and path[0] == "extensions":
        rest = path[3:] if path[2:3] == ["extension"] else path[2:]
        where = "".join(f"[{key!r}]" for key in rest) or "its root"
        return f"the state of extension {path[1]!r} (at {where}; in the snapshot: {keys})"
    return f"the snapshot's state (at {keys})"
