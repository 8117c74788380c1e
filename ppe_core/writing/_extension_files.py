"""How an extension saves a file: through the writer it was given, the manager's, or a
:class:`~ppe_core.writing.SimpleWriter`."""

from __future__ import annotations

from typing import Any, Protocol

from ppe_core.writing._writer_base import SaveFun

__all__ = ["WriterLike", "write_file"]


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


class _Output(Protocol):
    """The manager as :func:`write_file` reads it: its output directory (and, if it has one,
    its ``writer``)."""

    @property
    def out(self) -> str: ...


def write_file(
    manager: _Output,
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
        from ppe_core.writing._simple_writer import SimpleWriter

        chosen = SimpleWriter()
    chosen(filename, manager.out, target, savefun=savefun, append=append)
