"""SnapshotMode.DCP's extension: every rank saves its shards with
``torch.distributed.checkpoint``, asynchronously; the files of a DCP snapshot (staging,
manifest, publishing, retention) are ``_snapshot_dcp``'s.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist

from ppe_core.distributed import group_world, object_device
from ppe_core.errors import (
    ConfigurationError,
    DiskFullError,
    SnapshotError,
    WorldSizeMismatchWarning,
)
from ppe_core.reporting import report
from ppe_extensions._snapshot_dcp import (
    check_fits,
    disk_full,
    newest_valid,
    publish,
    remove_leftovers,
    rest_file,
    restore_tensor_state,
    retain,
    stage_storageless,
    temporary_dir,
    tensor_owners,
    tensor_state,
    verify_world,
    write_manifest,
    writer_tag,
)
from ppe_extensions._snapshot_manifest import load_snapshot
from ppe_extensions._snapshot_modes import (
    _EveryRankSnapshot,
    require_process_group,
)

_log = logging.getLogger("ppe_core.snapshot")


def _refuse_for_dcp(filename: Any, kwargs: Mapping[str, Any]) -> None:
    """Raises, when the DCP snapshot is created, for what SnapshotMode.DCP cannot do."""
    fixes = {
        "writer": "DCP writes its files itself, in the background: remove writer= (the "
        "files go to the trainer's out_dir), or use snapshot_mode=SnapshotMode.SHARDED to "
        "write through a ppe-core writer",
        "savefun": "DCP serializes the tensors itself: remove savefun=, or use "
        "snapshot_mode=SnapshotMode.SHARDED to serialize with your own function",
        "snapshot_on_error": "a DCP save is a collective of every rank, which the ranks not "
        "failing never reach (it would hang): remove snapshot_on_error=True, and for error "
        "snapshots add snapshot(condition=lambda: False, snapshot_on_error=True, "
        "saver_rank=0, snapshot_mode=SnapshotMode.SHARDED) (each rank writes its own part)",
    }
    for key, fix in fixes.items():
        if kwargs.get(key) not in (None, False):
            raise ConfigurationError(f"snapshot_mode=SnapshotMode.DCP does not take {key}: {fix}")
    if not isinstance(filename, str):
        raise ConfigurationError(
            "snapshot_mode=SnapshotMode.DCP names its directories with a str template (e.g. "
            f"'snapshot_iter_{{.iteration}}'), got {filename!r}: autoload and n_retains find "
            "the snapshots by it"
        )
    target = kwargs.get("target")
    values = target.items() if isinstance(target, Mapping) else [("target", target)]
    others = [
        f"{key} ({type(value).__name__})"
        for key, value in values
        if value is not None and not isinstance(value, (torch.nn.Module, torch.optim.Optimizer))
    ]
    if others:
        raise ConfigurationError(
            "snapshot_mode=SnapshotMode.DCP saves modules and optimizers (a target that is "
            f"one, or a dict of them); {', '.join(others)} is neither: save it with "
            "snapshot_mode=SnapshotMode.SHARDED, or give its tensors to a module"
        )


class _DCPSnapshot(_EveryRankSnapshot):
    """Every rank saves its shards with ``torch.distributed.checkpoint``, asynchronously.

    Training is blocked while the state is taken, then goes on while DCP's stager copies the
    tensors in the background and DCP's thread plans (with collectives on a gloo group of its
    own) and writes the save; the next optimizer step
    waits for that copy (a step pre-hook), and a background thread writes the files. The
    saver hashes every file into the manifest and renames the directory into place once every
    rank's files are written (DCP's coordinator writes its metadata after gathering every
    rank's results). Each snapshot's blocked time is reported as ``<name>/blocked_time`` (the
    part in the snapshot's own iteration) and logged in full, and kept in
    :attr:`blocked_times`. With ``target`` (modules and optimizers) it saves those alone; a
    ``condition`` is asked on every rank and the saver's answer decides for all.
    """

    _mode = "DCP"

    def __init__(
        self,
        filename: str = "snapshot_iter_{.iteration}",
        saver_rank: int = 0,
        **kwargs: Any,
    ) -> None:
        require_process_group("DCP", " (torchrun with one process is enough)")
        _refuse_for_dcp(filename, kwargs)
        super().__init__(filename=filename, saver_rank=saver_rank, **kwargs)
        #: Per snapshot: ``(iteration, seconds training was blocked)``, the staging wait
        #: included once it is known.
        self.blocked_times: list[tuple[int, float]] = []
        self._stager: Any = None
        self._group: Any = None
        self._staging: Future[Any] | None = None
        self._step_hooks: list[Any] = []
        # The saver's writer_tag(), naming the temporary directories (sent once, at the first
        # save: every rank writes into the saver's).
        self._saver_tag: str | None = None

    def _check_ranks_agree(self, path: str | None, out_dir: str) -> None:
        pass  # the saver chose for every rank (_newest_valid)

    def _newest_valid(self, out_dir: str) -> tuple[str | None, Any]:
        """The saver's choice, sent to every rank: it verifies the newest snapshots (skipping
        damaged ones with a warning)."""
        template = str(self.filename)
        chosen: list[str | None] = [None]
        if group_world()[1] == self._saver():
            chosen = [newest_valid(out_dir, template)]
        if self._collective:
            with object_device(self._device):
                dist.broadcast_object_list(chosen, src=self._saver())
        return chosen[0], chosen[0]

    def _objects(
        self, manager: Any
    ) -> tuple[Mapping[str, torch.nn.Module], Mapping[str, torch.optim.Optimizer]]:
        """The models and optimizers saved: the trainer's, or the ``target``'s."""
        if self._target is None:
            return manager.raw_models, manager.optimizers
        target = self._target if isinstance(self._target, Mapping) else {"target": self._target}
        return (
            {k: v for k, v in target.items() if isinstance(v, torch.nn.Module)},
            {k: v for k, v in target.items() if isinstance(v, torch.optim.Optimizer)},
        )

    def _setup(self, manager: Any) -> None:
        """Also, on the saver, removes the temporary directories of saves whose saver died
        (with autoload or not, as the writers remove their temporary files at start)."""
        super()._setup(manager)
        tensor_owners(*self._objects(manager))  # each optimizer's model: refused before training
        if group_world()[1] == self._saver():
            remove_leftovers(self._out_dir(manager), str(self.filename))

    def __call__(self, manager: Any) -> None:
        condition = self.condition
        if condition is not None:
            # DCP's save is a collective: every rank must take it or none, as the saver says.
            decided = [bool(condition())]
            if self._collective:
                with object_device(self._device):
                    dist.broadcast_object_list(decided, src=self._saver())
            if not decided[0]:
                return
        self._save(manager, final=bool(getattr(manager, "stop_trigger", False)))

    def _restore(self, state: Any, manager: Any) -> None:
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict_loader import load

        path = str(state)
        models, optimizers = self._objects(manager)
        tensors = tensor_state(models, optimizers)
        check_fits(path, tensors)  # another architecture: named, before DCP's own error
        try:
            load(tensors, checkpoint_id=path)  # resharded to this run's shards
        except CheckpointException as exc:  # a BaseException: named and made an Exception
            causes = "; ".join(f"rank {r}: {f[0]}" for r, f in sorted(exc.failures.items()))
            raise SnapshotError(
                f"the DCP snapshot {path} does not load into this run's models and "
                f"optimizers: {causes}"
            ) from exc
        restore_tensor_state(models, optimizers, tensors)
        if self._target is not None:
            return  # the target's tensors are the whole snapshot
        own = rest_file(path, group_world()[1])
        saved_world = int(verify_world(path))
        with warnings.catch_warnings():
            # Its generic message is the one of the modes that do not reshard: told below.
            warnings.simplefilter("ignore", WorldSizeMismatchWarning)
            # Another world size: every rank takes the saver's.
            rest = load_snapshot(
                own if os.path.exists(own) else rest_file(path, self._saver()),
                verify=False,  # the directory's manifest was verified
            )
            current = manager.state_dict()
            manager.load_state_dict(
                {**rest, "models": current["models"], "optimizers": current["optimizers"]}
            )
        world = group_world()[0]
        if saved_world != world:
            warnings.warn(
                WorldSizeMismatchWarning(
                    f"the DCP snapshot {path} was saved by a run of {saved_world} process(es) "
                    f"and this run has {world}. SnapshotMode.DCP resharded the models and "
                    "optimizers: the weights, the optimizer states and the iteration counts "
                    "resume exactly (equal to the saved full state). Not exactly: each rank's "
                    "RNG states and loader position (every rank restores the saving rank's), "
                    f"and the data is split differently over {world} process(es), so this is "
                    "not the run the saved one would have continued; resume with "
                    f"{saved_world} process(es) to continue it bit-exactly."
                ),
                stacklevel=2,
            )

    def _save(self, manager: Any, final: bool = False) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import async_save

        self._saved_at = int(manager.iteration)
        self._wait_staged()
        self._wait_in_flight()  # the previous snapshot is complete (its rename, n_retains)
        started = time.perf_counter()
        world, rank = group_world()
        path = os.path.join(self._out_dir(manager), self._filename(manager))
        temporary = temporary_dir(path, self._writer_tag())
        saver = rank == self._saver()
        os.makedirs(temporary, exist_ok=True)
        if self._target is None:
            rest = self._state(manager)
            del rest["models"], rest["optimizers"]
            try:
                torch.save(rest, rest_file(temporary, rank))
            except Exception as exc:
                error = self._failed(exc, path, temporary if saver else None)
                if error is exc:
                    raise
                raise error from exc
        tensors = stage_storageless(tensor_state(*self._objects(manager)))
        if self._stager is None:
            accelerated = torch.accelerator.is_available()
            with warnings.catch_warnings():
                # DCP pins staging memory only for some accelerators and warns for the others
                # (an emulated or third-party device): it then stages unpinned, which is right.
                warnings.filterwarnings("ignore", "Ignoring pin_memory flag", UserWarning)
                self._stager = DefaultStager(
                    StagingOptions(
                        use_pinned_memory=accelerated,
                        use_shared_memory=False,
                        use_async_staging=True,
                        use_non_blocking_copy=accelerated,
                    )
                )
        if self._group is None:
            # DCP's thread plans and finishes the save with collectives: on the default group
            # they would interleave with training's (FSDP's) and hang.
            self._group = dist.new_group(backend="gloo")
        response: Any = async_save(
            tensors, checkpoint_id=temporary, async_stager=self._stager, process_group=self._group
        )
        self._staging = response.staging_completion
        self._step_hooks = [
            optimizer.register_step_pre_hook(self._step_pre_hook)
            for optimizer in self._objects(manager)[1].values()
        ]
        iteration = int(manager.iteration)
        blocked = time.perf_counter() - started
        self.blocked_times.append((iteration, blocked))
        report({f"{self.name}/blocked_time": blocked})
        upload: Future[Any] = response.upload_completion
        done: Future[None] = Future()

        def finish(_: Future[Any]) -> None:  # in DCP's writing thread
            try:
                upload.result()
                if saver:
                    write_manifest(temporary, iteration, world)
                    publish(temporary, path)
                    retain(os.path.dirname(path), str(self.filename), self.n_retains)
            except BaseException as exc:
                # DCP gathers every rank's outcome first: no rank writes into it any more.
                done.set_exception(self._failed(exc, path, temporary if saver else None))
            else:
                done.set_result(None)

        upload.add_done_callback(finish)
        self._in_flight = done
        if final:
            self._wait_staged()
            self._wait_in_flight()

    def _writer_tag(self) -> str:
        """The saver's :func:`writer_tag`, sent to every rank at the first save."""
        if self._saver_tag is None:
            tag = [writer_tag()]
            if self._collective:
                with object_device(self._device):
                    dist.broadcast_object_list(tag, src=self._saver())
            self._saver_tag = str(tag[0])
        return self._saver_tag

    @staticmethod
    def _failed(exc: BaseException, path: str, temporary: str | None) -> BaseException:
        """What a failed save of the snapshot ``path`` raises: a :class:`DiskFullError`
        naming it when the disk is full, ``exc`` otherwise; the saver (given ``temporary``)
        removes the unfinished directory (after the diagnosis, which needs its files)."""
        full = disk_full(exc, path)
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        if full is None:
            return exc
        full.__cause__ = exc
        return full

    def _wait_in_flight(self, raise_error: bool = True) -> None:
        # A full disk is raised as itself: it names the snapshot and the fix already.
        error = None if self._in_flight is None else self._in_flight.exception()
        if raise_error and isinstance(error, DiskFullError):
            self._in_flight = None
            raise error
        super()._wait_in_flight(raise_error)

    def _step_pre_hook(self, *_: Any) -> None:
        # The hooks stay registered until the next save or the end: removing one while the
        # optimizer iterates over its hooks breaks that iteration when a hook follows it.
        if self._staging is not None:
            self._wait_staged(remove_hooks=False)

    def _wait_staged(self, remove_hooks: bool = True) -> None:
        """Waits until the stager copied the last snapshot's tensors (before they change)."""
        staging, self._staging = self._staging, None
        if remove_hooks:
            for hook in self._step_hooks:
                hook.remove()
            self._step_hooks = []
        if staging is None:
            return
        started = time.perf_counter()
        staging.result()
        iteration, blocked = self.blocked_times[-1]
        self.blocked_times[-1] = (iteration, blocked + time.perf_counter() - started)
        _log.info(
            "snapshot %r of iteration %d: training was blocked %.4f s (%.4f s taking the state "
            "and planning, %.4f s waiting for staging)",
            self.name,
            iteration,
            self.blocked_times[-1][1],
            blocked,
            self.blocked_times[-1][1] - blocked,
        )

    def on_error(self, manager: Any, exc: BaseException, tb: Any) -> None:
        self._wait_staged()
        super().on_error(manager, exc, tb)

    def finalize(self, manager: Any) -> None:
        self._wait_staged()
        try:
            super().finalize(manager)
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            if self._group is not None:
                dist.destroy_process_group(self._group)
                self._group = None
