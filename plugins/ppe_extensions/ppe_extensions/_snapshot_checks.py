"""A snapshot's arguments checked when it is made, and its filename template before training.

PPE takes any target, filename and ``n_retains`` and fails (or names files oddly) only at the
first snapshot, an epoch or more into training; ppe-core raises at once, saying what to pass.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

from ppe_core.errors import ArgumentTypeError, ConfigurationError

__all__ = ["check_arguments", "check_template"]


def check_arguments(
    target: Any, filename: str | Callable[[Any], str], n_retains: object, autoload: bool
) -> None:
    """Raises unless the snapshot's target, filename and ``n_retains`` can work together."""
    if not (callable(filename) or (isinstance(filename, str) and filename)):
        raise ArgumentTypeError(
            "filename must be a non-empty str (or os.PathLike) template (e.g. "
            f"'snapshot_iter_{{.iteration}}') or a callable taking the manager, got {filename!r}"
        )
    if autoload and not isinstance(filename, str):
        raise ConfigurationError(
            "autoload=True needs a str filename template to find earlier snapshots; a "
            "callable filename cannot be matched against the files in out_dir"
        )
    if isinstance(target, Mapping):
        bad = [k for k, v in target.items() if not hasattr(v, "state_dict")]
        if bad:
            raise ArgumentTypeError(
                f"snapshot target values must have state_dict()/load_state_dict(); {bad} do not"
            )
    elif target is not None and not hasattr(target, "state_dict"):
        raise ArgumentTypeError(
            f"snapshot target must have state_dict()/load_state_dict() (a model, an "
            f"optimizer, ...) or be a dict of such objects, got {type(target).__name__}"
        )
    if isinstance(n_retains, bool) or not isinstance(n_retains, int):
        raise ArgumentTypeError(f"n_retains must be an int (-1 keeps all), got {n_retains!r}")


#: A count no run reaches, for the longest name a template gives.
_LARGE_COUNT = 10**12

#: What the writers add to a snapshot's name in the longest name they write for it: its
#: manifest's temporary file, ``.`` + ``.<name>`` + ``.manifest.json`` +
#: ``.<host tag>-<pid>-<random>.tmp`` (8 hex, up to 7 digits, 8 hex).
_NAME_OVERHEAD = 1 + 1 + len(".manifest.json") + len(".00000000-0000000-00000000.tmp")


class _Large:
    """The manager at a large iteration and epoch, for the longest name a template gives;
    ``updater`` (PPE's deprecated alias of the manager) is this object too."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.iteration = self.epoch = _LARGE_COUNT

    @property
    def updater(self) -> _Large:
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_manager" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_manager"], name)


def _name_max(directory: str) -> int:
    """The file system's longest file name (bytes) under ``directory``, or its nearest
    existing parent (the output directory may not exist yet); 255 where it does not tell."""
    directory = os.path.abspath(directory)
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no answer
        return 255


def check_template(filename: str | Callable[[Any], str], manager: Any, out_dir: str) -> None:
    """Formats a str ``filename`` template with the manager, so that what would fail only at
    the first snapshot raises before training: a misspelt field, a bare field (``{}``, the
    manager's repr and address, a new name every run) and a name too long for the file system
    (at a large iteration)."""
    if not isinstance(filename, str):
        return
    bare = [
        f"{{{field}}}"
        for _, field, _, _ in string.Formatter().parse(filename)
        if field is not None and re.fullmatch(r"0?", field)
    ]
    if bare:
        raise ConfigurationError(
            f"snapshot filename template {filename!r} has the field {bare[0]}, which formats "
            "as the manager itself (its repr and memory address: a new name every run, which "
            "autoload and n_retains never find again); name a field of the manager instead, "
            "e.g. 'snapshot_iter_{.iteration}'"
        )
    try:
        filename.format(manager)
        longest = filename.format(_Large(manager))
    except (AttributeError, KeyError, IndexError, ValueError) as exc:
        raise ConfigurationError(
            f"snapshot filename template {filename!r} cannot be formatted with "
            f"the manager ({type(exc).__name__}: {exc}); use fields of the manager "
            "such as '{.iteration}' or '{.epoch}', e.g. 'snapshot_iter_{.iteration}'"
        ) from None
    limit = _name_max(out_dir)
    parts = longest.replace(os.sep, "/").split("/")
    for i, part in enumerate(parts):
        # The last part names the file, beside which the writers put longer-named ones.
        overhead = _NAME_OVERHEAD if i == len(parts) - 1 else 0
        size = len(os.fsencode(part))
        if size + overhead > limit:
            raise ConfigurationError(
                f"snapshot filename template {filename!r} gives a name of {size} bytes at "
                f"iteration {_LARGE_COUNT} ({part[:40]!r}...), and the file system of "
                f"{out_dir!r} allows {limit} bytes a name"
                + (
                    f", {overhead} of them taken by the names of the manifest and temporary "
                    "files the writers put beside it"
                    if overhead
                    else ""
                )
                + f": shorten the template to at most {limit - overhead} bytes a name"
            )
