"""PPE's distributed snapshot modes: DISTRIBUTED (the saver writes, every rank waits) and
SHARDED (every rank writes its own part), with the rank checks the modes needing every rank
share. The mode classes subclass ``_snapshot_base._Snapshot``; ``_snapshot.snapshot`` chooses
one.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from ppe_core.distributed import (
    barrier,
    group_world,
    is_distributed,
    object_device,
    require_object_collectives,
)
from ppe_core.errors import (
    ConfigurationError,
    ShardedStateError,
    SnapshotError,
)
from ppe_extensions._snapshot_base import _Snapshot
from ppe_extensions._snapshot_manifest import write_bytes
from ppe_extensions._snapshot_sharding import sharded_paths


def require_process_group(mode: str, more: str = "") -> None:
    if not is_distributed():
        raise SnapshotError(
            f"snapshot_mode=SnapshotMode.{mode} needs torch.distributed to be initialized "
            f"(init_process_group) before the snapshot is created{more}"
        )
    require_object_collectives(f"snapshot_mode=SnapshotMode.{mode}")


class _DistributedSnapshot(_Snapshot):
    """Only ``saver_rank`` writes; every rank then waits at a barrier (PPE's DISTRIBUTED).

    Every rank must have it (checked when the extensions start).
    """

    _mode = "DISTRIBUTED"

    def __init__(self, saver_rank: int = 0, **kwargs: Any) -> None:
        super().__init__(saver_rank=saver_rank, **kwargs)
        require_process_group("DISTRIBUTED")
        size = group_world()[0]
        if not 0 <= saver_rank < size:
            raise ConfigurationError(
                f"saver_rank must be in [0, {size}) for a world of {size} processes, got "
                f"{saver_rank}"
            )

    _needs_every_rank = True

    def __call__(self, manager: Any) -> None:
        super().__call__(manager)
        if self._collective:
            barrier()  # PPE's DISTRIBUTED mode: no rank goes on before the saver wrote


class _EveryRankSnapshot(_Snapshot):
    """A snapshot of which every rank writes its own part, with its own resume data (nothing
    is gathered); every rank must have it (checked when the extensions start)."""

    _holds_shards = True

    def _is_saver(self) -> bool:
        return True  # every rank writes its own shards

    _needs_every_rank = True

    def _gather_rank_states(self, manager: Any) -> list[Any] | None:
        return None  # each rank's part holds its own resume data


class _ShardedSnapshot(_EveryRankSnapshot):
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
        require_process_group("SHARDED")
        self._snapshot_dir = filename
        super().__init__(filename=os.path.join(filename, str(group_world()[1])), **kwargs)
        self._sharded_saver = saver_rank

    def _check_ranks_agree(self, path: str | None, out_dir: str) -> None:
        pass  # _newest_valid compares the ranks' snapshot directories

    def _save(self, manager: Any, final: bool = False) -> None:
        super()._save(manager, final)
        self._wait_in_flight()  # every rank's part is on disk before the directory is complete
        if self._collective:
            barrier()  # kept work: the final snapshot's barrier may be the run's last collective
        if group_world()[1] == self._sharded_saver:
            directory = self._snapshot_dir.format(manager)
            self._writer(manager)(
                os.path.join(directory, "complete"), manager.out, b"", savefun=write_bytes
            )

    def _newest_valid(self, out_dir: str) -> tuple[str | None, Any]:
        path, state = super()._newest_valid(out_dir)
        chosen = None if path is None else os.path.dirname(os.path.relpath(path, out_dir))
        mine = (chosen, self._sharded or bool(sharded_paths(state)))
        everyone: list[Any] = [mine]
        if self._collective:
            everyone = [None] * group_world()[0]
            with object_device(self._device):
                dist.all_gather_object(everyone, mine)
        # Before the ranks' choices are compared: at another world size they differ (a rank
        # beyond the writers' finds no part), and the fix is not to remove anything.
        self._check_same_world(out_dir, everyone)
        if any(other[0] != chosen for other in everyone):
            raise SnapshotError(
                f"the ranks found different newest sharded snapshots "
                f"{[other[0] for other in everyone]} in {out_dir}; remove the incomplete ones"
            )
        return path, state

    def _check_same_world(self, out_dir: str, everyone: list[tuple[str | None, bool]]) -> None:
        """Refuses, on every rank alike, sharded state written by another number of ranks:
        each part holds one rank's shards, which other ranks' shards cannot be loaded from.

        Args:
            out_dir: The output directory.
            everyone: Each rank's ``(snapshot directory found or None, whether it or the
                saved objects hold sharded tensors)``.
        """
        found = sorted({chosen for chosen, _ in everyone if chosen is not None})
        if not found or not any(sharded for _, sharded in everyone):
            return
        directory = os.path.join(out_dir, found[-1])
        parts = sum(name.isdigit() for name in os.listdir(directory))
        world = group_world()[0]
        if parts != world:
            raise ShardedStateError(
                f"the sharded snapshot {directory} was written by {parts} ranks and this run "
                f"has {world}: its parts hold sharded DTensors (FSDP2, tensor parallelism), "
                f"which SnapshotMode.SHARDED resumes at the same world size only. Resume with "
                f"{parts} processes, or use another output directory to train anew; "
                "snapshot_mode=SnapshotMode.DCP snapshots reshard to another world size."
            )
