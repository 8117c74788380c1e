"""The check at start that rank 0 sees every rank's ``SnapshotMode.DCP`` shards it uploads.

A tracker runs its backend on rank 0 only, and uploads the snapshot directories it finds in
rank 0's output directory. A ``SnapshotMode.DCP`` snapshot is written by every rank (each its
shards, into the same directory): when the output directory is not one shared file system
(the local disk of each node of a multi-node job, or an ``out_dir`` of its own per rank),
rank 0's directory holds only its own node's shards, and the upload would be an incomplete
snapshot. Hosts cannot tell that (two nodes may share a file system; one node may be given
per-rank directories), so the ranks look: rank 0 writes a probe file with a random name, every
rank looks for it where it writes its shards, and every rank raises alike when one does not
see it. Two object collectives, once, when the tracker starts; none without a DCP snapshot
the tracker would upload.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import socket
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ppe_core.distributed import device_of, group_world, object_device
from ppe_core.errors import ConfigurationError
from ppe_core.writing import OutputSample

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = ["PROBE_PREFIX", "check_shared_out_dir", "uploaded_dcp_snapshots"]

#: The probe file's name starts with this (a hidden file: no artifact pattern matches it).
PROBE_PREFIX = ".ppe_core_shared_dir_probe."


def uploaded_dcp_snapshots(manager: ManagerView, patterns: Sequence[str]) -> dict[str, str]:
    """``{extension name: directory it writes into}`` of the manager's ``SnapshotMode.DCP``
    snapshots whose directories match one of ``patterns`` (relative to ``manager.out``)."""
    if not patterns:
        return {}
    sample = OutputSample(manager)
    found: dict[str, str] = {}
    for name, entry in getattr(manager, "extensions", ()):
        extension: Any = getattr(entry, "extension", None)
        if getattr(extension, "snapshot_mode", None) != "DCP":
            continue
        for path in extension.output_files(sample):
            relative = os.path.relpath(path, manager.out)
            if any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns):
                found[name] = os.path.dirname(os.path.abspath(path))
    return found


def check_shared_out_dir(
    manager: ManagerView, name: str | None, owner: str, patterns: Sequence[str]
) -> None:
    """Raises on every rank when a DCP snapshot the tracker ``owner`` (registered as
    ``name``) uploads would hold only rank 0's node's shards; every rank of a group of
    several calls it at initialize.

    Raises:
        ConfigurationError: A rank does not see rank 0's probe where it writes its shards,
            or the tracker is not on every rank (the check needs every rank).
    """
    world, rank = group_world()
    if world < 2:
        return
    snapshots = uploaded_dcp_snapshots(manager, patterns)
    if not snapshots:
        return
    names = ", ".join(repr(snapshot) for snapshot in snapshots)
    fix = f"or pass snapshots=False to {owner} (the snapshots stay on the nodes' disks)"
    ranks_lacking = getattr(manager, "ranks_lacking", None)
    lacking = ranks_lacking(name) if callable(ranks_lacking) and name else None
    if lacking != ():
        raise ConfigurationError(
            f"{owner} uploads the SnapshotMode.DCP snapshots of {names}, which every rank "
            "writes its shards into; at start it checks that rank 0, which uploads them, "
            "sees every rank's files, and that check needs the tracker on every rank, but "
            + (
                "it was registered after the manager started"
                if lacking is None
                else f"ranks {list(lacking)} lack it (or have it with other artifacts)"
            )
            + f". Register the same {owner} on every rank (only rank 0 sends), {fix}"
        )
    import torch.distributed as dist

    directory = next(iter(snapshots.values()))
    probe: list[str | None] = [None]
    if rank == 0:
        probe = [_write_probe(directory)]
    device = device_of(manager.raw_models.values())
    with object_device(device):
        dist.broadcast_object_list(probe, src=0)
    probe_name = probe[0]
    seen = probe_name is not None and os.path.exists(os.path.join(directory, probe_name))
    everyone: list[Any] = [None] * world
    with object_device(device):
        dist.all_gather_object(everyone, (seen, socket.gethostname(), directory))
    if rank == 0 and probe_name is not None:
        with contextlib.suppress(OSError):  # gone already: nothing to clean
            os.remove(os.path.join(directory, probe_name))
    blind = [(r, host, path) for r, (ok, host, path) in enumerate(everyone) if not ok]
    if not blind:
        return
    if probe_name is None:
        raise ConfigurationError(
            f"{owner} uploads the SnapshotMode.DCP snapshots of {names}, and rank 0 could not "
            f"write a probe file into {everyone[0][2]} to check that every rank's shards are "
            f"there; make the directory writable, {fix}"
        )
    where = "; ".join(f"rank {r} on host {host} writes into {path}" for r, host, path in blind)
    raise ConfigurationError(
        f"{owner} uploads the SnapshotMode.DCP snapshots of {names} from rank 0, but each "
        "rank writes its own shards into them, and rank 0's directory "
        f"{everyone[0][2]} (host {everyone[0][1]}) is not the one where these ranks write: "
        f"{where} (a probe file rank 0 wrote was not there). The uploads would hold only "
        "rank 0's node's shards. Give every rank the same out_dir on a shared file system, " + fix
    )


def _write_probe(directory: str) -> str | None:
    """Rank 0's probe file in ``directory``, by a random name (None when it cannot be written)."""
    name = PROBE_PREFIX + uuid.uuid4().hex
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, name), "x"):
            pass
    except OSError:
        return None
    return name
