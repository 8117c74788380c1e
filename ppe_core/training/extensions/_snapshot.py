"""Snapshots: verified, crash-safe checkpoints of the trainer (or any object) with autoload.

PPE's path of ``snapshot``, ``snapshot_object`` and ``SnapshotMode``: the factories choose the
extension class of the mode, ``_snapshot_base._Snapshot`` (DEFAULT), ``_snapshot_modes``'
DISTRIBUTED and SHARDED and ``_snapshot_dcp_mode``'s DCP. The manifest and safe loading live in
``_snapshot_manifest``, the files of a series (autoload's choice, ``n_retains``) in
``_snapshot_retention``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
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
from ppe_core.training.extensions._snapshot_base import ERROR_SNAPSHOT_DIR, _Snapshot
from ppe_core.training.extensions._snapshot_dcp_mode import _DCPSnapshot
from ppe_core.training.extensions._snapshot_manifest import (
    MANIFEST_SUFFIX,
    load_snapshot,
    manifest_path,
    verify_snapshot,
)
from ppe_core.training.extensions._snapshot_modes import _DistributedSnapshot, _ShardedSnapshot
from ppe_core.writing import Writer

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


_MODE_CLASSES: dict[SnapshotMode, type[_Snapshot]] = {
    SnapshotMode.DEFAULT: _Snapshot,
    SnapshotMode.DISTRIBUTED: _DistributedSnapshot,
    SnapshotMode.SHARDED: _ShardedSnapshot,
    SnapshotMode.DCP: _DCPSnapshot,
}


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
            ``SnapshotMode.DCP`` saves the trainer's state only (no ``target``, ``condition``,
            ``writer``, ``savefun`` nor ``snapshot_on_error``).

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
    if not isinstance(snapshot_mode, SnapshotMode):
        raise ArgumentTypeError(
            f"snapshot_mode must be a SnapshotMode (DEFAULT, DISTRIBUTED, SHARDED or DCP), got "
            f"{snapshot_mode!r}"
        )
    if snapshot_mode is not SnapshotMode.DEFAULT and saver_rank is None:
        raise ConfigurationError(
            f"snapshot_mode=SnapshotMode.{snapshot_mode.name} needs saver_rank= (e.g. 0)"
        )
    return _MODE_CLASSES[snapshot_mode](
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
    filename: str | Callable[[Any], str],
    savefun: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> _Snapshot:
    """Snapshot ``target.state_dict()`` (a model, an optimizer, a dict of them) as ``filename``.

    Takes the keyword arguments of :func:`snapshot`.
    """
    return snapshot(savefun, filename, target=target, **kwargs)
