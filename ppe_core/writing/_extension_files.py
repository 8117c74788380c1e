"""How an extension saves a file: through the writer it was given, the manager's, or a
:class:`~ppe_core.writing.SimpleWriter`; and the check that no two extensions write one file."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ppe_core.errors import ConfigurationError
from ppe_core.writing._writer_base import SaveFun, Writer

__all__ = [
    "OutputSample",
    "WriterLike",
    "WritesFiles",
    "check_output_files",
    "log_output_files",
    "write_file",
    "writes_files_in_out",
]


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


class OutputSample:
    """The manager as it would be at one sample iteration and epoch, for naming files.

    ``iteration``, ``epoch`` and ``epoch_detail`` are the sample's; ``out`` and ``writer``
    are the manager's. Nothing else is forwarded: reading the manager's ``iteration`` would
    start its extensions. A filename template formatted with it (``'{.iteration}'``) or
    with its numbers (``'{iteration}'``) gives the name it would give then; one using
    another field raises ``AttributeError`` (the extension then names no file).
    """

    #: Numbers no static filename is likely to hold.
    ITERATION = 1_234_567
    EPOCH = 8_910

    def __init__(self, manager: Any) -> None:
        self.iteration = self.ITERATION
        self.epoch = self.EPOCH
        self.epoch_detail = float(self.EPOCH)
        self.out = str(manager.out)
        self.writer = getattr(manager, "writer", None)


class WritesFiles(Protocol):
    """An extension that writes files, telling which (the manager checks them at start)."""

    def output_files(self, sample: OutputSample) -> Sequence[str]:
        """The paths this extension would write at ``sample``'s iteration and epoch:
        relative to ``sample.out`` or absolute. Empty where a name cannot be known (a
        callable filename, a template of values reported later)."""
        ...


def writes_files_in_out(writer: object, sample: OutputSample) -> bool:
    """Whether an extension given ``writer`` (None: the manager's) writes its files under
    the output directory: through a :class:`~ppe_core.writing.Writer` or the default one,
    not a writer that puts them elsewhere (``TensorBoardWriter`` writes event files)."""
    chosen = writer if writer is not None else getattr(sample, "writer", None)
    return chosen is None or isinstance(chosen, Writer)


def log_output_files(filename: str, writer: object, sample: OutputSample) -> tuple[str, ...]:
    """The file a log extension (LogReport, ProfileReport) writes at ``sample``: ``filename``
    formatted with the sample's ``epoch``, ``iteration`` and ``elapsed_time``; none for a
    template of other values (only an entry holds them) or a writer that writes elsewhere."""
    if not writes_files_in_out(writer, sample):
        return ()
    fields = {"epoch": sample.epoch, "iteration": sample.iteration, "elapsed_time": 0.0}
    try:
        return (filename.format(**fields),)
    except (KeyError, IndexError, ValueError, AttributeError):
        return ()


def check_output_files(manager: Any, extensions: Iterable[tuple[str, object]]) -> None:
    """Raises when two of the named ``extensions`` would write one file.

    Each extension with an ``output_files`` method (LogReport, PlotReport, snapshots) names
    its files at one sample iteration and epoch; two that give one path would write into one
    file (two LogReports interleave their entries in it, two snapshot series retain and
    autoload each other's files). Runs once, when the extensions start.

    Raises:
        ConfigurationError: Two extensions name one path; the message names both, the file
            and the fix.
    """
    sample = OutputSample(manager)
    out = sample.out
    owners: dict[str, str] = {}
    for name, extension in extensions:
        output_files = getattr(extension, "output_files", None)
        if not callable(output_files):
            continue
        for path in output_files(sample):
            key = os.path.normpath(os.path.join(out, path))
            owner = owners.setdefault(key, name)
            if owner != name:
                raise ConfigurationError(
                    f"extensions {owner!r} and {name!r} would both write "
                    f"{os.path.relpath(key, out)!r} in {out!r}, "
                    "so one file would hold the output of both; give one of them another "
                    "filename (e.g. LogReport(filename='log_2'), PlotReport(filename=...), "
                    "snapshot(filename='other_{.iteration}'))"
                )
