"""The files of a snapshot series: finding them, choosing the one to resume from, retiring old ones.

A series is the files one snapshot extension writes into an output directory (named by its
filename template). Autoload takes the newest valid one; ``n_retains`` deletes all but the newest
complete ones, never an incomplete file nor one ppe-core did not write.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ppe_core.errors import SnapshotError, SnapshotVerificationWarning, UnsafeSnapshotError
from ppe_core.training.extensions._snapshot_manifest import (
    MANIFEST_SUFFIX,
    _complete_manifest,
    _is_int,
    _parse_manifest,
    load_snapshot,
    manifest_path,
    verify_snapshot,
)

__all__ = ["SnapshotSeries"]

_log = logging.getLogger("ppe_core.snapshot")


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


class SnapshotSeries:
    """The files one snapshot extension writes into an output directory.

    Args:
        filename: The extension's filename template (a str), or a callable; with a callable
            the series knows only the files it wrote itself (see :meth:`added`).
    """

    def __init__(self, filename: str | Callable[[Any], str]) -> None:
        self.filename = filename
        self._written: list[str] = []  # paths written, for a callable filename
        # Files without a manifest that retiring looked into: path -> ((mtime, size), what
        # _orphan found), so each is loaded once, not at every snapshot.
        self._orphans: dict[str, tuple[tuple[float, int], tuple[int, float, str] | None]] = {}

    def files(self, out_dir: str) -> list[str]:
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

    def newest_valid(self, out_dir: str) -> tuple[str | None, Any]:
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
            for path in self.files(out_dir)
        ]
        for candidate in [c for c in candidates if c.iteration is None and c.problem is None]:
            # Neither a manifest nor the name tells the iteration: the state does.
            try:
                state = _load_unverified(candidate.path)
            except UnsafeSnapshotError:
                raise
            except SnapshotError as exc:
                # Not a snapshot (text, random bytes): said now, as it has no place in line.
                warnings.warn(SnapshotVerificationWarning(f"skipping: {exc}"), stacklevel=5)
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
                    state = _load_unverified(path)
                if not isinstance(state, Mapping):
                    raise SnapshotError(
                        f"{path} holds a {type(state).__name__}, not a snapshot's state dict"
                    )
            except UnsafeSnapshotError:
                raise
            except SnapshotError as exc:
                warnings.warn(
                    SnapshotVerificationWarning(f"skipping snapshot: {exc}"), stacklevel=5
                )
                continue
            if candidate.manifest is None:
                _log.info("loaded %s without a manifest (not written by ppe-core)", path)
            return path, state
        return None, None

    def added(self, out_dir: str, path: str, n_retains: int) -> None:
        """Records the complete periodic snapshot ``path`` in ``out_dir``, then keeps the newest
        ``n_retains`` there.

        Deletes all but the newest ``n_retains`` complete snapshots (N > 0; otherwise all are
        kept), never ``path`` nor an incomplete one. Complete snapshots are those with a
        complete manifest, and ppe-core's own data files whose manifest a kill prevented (see
        :meth:`_orphan`). Other files stay: those with a manifest they do not match (a
        background save may still be writing them) and those ppe-core did not write (PPE's).
        """
        if path in self._written:
            self._written.remove(path)
        self._written.append(path)
        if n_retains <= 0:
            return
        complete = []
        for found in self.files(out_dir):
            try:
                manifest = _complete_manifest(found)
            except SnapshotError:
                orphan = self._orphan(found)
                if orphan is not None:
                    complete.append(orphan)
                continue
            complete.append((int(manifest.get("iteration", -1)), float(manifest["created"]), found))
        complete.sort(reverse=True)
        for _, _, old in complete[n_retains:]:
            if os.path.abspath(old) == os.path.abspath(path):
                continue
            for victim in (old, manifest_path(old), old + MANIFEST_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(victim)
            with contextlib.suppress(ValueError):
                self._written.remove(old)
            self._orphans.pop(old, None)

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


def _load_unverified(path: str) -> Any:
    """Loads a file without a manifest; a failure says so in its message."""
    try:
        return load_snapshot(path, verify=False)
    except UnsafeSnapshotError:
        raise
    except SnapshotError as exc:
        detail = str(exc).removeprefix(f"{path}: ")
        message = f"{path}: unreadable snapshot without a manifest: {detail}"
        raise SnapshotError(message) from exc
