"""The files of a snapshot series: finding them, choosing the one to resume from, retiring old ones.

A series is the files one snapshot extension writes into an output directory: those whose
whole name matches its filename template (:func:`series_pattern`, also used for DCP's
directories), so that another extension's series and a user's copies are never touched.
Autoload takes the newest valid one; ``n_retains`` deletes all but the newest complete ones,
never an incomplete file nor one that does not load as a snapshot. What makes a file
trustworthy (no link out of the directory, its manifest, files without one that load) is
``_snapshot_candidates``'.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import re
import string
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ppe_core.errors import SnapshotError, SnapshotVerificationWarning, UnsafeSnapshotError
from ppe_extensions._snapshot_candidates import Candidate, Orphans, load_unverified
from ppe_extensions._snapshot_manifest import (
    MANIFEST_SUFFIX,
    _is_int,
    complete_manifest,
    load_snapshot,
    manifest_path,
)

__all__ = [
    "SnapshotSeries",
    "glob_pattern",
    "in_series",
    "is_series_name",
    "name_iteration",
    "series_paths",
    "series_pattern",
]

_log = logging.getLogger("ppe_core.snapshot")

#: A snapshot extension's filename: a template formatted with the manager, or a callable.
Filename = str | Callable[[Any], str]


#: Manager fields whose value is a count: in a name they are a run of digits.
_ITERATION_FIELDS = frozenset({".iteration", "0.iteration", ".updater.iteration"})
_EPOCH_FIELDS = frozenset({".epoch", "0.epoch", ".updater.epoch"})


def _field(name: str) -> str:
    """``'0.updater.iteration'`` -> ``'.updater.iteration'`` (``{0...}`` is the manager too)."""
    return name[1:] if name.startswith("0.") else name


@functools.lru_cache(maxsize=64)
def series_pattern(template: str) -> re.Pattern[str]:
    """The names (relative to the output directory, ``/``-separated) of the series of the
    filename ``template``: the whole name must match it.

    ``{.iteration}`` and ``{.epoch}`` (also as ``{0.iteration}`` or ``{.updater.iteration}``,
    with any conversion or format spec) match a run of digits, captured as the ``iteration``
    and ``epoch`` groups (their first occurrence); any other field matches characters other
    than ``/``. So ``snapshot_iter_{.iteration}`` matches ``snapshot_iter_30`` but neither
    ``snapshot_iter_30_model.pt`` (another extension's series) nor ``snapshot_iter_30_good``
    (a user's copy). Stricter than PPE's prefix-and-suffix match, on purpose: retention and
    autoload must never touch what another series or a user put beside the snapshots.
    """
    regex, groups = "", set()
    for literal, field, _, _ in string.Formatter().parse(template):
        regex += re.escape(literal)
        if field is None:
            continue
        name = _field(field)
        group = (
            "iteration" if name in _ITERATION_FIELDS else "epoch" if name in _EPOCH_FIELDS else None
        )
        if group is None:
            regex += "[^/]*"
        elif group in groups:
            regex += r"\d+"
        else:
            regex += rf"(?P<{group}>\d+)"
            groups.add(group)
    return re.compile(regex)


def is_series_name(template: str, name: str) -> bool:
    """Whether ``name`` (relative to the output directory) is a member of the ``template``'s
    series (see :func:`series_pattern`); manifests and hidden (temporary) names never are."""
    name = name.replace(os.sep, "/")
    return (
        series_pattern(template).fullmatch(name) is not None
        and not name.endswith(MANIFEST_SUFFIX)
        and not name.rpartition("/")[2].startswith(".")
    )


def in_series(template: str, out_dir: str, path: str) -> bool:
    """Whether ``path`` under ``out_dir`` is a member of the ``template``'s series."""
    return is_series_name(template, os.path.relpath(path, out_dir))


def series_paths(out_dir: str, template: str) -> list[str]:
    """The paths in ``out_dir`` (files or directories) of the ``template``'s series."""
    candidates = glob.glob(os.path.join(glob.escape(out_dir), glob_pattern(template)))
    return sorted(path for path in candidates if in_series(template, out_dir, path))


def name_iteration(template: str, name: str) -> int | None:
    """The iteration a series' file name (relative to the output directory) tells, e.g. 30
    from ``snapshot_iter_30``; None if the template has no ``{.iteration}`` field."""
    match = series_pattern(template).fullmatch(name.replace(os.sep, "/"))
    if match is None or "iteration" not in match.groupdict():
        return None
    return int(match["iteration"])


def _named_iteration(filename: Filename, name: str) -> int | None:
    return name_iteration(filename, name) if isinstance(filename, str) else None


def glob_pattern(filename: str) -> str:
    """``"snapshot_iter_{.iteration}"`` -> ``"snapshot_iter_*"``: a superset of the series'
    names (filter them with :func:`in_series`)."""
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
        """The series' files in ``out_dir``: those whose whole name (relative to ``out_dir``)
        matches the filename template (see :func:`series_pattern`); with a callable filename,
        the files this run wrote."""
        if not isinstance(filename, str):
            return [path for path in self._written if os.path.exists(path)]
        return [path for path in series_paths(out_dir, filename) if os.path.isfile(path)]

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
        candidates = [
            Candidate(path, out_dir, functools.partial(_named_iteration, filename))
            for path in self.files(filename, out_dir)
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
        kept), never ``path`` nor an incomplete one, ordered by iteration (the manifest's, else
        the name's, else the state's). Complete snapshots are those with a complete manifest,
        and files without any manifest that load as a snapshot state (PPE's, and ppe-core's
        whose manifest a kill prevented; see :class:`Orphans`). Other files stay: those with
        a manifest they do not match (a background save may still be writing them) and those
        that do not load. Only the series' files are considered (see :meth:`files`).
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
                relative = os.path.relpath(found, out_dir)
                orphan = self._orphans.find(found, _named_iteration(filename, relative))
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
