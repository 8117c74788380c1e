"""A snapshot under torch.distributed: the ranks agree on it before they issue collectives.

PPE's snapshots issue no collective of their own. ppe-core's gather every rank's resume data
to the saver (each rank resumes bit-exactly) and check that autoload chose the same snapshot
on every rank; both are collectives, so a snapshot issues them only when every rank has it, as
the managers agreed when the extensions started (``training/_ranks.py``). Otherwise the
DEFAULT mode warns and saves without them, and the modes that need every rank
(``_snapshot_modes``, ``_needs_every_rank``) raise. ``_snapshot_base._Snapshot`` builds on
this class.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from ppe_core.distributed import device_of, group_world, object_device
from ppe_core.errors import SnapshotError, SnapshotRanksError, SnapshotRanksWarning
from ppe_core.training.extension import Extension
from ppe_extensions._snapshot_manifest import read_manifest

__all__ = ["SnapshotRanks"]


class SnapshotRanks(Extension):
    """The rank agreement of a snapshot; the snapshot sets what it saves and how."""

    #: The mode named in :attr:`collectives` (subclasses: DISTRIBUTED, SHARDED).
    _mode = "DEFAULT"
    _target: Any
    autoload: bool
    _saver_rank: int | None
    # Set by initialize: the ranks lacking this snapshot (see ranks_lacking), and whether
    # every rank has it, so that it may issue collectives.
    _lacking: tuple[int, ...] | None = None
    _collective = False
    # Where this rank trains: object collectives put their payload there (NCCL).
    _device: torch.device | None = None
    # Every rank's resume data, gathered for the save in progress (the saver's only).
    _rank_states: list[Any] | None = None

    @property
    def snapshot_mode(self) -> str:
        """The ``SnapshotMode`` member this snapshot takes ("DEFAULT", "DCP", ...): for code
        that treats a mode's output differently (a tracker uploading DCP directories)."""
        return self._mode

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

    def _saver(self) -> int:
        return 0 if self._saver_rank is None else self._saver_rank

    def _agree_on_ranks(self, manager: Any) -> None:
        """At initialize: reads the agreement of the start, and where collectives put data."""
        ranks_lacking = getattr(manager, "ranks_lacking", None)
        self._lacking = ranks_lacking(self.name) if callable(ranks_lacking) and self.name else None
        self._collective = self._agree()
        if self._collective:
            self._device = device_of(getattr(manager, "raw_models", {}).values())

    def _agree(self) -> bool:
        """Whether this snapshot may issue collectives: every rank has it, as agreed at start.

        Otherwise (some ranks lack it) it must not, or the ranks having it would wait forever;
        :meth:`_disagree` then warns (DEFAULT mode) or raises (the modes that need every rank).
        """
        if group_world()[0] < 2 or self.collectives is None:
            return False
        if self._lacking == ():
            return True
        self._disagree(self._lacking)
        return False

    def _ranks_message(self, lacking: tuple[int, ...] | None) -> str:
        world, rank = group_world()
        if lacking is None:
            where = (
                f"was registered after the manager of rank {rank} started, so the "
                f"{world} ranks could not agree on it"
            )
        else:
            having = [r for r in range(world) if r not in lacking]
            where = (
                f"is registered on ranks {having} but not on ranks {list(lacking)} (or there "
                "with another trigger or epoch length)"
            )
        return f"snapshot {self.name!r} (SnapshotMode.{self._mode}) {where}"

    #: Whether the mode needs every rank at each snapshot (it would hang without one), so a
    #: disagreement fails at start instead of warning (``_snapshot_modes``).
    _needs_every_rank = False

    def _disagree(self, lacking: tuple[int, ...] | None) -> None:
        if self._needs_every_rank:
            raise SnapshotRanksError(
                f"{self._ranks_message(lacking)}. This mode needs every rank at each snapshot, "
                "so training would hang at the first one. Register the same snapshot, with the "
                "same trigger, on every rank, or use snapshot_mode=SnapshotMode.DEFAULT, which "
                "needs no other rank."
            )
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

    @contextlib.contextmanager
    def _rank_states_gathered(self, manager: Any) -> Iterator[None]:
        """Every rank's resume data gathered for the save inside (when this snapshot saves the
        manager with collectives), and dropped after it."""
        if self._collective and self._target is None:
            self._rank_states = self._gather_rank_states(manager)
        try:
            yield
        finally:
            self._rank_states = None

    def _gather_rank_states(self, manager: Any) -> list[Any] | None:
        """Every rank's resume data on the saver (None elsewhere): one ``gather_object``."""
        resume_state_dict = getattr(manager, "resume_state_dict", None)
        own = resume_state_dict() if callable(resume_state_dict) else {}
        saver = self._saver()
        world, rank = group_world()
        gathered: list[Any] | None = [None] * world if rank == saver else None
        with object_device(self._device):
            dist.gather_object(own, gathered, dst=saver)
        return gathered

    def _check_ranks_agree(self, path: str | None, out_dir: str) -> None:
        """Under torch.distributed, raise on every rank unless all chose the same snapshot.

        One rank writes the snapshots, so a rank that cannot see its files (another
        ``out_dir``, a node without the shared filesystem) would silently start afresh while
        the others resume: the ranks would train different models.
        """
        world = group_world()[0]
        if world < 2:
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
                digest = read_manifest(path)[1].get("sha256")
            except (OSError, ValueError, AttributeError):
                digest = None
            mine = (os.path.relpath(path, out_dir), digest)
        everyone: list[Any] = [None] * world
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
