"""The snapshot extension: what and when to save, autoload, saving in the background.

``_Snapshot`` is SnapshotMode.DEFAULT (one rank writes); the other modes subclass it
(``_snapshot_modes``, ``_snapshot_dcp_mode``) and the factories that choose one live in
``_snapshot``. The rank agreement under torch.distributed lives in ``_snapshot_ranks`` (the
base class), the host copy of a background save in ``_snapshot_host_copy``, the manifest and
safe loading in ``_snapshot_manifest``, the files of a series
(autoload's choice, ``n_retains``) in ``_snapshot_retention``, and the writing itself in the
writer (``Writer.submit`` runs a background snapshot in the writer's worker).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import torch

from ppe_core.distributed import group_world
from ppe_core.errors import (
    ShardedStateError,
    SnapshotError,
)
from ppe_core.logging import get_logger
from ppe_core.training import PPE_CORE_STATE_KEY, record_ranks
from ppe_core.training.extension import PRIORITY_SNAPSHOT
from ppe_core.writing import SimpleWriter, Writer
from ppe_extensions._snapshot_checks import check_arguments, check_template
from ppe_extensions._snapshot_host_copy import BufferKey, host_copy
from ppe_extensions._snapshot_manifest import (
    describe_path,
    loadable_state,
    manifest_bytes,
    manifest_path,
    save_and_hash,
    write_bytes,
    written_digest,
)
from ppe_extensions._snapshot_ranks import SnapshotRanks
from ppe_extensions._snapshot_retention import SnapshotSeries
from ppe_extensions._snapshot_sharding import (
    find_sharded,
    saved_objects,
    sharded_error,
)

#: ``snapshot_on_error`` writes into this sub-directory of the output directory, where neither
#: autoload nor ``n_retains`` looks: the state after a failure is not one a run can resume
#: from bit-exactly, so it must never replace or push out a periodic snapshot.
ERROR_SNAPSHOT_DIR = "snapshots_on_error"


class _Snapshot(SnapshotRanks):
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
        check_arguments(target, filename, n_retains, autoload)
        self._target = target
        self.condition = condition
        self.writer = writer
        #: The filename template (or callable) naming each snapshot.
        self.filename = filename
        # The files this snapshot writes: autoload's choice and n_retains.
        self._series = SnapshotSeries()
        self._snapshot_on_error = snapshot_on_error
        self.n_retains = n_retains
        self.autoload = autoload
        self._saver_rank = saver_rank
        # What a writer's __call__ receives as savefun, as in PPE (None: the writer's default,
        # torch.save).
        self._savefun = savefun
        # With a background writer: the outcome of the save in flight (at most one).
        self._in_flight: Future[None] | None = None
        # The large host buffers of the last background snapshot, refilled by the next one.
        self._host_buffers: dict[BufferKey, list[torch.Tensor]] = {}
        #: The path of the snapshot autoload restored, or None.
        self.loaded_from: str | None = None
        # Whether initialize ran (an extension whose trigger finished before the start is
        # neither initialized nor saved at the end).
        self._initialized = False
        # The iteration autoload resumed at (None: it restored nothing).
        self._resumed_at: int | None = None
        # The iteration of this snapshot's last save (or of the one autoload restored), so that
        # the end of training adds one only when the last iteration has none (_save_at_end).
        self._saved_at: int | None = None
        # Set by initialize: whether what this snapshot saves holds sharded (DTensor) state.
        self._sharded = False

    #: Whether the files keep every rank's shards of sharded (DTensor) state; if not, such
    #: state is refused (:meth:`_setup`).
    _holds_shards = False

    def _out_dir(self, manager: Any) -> str:
        writer = self.writer or getattr(manager, "writer", None)
        return str(getattr(writer, "out_dir", None) or manager.out)

    def output_files(self, sample: Any) -> tuple[str, ...]:
        """The snapshot file at ``sample``'s iteration (the manager checks at start that no
        other extension writes it); none for a callable filename or a template that does not
        format (``_setup`` raises for that)."""
        if not isinstance(self.filename, str):
            return ()
        try:
            name = self.filename.format(sample)
        except (AttributeError, KeyError, IndexError, ValueError):
            return ()
        return (os.path.join(self._out_dir(sample), name),)

    def _writer(self, manager: Any) -> Writer:
        writer = self.writer or getattr(manager, "writer", None)
        if writer is None:
            writer = self.writer = SimpleWriter()
        return writer

    def _state(self, manager: Any) -> Any:
        target = manager if self._target is None else self._target
        if isinstance(target, Mapping):
            return self._checked_state({key: value.state_dict() for key, value in target.items()})
        return self._checked_state(target.state_dict() if hasattr(target, "state_dict") else target)

    def _checked_state(self, state: Any) -> Any:
        """Adds ppe-core's resume data to the manager's state, and checks that the state
        loads safely (sharded state refused in a mode that writes one rank's file)."""
        if self._target is None and isinstance(state, dict):
            # The world size, and every rank's resume data when gathered (__call__).
            internal = state.setdefault(PPE_CORE_STATE_KEY, {})
            record_ranks(internal, group_world()[0], self._rank_states)
        # Checked when taken, so that "saved fine, refused at resume" cannot happen; a sharded
        # tensor that the check at start could not see (an extension's, a custom target's) is
        # refused here, before anything is written.
        return loadable_state(
            state,
            functools.partial(describe_path, self._target is None),
            None if self._holds_shards else self._sharded_error,
        )

    def _sharded_error(self, what: str) -> ShardedStateError:
        return sharded_error(
            f"snapshot {self.name!r} (SnapshotMode.{self._mode})", self._saver(), what
        )

    def _restore(self, state: Any, manager: Any) -> None:
        target = manager if self._target is None else self._target
        if isinstance(target, Mapping):
            for key, value in target.items():
                value.load_state_dict(state[key])
        else:
            target.load_state_dict(state)

    def _is_saver(self) -> bool:
        """Whether this process writes: all alone, or ``saver_rank`` (default 0) of a group."""
        world, rank = group_world()
        return world < 2 or rank == self._saver()

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
        self._agree_on_ranks(manager)
        self._initialized = True
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
            raise _autoload_error(path, exc) from exc
        self.loaded_from = path
        name = os.path.relpath(path, out_dir)
        self._resumed_at = self._saved_at = int(manager.iteration)
        if self._target is None:  # the trainer's resume (a snapshot_object's is not the run's)
            _say(f"resumed from {name} ({_when(manager)})")
        return name

    def _setup(self, manager: Any) -> None:
        """Checks, before training, what would otherwise fail only at the first snapshot.

        The filename template is formatted with the manager (a misspelt attribute raises
        here, not after an epoch of training), and a writer of the snapshot's own is
        initialized (creating its directory and removing temporary files that writers
        killed in an earlier run left behind). A mode that writes one rank's state refuses
        sharded models and optimizers here, on every rank, before training or autoload; the
        others note whether a saved model, optimizer or custom target holds sharded tensors.
        """
        refuse = None if self._holds_shards else self._sharded_error
        self._sharded = find_sharded(saved_objects(self._target, manager), refuse)
        check_template(self.filename, manager, self._out_dir(manager))
        if self.writer is not None and self.writer is not getattr(manager, "writer", None):
            self.writer.initialize(manager.out)

    def _newest_valid(self, out_dir: str) -> tuple[str | None, Any]:
        """The newest valid snapshot of this series and its state (see ``SnapshotSeries``)."""
        return self._series.newest_valid(self.filename, out_dir)

    # Saving -----------------------------------------------------------------------------------
    def __call__(self, manager: Any) -> None:
        # Every rank reaches this iteration's trigger alike (agreed at start), so the gather
        # comes before the condition, which only the saver's answer decides.
        with self._rank_states_gathered(manager):
            if self.condition is not None and not self.condition():
                return
            # When training stops after this iteration, run() would wait for a background save
            # at once: saving in this thread spares the host copy of the whole state.
            self._save(manager, final=bool(getattr(manager, "stop_trigger", False)))
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
        self._save_at_end(manager)
        self._host_buffers.clear()  # after the last save (waited for below) nothing reads them
        self._wait_in_flight()
        # A writer given to the snapshot alone is finalized here (flushing background
        # writes); the manager's writer is the manager's to finalize.
        if self.writer is not None and self.writer is not getattr(manager, "writer", None):
            self.writer.finalize()

    def _save_at_end(self, manager: Any) -> None:
        """The trainer's autoloading snapshot: when training ended normally (its stop trigger,
        ``max_epochs``), saves the last iteration if it has no snapshot yet, so that a rerun
        resumes there (and, with the same length, trains nothing) rather than re-training the
        iterations after the last periodic snapshot.

        Only the snapshot that resumes the trainer (``autoload`` without ``target``) does:
        other snapshots (a best model's ``snapshot_object``) keep their own trigger. Under
        torch.distributed every rank stops at the same iteration (the stop is agreed), so each
        takes part in the save's collectives.
        """
        if not (self.autoload and self._initialized) or self._target is not None:
            return
        reason = getattr(manager, "stop_reason", None)
        if reason is None or reason.kind == "error":
            return  # not an end of training (an error, or finalized before it stopped)
        iteration = int(manager.iteration)
        if iteration == self._resumed_at:
            _say(f"training already finished ({_when(manager)}): nothing to do")
            return
        if iteration == 0 or iteration == self._saved_at:
            return
        self(manager)

    def on_interrupt(self, manager: Any) -> str | None:
        """The trainer's autoloading snapshot writes this iteration's snapshot (unless its
        periodic save already did) and returns its file name; other snapshots return None."""
        if not self.autoload or self._target is not None:
            return None
        name = self._filename(manager)
        written = self.output_files(manager)
        if not (written and all(os.path.exists(p) for p in (*written, manifest_path(written[0])))):
            self(manager)
        return name

    def _filename(self, manager: Any) -> str:
        filename = self.filename
        return str(filename(manager)) if callable(filename) else filename.format(manager)

    def _save(self, manager: Any, final: bool = False) -> None:
        self._saved_at = int(manager.iteration)
        if self._is_saver():
            self._write(manager, self._filename(manager), final)

    def _write(
        self, manager: Any, filename: str, final: bool = False, on_error: bool = False
    ) -> None:
        """Writes the snapshot; ``final``: nothing trains after it (the end, or an error), so
        a background writer's save is done in this thread, from the state itself;
        ``on_error``: an error snapshot (see :meth:`on_error`)."""
        writer = self._writer(manager)
        background = writer.in_background
        commit = functools.partial(
            self._commit,
            writer,
            filename,
            manager.out,
            self._out_dir(manager),
            iteration=int(manager.iteration),
            by_path=self._path_writer(writer, background),
            on_error=on_error,
        )
        if background:
            # The previous snapshot's files come first (n_retains), and its host buffers are free.
            self._wait_in_flight()
        if not background or final:
            commit(self._state(manager))
            return
        # Training pauses only to copy the state to host memory; the writer's worker serializes,
        # hashes and writes both files (data file first, then its manifest, so a crash never
        # leaves a manifest without data). Buffers are not reused when a custom savefun, which
        # might keep what it was given, serializes.
        reuse = self._host_buffers if self._savefun in (None, torch.save) else None
        self._in_flight = writer.submit(
            functools.partial(commit, host_copy(self._state(manager), reuse))
        )

    def _path_writer(self, writer: Writer, background: bool) -> Writer | None:
        """``writer`` when the snapshot can be ``torch.save``-d straight to its temporary file.

        That is when the serializer is torch.save, the files are local, and the writer saves
        the standard way: ppe-core's background writers (whose :meth:`Writer.save` the
        snapshot's job calls in their worker) or a plain :class:`SimpleWriter`. Otherwise
        None: the writer is called with the state and ``savefun``, as in PPE (see :meth:`_commit`).
        """
        if self._savefun not in (None, torch.save) or not isinstance(writer, Writer):
            return None
        if not writer.writes_local_files or type(writer).save is not Writer.save:
            return None
        if background or type(writer).__call__ is SimpleWriter.__call__:
            return writer
        return None

    def _wait_in_flight(self, raise_error: bool = True) -> None:
        """Waits for the background save in flight; re-raises its failure (as SnapshotError)."""
        future, self._in_flight = self._in_flight, None
        error = None if future is None else future.exception()
        if error is None:
            return
        self._host_buffers.clear()  # the error's traceback may still reach the last copy
        if raise_error:
            raise SnapshotError(
                f"a background snapshot save failed: {type(error).__name__}: {error}. The "
                "previous complete snapshots are untouched; check the disk and the writer."
            ) from error

    def _commit(
        self,
        writer: Writer,
        filename: str,
        out_dir: str,
        files_dir: str,
        state: Any,
        *,
        iteration: int,
        by_path: Writer | None,
        on_error: bool,
    ) -> None:
        """Serializes ``state``, writes it and its manifest, and applies ``n_retains``.

        With ``by_path`` (see :meth:`_path_writer`) torch.save writes the temporary file itself;
        otherwise the file is saved as PPE saves it, with the state and the custom ``savefun``
        (which the standard writers call with the open temporary file, renamed into place
        after; a custom writer may pass it the final path), and read back for the manifest's
        hash. A background writer saves in the calling thread (its worker, or this thread for
        the final snapshot). A file the writer did not put at ``files_dir/filename`` (yet) gets
        no manifest. An error snapshot (``on_error``) is marked so in its manifest and is not a
        periodic snapshot: ``n_retains`` neither counts it nor runs after it.
        """

        def save(name: str, data: Any, savefun: Any) -> None:
            if writer.in_background:  # its __call__ would save later, in another worker
                writer.save(name, out_dir, data, savefun or torch.save, False)
            else:
                writer(name, out_dir, data, savefun=savefun)

        path = os.path.join(files_dir, filename)
        # The hash that makes the snapshot verifiable is computed from exactly what is written.
        if by_path is not None:
            size, sha256 = by_path.save_via_path(
                filename, out_dir, lambda tmp: save_and_hash(state, tmp)
            )
        else:
            save(filename, state, self._savefun)
            written = written_digest(writer, path)
            if written is None:
                return
            size, sha256 = written
        manifest = manifest_bytes(size, sha256, iteration, on_error)
        save(manifest_path(filename), manifest, write_bytes)
        if not on_error:
            self._series.added(self.filename, files_dir, path, self.n_retains)


def _when(manager: Any) -> str:
    """``epoch E, iteration I`` of the manager now (E with a fraction mid-epoch)."""
    return f"epoch {round(float(manager.epoch_detail), 2):g}, iteration {int(manager.iteration)}"


def _say(message: str) -> None:
    """Tells the user once, on rank 0: on the ``ppe.snapshot`` logger (INFO) and standard error
    (printed unless that logger's record already went there: once on the console)."""
    if group_world()[1] != 0:
        return
    logger = get_logger("snapshot")
    logger.info(message)
    on_console = logger.isEnabledFor(logging.INFO) and any(
        isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
        and handler.stream is sys.stderr
        for handler in logging.getLogger("ppe").handlers
    )
    if not on_console:
        print(message, file=sys.stderr, flush=True)


def _autoload_error(path: str, exc: Exception) -> SnapshotError:
    return SnapshotError(
        f"autoloading snapshot {path} failed: {exc}. Point out_dir elsewhere or remove "
        "the snapshot if it belongs to another model."
    )
