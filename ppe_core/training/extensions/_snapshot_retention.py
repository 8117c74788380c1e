"""The files of a snapshot series: finding them, choosing the one to resume from, retiring old ones.

A series is the files one snapshot extension writes into an output directory (named by its
filename template). Autoload takes the newest valid one; ``n_retains`` deletes all but the newest
complete ones, never an incomplete file nor one ppe-core did not write. What makes a file
trustworthy (no link out of the directory, its manifest, ppe-core's own files without one) is
``_snapshot_candidates``'.
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

from ppe_core.errors import SnapshotError, SnapshotVerificationWarning, UnsafeSnapshotError
from ppe_core.training.extensions._snapshot_candidates import Candidate, Orphans, load_unverified
from ppe_core.training.extensions._snapshot_manifest import (
    MANIFEST_SUFFIX,
    _is_int,
    complete_manifest,
    load_snapshot,
    manifest_path,
)

__all__ = ["SnapshotSeries"]

_log = logging.getLogger("ppe_core.snapshot")

#: A snapshot extension's filename: a template formatted with the manager, or a callable.
Filename = str | Callable[[Any], str]


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


def glob_pattern(filename: str) -> str:
    """``"snapshot_iter_{.iteration}"`` -> ``"snapshot_iter_*"`` for finding old snapshots."""
    return re.sub(r"\{[^{}]*\}", "*", glob.escape(filename).replace("[{]", "{").replace("[}]", "}"))


def _read_state_iterations(candidates: list[Candidate]) -> None:
    """Gives each candidate whose iteration neither a manifest nor its name tells the one its
    state starts at (-1 when it holds none), and drops, with a warning, a file that is not a
    snapshot (text, random bytes): said now, as it has no place in line."""
    for candidate in [c for c in candidates if c.iteration is None and c.problem is None]:
        try:
            state = load_unverified(candidate.path)
        except UnsafeSnapshotError:
            raise
        except SnapshotError as exc:
            warnings.warn(SnapshotVerificationWarning(f"skipping: {exc}"), stacklevel=6)
            candidates.remove(candidate)
            continue
        start = state.get("_start_iteration") if isinstance(state, Mapping) else None
        candidate.iteration = start if _is_int(start) else -1


class SnapshotSeries:
    """The files one snapshot extension writes into an output directory.

    Each method takes the extension's ``filename``: its template (a str), or a callable; with
    a callable the series knows only the files it wrote itself (see :meth:`added`).
    """

    def __init__(self) -> None:
        self._written: list[str] = []  # paths written, for a callable filename
        # Files without a manifest that retiring looked into (each loaded once).
        self._orphans = Orphans()

    def files(self, filename: Filename, out_dir: str) -> list[str]:
        """Files in ``out_dir`` matching the filename template (not manifests or temp files)."""
        if not isinstance(filename, str):
            return [path for path in self._written if os.path.exists(path)]
        return [
            path
            for path in glob.glob(os.path.join(out_dir, glob_pattern(filename)))
            if not path.endswith(MANIFEST_SUFFIX)
            and not os.path.basename(path).startswith(".")
            and os.path.isfile(path)
        ]

    def newest_valid(self, filename: Filename, out_dir: str) -> tuple[str | None, Any]:
        """The newest snapshot (by iteration) that verifies, or, without a manifest, that loads.

        Snapshots with a manifest are verified against it; files without one (written by
        PPE, or by a run killed between the two writes, whose data file is complete because
        writers rename it into place) are loaded as they are. A file with an unreadable
        manifest, one that is not a snapshot (text, random bytes, not a dict) and a symbolic
        link out of ``out_dir`` are skipped with a :class:`SnapshotVerificationWarning`,
        falling back to the next newest. A file that only arbitrary unpickling could load
        raises :class:`UnsafeSnapshotError`.
        """
        name_iteration = _name_iteration(filename) if isinstance(filename, str) else lambda _: None
        candidates = [
            Candidate(path, out_dir, name_iteration) for path in self.files(filename, out_dir)
        ]
        _read_state_iterations(candidates)
        candidates.sort(
            key=lambda c: (-1 if c.iteration is None else c.iteration, c.mtime), reverse=True
        )
        for candidate in candidates:
            path = candidate.path
            try:
                if candidate.problem is not None:
                    raise SnapshotError(candidate.problem)
                state = load_unverified(path) if candidate.manifest is None else load_snapshot(path)
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

    def added(self, filename: Filename, out_dir: str, path: str, n_retains: int) -> None:
        """Records the complete periodic snapshot ``path`` in ``out_dir``, then keeps the newest
        ``n_retains`` there.

        Deletes all but the newest ``n_retains`` complete snapshots (N > 0; otherwise all are
        kept), never ``path`` nor an incomplete one. Complete snapshots are those with a
        complete manifest, and ppe-core's own data files whose manifest a kill prevented (see
        :class:`Orphans`). Other files stay: those with a manifest they do not match (a
        background save may still be writing them) and those ppe-core did not write (PPE's).
        """
        if path in self._written:
            self._written.remove(path)
        self._written.append(path)
        if n_retains <= 0:
            return
        complete = []
        for found in self.files(filename, out_dir):
            try:
                manifest = complete_manifest(found)
            except SnapshotError:
                orphan = self._orphans.find(found)
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
            self._orphans.forget(old)
