"""Snapshots: verified, crash-safe checkpoints of the trainer (or any object) with autoload.

PPE's path of ``snapshot``, ``snapshot_object`` and ``SnapshotMode``: the factories choose the
extension class of the mode, ``_snapshot_base._Snapshot`` (DEFAULT), ``_snapshot_modes``'
DISTRIBUTED and SHARDED and ``_snapshot_dcp_mode``'s DCP. The manifest and safe loading live in
``_snapshot_manifest``, the files of a series (autoload's choice, ``n_retains``) in
``_snapshot_retention``.
"""

from __future__ import annotations

import enum
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    ShardedStateError,
    SnapshotError,
    SnapshotRanksError,
    SnapshotRanksWarning,
    SnapshotStateError,
    SnapshotVerificationWarning,
    UnsafeSnapshotError,
)
from ppe_core.writing import Writer
from ppe_extensions._snapshot_base import ERROR_SNAPSHOT_DIR, _Snapshot
from ppe_extensions._snapshot_manifest import (
    MANIFEST_SUFFIX,
    load_snapshot,
    manifest_path,
    verify_snapshot,
)
from ppe_extensions._snapshot_retention import is_series_name, name_iteration

__all__ = [
    "ERROR_SNAPSHOT_DIR",
    "MANIFEST_SUFFIX",
    "ShardedStateError",
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


class SnapshotMode(enum.Enum):
    """How snapshots are taken under ``torch.distributed`` (PPE's ``snapshot_mode``).

    ``DEFAULT``: one process writes (under torch.distributed ``saver_rank``, rank 0 by
    default), with every rank's RNG and loader states gathered into the file when every rank
    has the snapshot; no rank waits for the write. ``DISTRIBUTED``: the same, but the process
    group must exist when the snapshot is created, every rank must have the snapshot, and
    every rank waits at a barrier until the saver wrote (PPE's behaviour). Both refuse sharded
    tensors (DTensors: FSDP2, tensor parallelism) with :class:`ShardedStateError`, as the file
    would hold the saver's shards only. ``SHARDED``: every rank writes its own part under
    ``<filename>/<rank>`` (its shards of an FSDP2 model and optimizer, its RNG and loader
    states), and ``saver_rank`` marks the directory complete; a sharded state resumes at the
    same world size only. ``DCP``: the models and optimizers are saved with
    ``torch.distributed.checkpoint`` (each rank its shards, in the background once staged;
    resharded on load at another world size), the rest per rank, into a directory renamed into
    place when complete, with a manifest hashing every file.
    """

    DEFAULT = enum.auto()
    DISTRIBUTED = enum.auto()
    SHARDED = enum.auto()
    DCP = enum.auto()


def _mode_class(mode: SnapshotMode) -> type[_Snapshot]:
    """The extension class of ``mode``; a mode's module loads only when a snapshot uses it
    (a plain ``snapshot()`` imports neither the distributed modes nor DCP)."""
    if mode is SnapshotMode.DEFAULT:
        return _Snapshot
    if mode is SnapshotMode.DCP:
        from ppe_extensions._snapshot_dcp_mode import _DCPSnapshot

        return _DCPSnapshot
    from ppe_extensions._snapshot_modes import _DistributedSnapshot, _ShardedSnapshot

    return _DistributedSnapshot if mode is SnapshotMode.DISTRIBUTED else _ShardedSnapshot


def snapshot(
    savefun: Callable[..., Any] | None = None,
    filename: str | os.PathLike[str] | Callable[[Any], str] = "snapshot_iter_{.iteration}",
    *,
    target: Any = None,
    condition: Callable[[], bool] | None = None,
    writer: Writer | None = None,
    snapshot_on_error: bool = False,
    n_retains: int = -1,
    autoload: bool = False,
    saver_rank: int | None = None,
    snapshot_mode: SnapshotMode = SnapshotMode.DEFAULT,
    **unexpected: Any,
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
    next (one host copy of the state stays allocated); the file is written by the writer's
    worker (:meth:`Writer.submit`). With the default ``torch.save`` and local files, torch
    writes the file itself (without holding the GIL) and the SHA-256 is read back from it.
    Otherwise the writer is called as PPE calls it,
    ``writer(filename, out_dir, state, savefun=savefun)``: the standard writers call
    ``savefun(state, file)`` with the open temporary file (written atomically), a custom writer
    may pass it the final path; the file is read back for the manifest.

    Args:
        savefun: Serializer ``savefun(obj, file)``, given to the writer as in PPE;
            ``torch.save`` by default.
        filename: Name template formatted with the manager, e.g.
            ``"snapshot_iter_{.iteration}"`` (a ``pathlib.Path`` of it works the same), or a
            callable ``filename(manager) -> str``.
        target: Object whose ``state_dict`` is saved, or a dict of such objects (default:
            the manager).
        condition: Skip the snapshot when ``condition()`` is false.
        writer: Writer to save through (default: the manager's); not together with
            ``savefun``, as in PPE.
        snapshot_on_error: Also snapshot when training raises, into the
            :data:`ERROR_SNAPSHOT_DIR` sub-directory: for inspection, never autoloaded (the
            state after a failure is not bit-exactly resumable) and never counted by
            ``n_retains``.
        n_retains: Keep only the newest N complete snapshots (N > 0; otherwise all are kept)
            of the series: the files whose whole name matches ``filename`` (``{.iteration}``
            a run of digits), so another extension's files and a user's copies stay. Old
            files are deleted only after the new one is complete. Files without a manifest
            (PPE's, or ppe-core's whose manifest a kill prevented) count when they load as
            a snapshot state; one that does not load is never deleted.
        autoload: Resume from the newest valid snapshot when training starts (saying
            ``resumed from <name> (epoch E, iteration I)`` once, on rank 0). A trainer's
            snapshot (no ``target``) with autoload also saves the last iteration when
            training ends normally, if its trigger did not fire there, so a finished run
            started again trains nothing (and says so).
        saver_rank: Under torch.distributed, only this rank writes (``None``: rank 0), with
            every rank's RNG and loader states gathered into the file when every rank has
            the snapshot (otherwise it warns and saves its own); without a process group the
            one process writes. With ``autoload``, every rank restores the same snapshot
            (checked), each with its own RNG and loader states.
        snapshot_mode: How ranks share the work under torch.distributed (:class:`SnapshotMode`).
            ``SnapshotMode.DCP`` saves the trainer's state only (no ``target``, ``condition``,
            ``writer``, ``savefun`` nor ``snapshot_on_error``).

    The trigger (once per epoch by default) is given where the snapshot is registered:
    ``ExtensionEntry(snapshot(...), trigger=...)`` in ``extensions=``, or
    ``manager.extend(snapshot(...), trigger=...)``.

    Raises:
        ArgumentTypeError: Both ``savefun`` and ``writer`` are given (a ``TypeError``, as in
            PPE), an argument has the wrong type, or an unknown keyword (``trigger=``) is
            given.
        ConfigurationError: When training starts: ``filename`` cannot be formatted with the
            manager, has a bare field (``'snap_{}'``, the manager's repr), gives names too
            long for the file system, or the snapshot's own writer's directory is an
            existing file.
    """
    if unexpected:
        raise _unexpected_arguments_error(unexpected)
    if isinstance(filename, os.PathLike):
        # A Path template names the files its str form does (PPE accepts both).
        filename = os.fspath(filename)
    if savefun is not None and writer is not None:
        raise ArgumentTypeError(
            "savefun and writer cannot be given together (as in PPE): pass the writer alone, "
            "or savefun alone to write through the manager's writer"
        )
    if not isinstance(snapshot_mode, SnapshotMode):
        raise ArgumentTypeError(
            f"snapshot_mode must be a SnapshotMode (DEFAULT, DISTRIBUTED, SHARDED or DCP), got "
            f"{snapshot_mode!r}"
        )
    if snapshot_mode is not SnapshotMode.DEFAULT and saver_rank is None:
        raise ConfigurationError(
            f"snapshot_mode=SnapshotMode.{snapshot_mode.name} needs saver_rank= (e.g. 0)"
        )
    return _mode_class(snapshot_mode)(
        target=target,
        condition=condition,
        writer=writer,
        filename=filename,
        snapshot_on_error=snapshot_on_error,
        n_retains=n_retains,
        autoload=autoload,
        savefun=savefun,
        saver_rank=saver_rank,
    )


def snapshot_object(
    target: Any,
    filename: str | os.PathLike[str] | Callable[[Any], str],
    savefun: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> _Snapshot:
    """Snapshot ``target.state_dict()`` (a model, an optimizer, a dict of them) as ``filename``.

    Takes the keyword arguments of :func:`snapshot`; its trigger is given where it is
    registered, as there.
    """
    return snapshot(savefun, filename, target=target, **kwargs)


def _unexpected_arguments_error(unexpected: Mapping[str, Any]) -> ArgumentTypeError:
    """What ``snapshot`` / ``snapshot_object`` raise for keywords they do not take (a
    ``TypeError``, as Python's own): ``trigger=`` gets where a trigger goes instead."""
    if "trigger" in unexpected:
        return ArgumentTypeError(
            "snapshot() and snapshot_object() take no trigger: a snapshot's trigger is given "
            "where it is registered: ExtensionEntry(snapshot_object(...), trigger=trigger) in "
            "extensions=[...] (ppe.training.ExtensionEntry), or "
            "manager.extend(snapshot_object(...), trigger=trigger); e.g. "
            "trigger=ppe.training.triggers.MinValueTrigger('val/loss') keeps the best model"
        )
    takes = [
        p.name for p in inspect.signature(snapshot).parameters.values() if p.kind != p.VAR_KEYWORD
    ]
    return ArgumentTypeError(
        f"snapshot() got unexpected keyword argument(s) {sorted(unexpected)}; it takes "
        f"{', '.join(takes)}"
    )


# PPE's private helpers (some user code calls them), over the one series rule -----------------


def _find_snapshot_files(fmt: str, path: str, fs: Any) -> list[tuple[float, str]]:
    """``(mtime, name)`` of the snapshots of the series ``fmt`` under ``path``, oldest first.

    PPE's helper, with ppe-core's series rule: a name belongs when it matches the whole
    template (see ``_snapshot_retention.series_pattern``), not just its prefix and suffix,
    and files are ordered by the iteration their name tells (then the modification time)
    rather than by the modification time alone. ``fs``: a file system with PPE's
    ``list(path, recursive=True)`` and ``stat(path).last_modified`` (PFIO's); None or one
    without ``list`` (ppe-core's writers' default) reads the local directory.
    """
    listing = getattr(fs, "list", None)
    if callable(listing):
        names = [str(name) for name in listing(path, recursive=True)]
    else:
        names = [
            os.path.relpath(os.path.join(root, name), path)
            for root, _, files in os.walk(path)
            for name in files
        ]
    stat = getattr(fs, "stat", None)

    def mtime(name: str) -> float:
        full = os.path.join(path, name)
        if callable(stat):
            return float(stat(full).last_modified)
        return os.path.getmtime(full)

    found = [(mtime(name), name) for name in names if is_series_name(fmt, name)]

    def order(entry: tuple[float, str]) -> tuple[int, float, str]:
        iteration = name_iteration(fmt, entry[1])
        return (-1 if iteration is None else iteration, entry[0], entry[1])

    return sorted(found, key=order)


def _find_latest_snapshot(fmt: str, path: str, fs: Any) -> str | None:
    """The name of the newest snapshot of the series ``fmt`` under ``path`` (see
    :func:`_find_snapshot_files`), or None; PPE's helper (it neither verifies nor loads)."""
    files = _find_snapshot_files(fmt, path, fs)
    return files[-1][1] if files else None


def _find_stale_snapshots(fmt: str, path: str, n_retains: int, fs: Any) -> Iterator[str]:
    """Yields the names of the series' snapshots under ``path`` older than the newest
    ``n_retains`` (see :func:`_find_snapshot_files`), oldest first; PPE's helper (its
    caller deletes them only when ``n_retains`` > 0)."""
    files = _find_snapshot_files(fmt, path, fs)
    for _, name in files[: max(len(files) - n_retains, 0)]:  # none when fewer than kept
        yield name
