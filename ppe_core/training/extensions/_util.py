"""Helpers shared by the extensions: terminals, observation keys, writing files, extras.

Rank checks and gathers are ``ppe_core.distributed``'s (``require_group``, ``gather_objects``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any, Protocol

from ppe_core.errors import ArgumentTypeError, OptionalDependencyError

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView
    from ppe_core.writing import SaveFun

__all__ = [
    "OptionalDependencyError",
    "WriterLike",
    "in_notebook",
    "is_terminal",
    "key_tuple",
    "missing_extra_error",
    "write_file",
]


def is_terminal(out: IO[Any]) -> bool:
    """Whether ``out`` is an interactive terminal (so cursor control is allowed)."""
    isatty = getattr(out, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where tqdm's notebook widget works).

    Only looks at already imported modules, so it never imports IPython itself.
    """
    return "ipykernel.zmqshell" in sys.modules


def key_tuple(keys: object, owner: str, argument: str) -> tuple[str, ...]:
    """``keys`` as a tuple of observation keys, rejecting a bare string.

    A string is iterable, so ``LogReport(keys="loss")`` would otherwise track the keys
    ``"l"``, ``"o"``, ``"s"`` and never report anything.

    Raises:
        ArgumentTypeError: ``keys`` is a string, not iterable, or holds a non-string.
    """
    if isinstance(keys, str):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got the string {keys!r}; wrap it in a "
            f"list: {owner}({argument}=[{keys!r}])"
        )
    if not isinstance(keys, Iterable):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got {type(keys).__name__} {keys!r}"
        )
    result = tuple(keys)
    wrong = [key for key in result if not isinstance(key, str)]
    if wrong:
        raise ArgumentTypeError(
            f"{owner} {argument} must hold observation keys (strings) such as 'train/loss', "
            f"got {wrong!r}"
        )
    return result


class WriterLike(Protocol):
    """A ``ppe_core.writing`` writer, as the extensions call it."""

    def __call__(
        self,
        filename: str,
        out_dir: str,
        target: Any,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
    ) -> None: ...

    def finalize(self) -> None: ...


def missing_extra_error(feature: str, package: str, extra: str) -> OptionalDependencyError:
    """Builds the error raised when ``feature`` needs the uninstalled ``package``."""
    return OptionalDependencyError(
        f"{feature} needs {package}, which is not installed. Install it with "
        f"`pip install 'ppe-core[{extra}]'` (or `pip install {package}`)."
    )


def write_file(
    manager: ManagerView,
    writer: WriterLike | None,
    filename: str,
    target: Any,
    savefun: SaveFun,
    *,
    append: bool = False,
) -> None:
    """Saves ``target`` as ``filename`` under ``manager.out`` through a writer.

    Uses ``writer`` when given, else the manager's writer, else a ``SimpleWriter`` (which
    replaces files atomically) in this thread.
    """
    chosen = writer if writer is not None else getattr(manager, "writer", None)
    if chosen is None:
        from ppe_core.writing import SimpleWriter

        chosen = SimpleWriter()
    chosen(filename, manager.out, target, savefun=savefun, append=append)
