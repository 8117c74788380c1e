"""Which files of a snapshot series can be trusted, beyond PPE's newest-file choice.

PPE resumes from the newest matching file and counts every matching file for ``n_retains``.
ppe-core refuses a symbolic link out of the output directory, reads each file's manifest
(iteration, completeness), loads a file without one with a message that says so, and
recognises the files without a manifest that load as a snapshot state (PPE's, and its own
whose manifest a kill prevented: complete, since writers rename them into place), so that
``n_retains`` counts them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ppe_core.errors import SnapshotError, UnsafeSnapshotError
from ppe_extensions._snapshot_manifest import (
    MANIFEST_SUFFIX,
    load_snapshot,
    loads_as_state,
    manifest_path,
    parse_manifest,
)

__all__ = ["Candidate", "Orphans", "load_unverified"]


class Candidate:
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
                self.manifest = parse_manifest(path)
            except SnapshotError as exc:
                self.problem = str(exc)
        relative = os.path.relpath(path, out_dir)
        self.iteration = (
            self.manifest["iteration"] if self.manifest is not None else name_iteration(relative)
        )


class Orphans:
    """Files of a series without any manifest that load as a snapshot state, found once per
    file: PPE's snapshots, and ppe-core's whose manifest a kill prevented."""

    def __init__(self) -> None:
        # path -> ((mtime, size), what find() found)
        self._found: dict[str, tuple[tuple[float, int], tuple[int, float, str] | None]] = {}

    def find(self, path: str, name_iteration: int | None) -> tuple[int, float, str] | None:
        """``(iteration, mtime, path)`` if ``path`` has no manifest and loads as a snapshot
        state; None otherwise.

        Writers (PPE's and ppe-core's) rename a data file into place complete, so such a file
        is a whole snapshot, which ``n_retains`` may retire. Its iteration is the one its
        name tells (``name_iteration``), else the one its state starts at (-1 when it holds
        none). Loading it (memory-mapped) is done once per file and only for files without
        any manifest; one that does not load is not a snapshot (a user's notes, a torn file)
        and is never deleted. A file with a manifest it does not match is not counted: it
        may be being written.
        """
        if any(os.path.exists(m) for m in (manifest_path(path), path + MANIFEST_SUFFIX)):
            return None
        if os.path.islink(path):  # a user's link: deleting it is never retention's to do
            return None
        try:
            stat = os.stat(path)
        except OSError:
            return None
        key = (stat.st_mtime, stat.st_size)
        cached = self._found.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        found: tuple[int, float, str] | None = None
        state = loads_as_state(path)
        if state is not None:
            iteration = name_iteration
            if iteration is None:
                start = state.get("_start_iteration")
                iteration = start if isinstance(start, int) else -1
            found = (iteration, stat.st_mtime, path)
        del state
        self._found[path] = (key, found)
        return found

    def forget(self, path: str) -> None:
        """Drops what is known of ``path`` (deleted)."""
        self._found.pop(path, None)


def load_unverified(path: str) -> Any:
    """Loads a file without a manifest; a failure says so in its message."""
    try:
        return load_snapshot(path, verify=False)
    except UnsafeSnapshotError:
        raise
    except SnapshotError as exc:
        detail = str(exc).removeprefix(f"{path}: ")
        message = f"{path}: unreadable snapshot without a manifest: {detail}"
        raise SnapshotError(message) from exc
