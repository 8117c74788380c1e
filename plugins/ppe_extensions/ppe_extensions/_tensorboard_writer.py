"""TensorBoardWriter: a writer that sends log entries to TensorBoard instead of a file.

TensorBoard (``torch.utils.tensorboard``) is imported only when a writer is created.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

from ppe_core.errors import ConfigurationError

__all__ = ["ScalarWriter", "TensorBoardWriter", "check_tensorboard", "create_summary_writer"]


class ScalarWriter(Protocol):
    """What is used of ``torch.utils.tensorboard.SummaryWriter``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any: ...

    def flush(self) -> Any: ...

    def close(self) -> Any: ...


def _missing_tensorboard(feature: str) -> Exception:
    # From the public errors module (which loads it on first access), so that writing does
    # not import the extensions package: extensions import writing, never the reverse.
    from ppe_core.errors import OptionalDependencyError

    return OptionalDependencyError(
        f"{feature} needs tensorboard, which is not installed. Install it with "
        "`pip install 'ppe-core[tensorboard]'` (or `pip install tensorboard`)."
    )


def create_summary_writer(feature: str, log_dir: str | None, **kwargs: Any) -> ScalarWriter:
    """Creates a ``SummaryWriter``, importing TensorBoard only now (it is an optional extra).

    Raises:
        OptionalDependencyError: TensorBoard is not installed (``feature`` names the user).
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise _missing_tensorboard(feature) from None
    writer: ScalarWriter = SummaryWriter(log_dir=log_dir, **kwargs)
    return writer


def check_tensorboard(feature: str) -> None:
    """Raises unless TensorBoard can be imported (``feature`` names the user).

    Raises:
        OptionalDependencyError: TensorBoard is not installed.
    """
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise _missing_tensorboard(feature) from None


def _is_scalar(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class TensorBoardWriter:
    """A writer that sends log entries to TensorBoard instead of writing a file.

    Give it to ``LogReport(writer=TensorBoardWriter(out_dir='runs'))``: each time the log is
    written, the scalars of its latest entry (``'iteration'`` included, as PPE's writer sends
    it) are added at ``global_step=entry['iteration']``.
    TensorBoard is an optional dependency: ``pip install 'ppe-core[tensorboard]'``.

    Args:
        savefun: Ignored (PPE's writer signature).
        fs: Ignored (PPE's writer signature).
        out_dir: TensorBoard's ``log_dir``; TensorBoard's default (``runs/...``) when None.
        stats: Keys to send; every scalar of the entry when None.
        summary_writer: A ``SummaryWriter`` (or an object with ``add_scalar``, ``flush`` and
            ``close``) to use instead of creating one; this writer does not close it.
        **kwds: Passed to ``SummaryWriter``.

    Raises:
        OptionalDependencyError: No ``summary_writer`` was given and TensorBoard is not
            installed.
    """

    def __init__(
        self,
        savefun: Any = None,
        fs: Any = None,
        out_dir: str | os.PathLike[str] | None = None,
        stats: Iterable[str] | None = None,
        *,
        summary_writer: ScalarWriter | None = None,
        **kwds: Any,
    ) -> None:
        out_dir = None if out_dir is None else os.fspath(out_dir)  # a Path works as its str
        self._stats = None if stats is None else tuple(stats)
        self._owned = summary_writer is None
        self._writer: ScalarWriter | None = (
            create_summary_writer("TensorBoardWriter", out_dir, **kwds)
            if summary_writer is None
            else summary_writer
        )
        self.out_dir = out_dir

    def initialize(self, out_dir: str) -> None:
        """Does nothing: TensorBoard creates its own directory (the manager calls this)."""

    def __call__(
        self,
        filename: str,
        out_dir: str,
        target: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        savefun: Any = None,
        append: bool = False,
    ) -> None:
        """Adds the scalars of ``target`` (a log entry, or a log whose last entry is used).

        As PPE's writer, ``'iteration'`` is sent as a scalar too (dashboards made from a PPE
        run have that chart); ``add_entry`` leaves it out.

        Args:
            filename: Ignored.
            out_dir: Ignored.
            target: A dictionary with an ``'iteration'`` entry, or a list of them.
            savefun: Ignored.
            append: Ignored.

        Raises:
            ConfigurationError: ``target`` is not an entry or a list of entries with an
                ``'iteration'``.
        """
        entry = target[-1] if isinstance(target, Sequence) and target else target
        if not isinstance(entry, Mapping) or "iteration" not in entry:
            raise ConfigurationError(
                "TensorBoardWriter expects a log entry (a dict with an 'iteration' key) or a "
                f"list of them, got {type(target).__name__}; use it as LogReport's writer"
            )
        self._add(entry, with_step=True)

    def add_entry(self, entry: Mapping[str, Any]) -> None:
        """Adds the scalars of ``entry`` but ``'iteration'``, at step ``entry['iteration']``."""
        self._add(entry, with_step=False)

    def _add(self, entry: Mapping[str, Any], *, with_step: bool) -> None:
        writer = self._writer
        if writer is None:
            raise ConfigurationError("TensorBoardWriter was finalized; create a new one")
        step = int(entry["iteration"])
        keys = entry.keys() if self._stats is None else self._stats
        for key in keys:
            value = entry.get(key)
            if (with_step or key != "iteration") and _is_scalar(value):
                writer.add_scalar(key, float(value), global_step=step)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Makes TensorBoard see what was added so far."""
        if self._writer is not None:
            self._writer.flush()

    def finalize(self) -> None:
        """Flushes, and closes the ``SummaryWriter`` if this writer created it; idempotent."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self._owned:
            writer.close()
        else:
            writer.flush()
