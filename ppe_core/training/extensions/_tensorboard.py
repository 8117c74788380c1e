"""TensorBoard output: the TensorBoardWriter writer and the TensorBoard extension."""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.reporting import DictSummary, to_floats
from ppe_core.training._extension import Extension
from ppe_core.training.extensions._plot_report import DueCheck, missing_extra_error
from ppe_core.training.extensions._util import EveryIteration, key_tuple
from ppe_core.training.triggers import get_trigger

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["ScalarWriter", "TensorBoard", "TensorBoardWriter"]


class ScalarWriter(Protocol):
    """What is used of ``torch.utils.tensorboard.SummaryWriter``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any: ...

    def flush(self) -> Any: ...

    def close(self) -> Any: ...


def _summary_writer(feature: str, log_dir: str | None, **kwargs: Any) -> ScalarWriter:
    """Creates a ``SummaryWriter``, importing TensorBoard only now (it is an optional extra)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise missing_extra_error(feature, "tensorboard", "tensorboard") from None
    writer: ScalarWriter = SummaryWriter(log_dir=log_dir, **kwargs)
    return writer


def _check_tensorboard(feature: str) -> None:
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise missing_extra_error(feature, "tensorboard", "tensorboard") from None


def _is_scalar(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class TensorBoardWriter:
    """A writer that sends log entries to TensorBoard instead of writing a file.

    Give it to ``LogReport(writer=TensorBoardWriter(out_dir='runs'))``: each time the log is
    written, the scalars of its latest entry are added at ``global_step=entry['iteration']``.
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
        out_dir: str | None = None,
        stats: Iterable[str] | None = None,
        *,
        summary_writer: ScalarWriter | None = None,
        **kwds: Any,
    ) -> None:
        self._stats = None if stats is None else tuple(stats)
        self._owned = summary_writer is None
        self._writer: ScalarWriter | None = (
            _summary_writer("TensorBoardWriter", out_dir, **kwds)
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
        self.add_entry(entry)

    def add_entry(self, entry: Mapping[str, Any]) -> None:
        """Adds the scalars of ``entry`` at step ``entry['iteration']``."""
        writer = self._writer
        if writer is None:
            raise ConfigurationError("TensorBoardWriter was finalized; create a new one")
        step = int(entry["iteration"])
        keys = entry.keys() if self._stats is None else self._stats
        for key in keys:
            value = entry.get(key)
            if key != "iteration" and _is_scalar(value):
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


class TensorBoard(Extension):
    """Sends the mean of reported values over each interval to TensorBoard.

    Every iteration it adds the scalar values of the observation (or of ``keys``) to a running
    summary, like ``LogReport`` (tensors stay on the device); when ``trigger`` fires it adds
    their means to TensorBoard at ``global_step=iteration``, together with ``epoch``. TensorBoard
    is an optional dependency: ``pip install 'ppe-core[tensorboard]'``; it is imported when the
    extension is created.

    Args:
        writer: A ``torch.utils.tensorboard.SummaryWriter`` (or any object with
            ``add_scalar``, ``flush`` and ``close``); the extension flushes but does not close
            it. By default one is created in ``out_dir`` when training starts and closed at
            the end.
        out_dir: TensorBoard's ``log_dir`` when ``writer`` is None; the manager's output
            directory by default.
        keys: Observation keys to send; every scalar when None.
        trigger: When to send the means; once per epoch by default. This is not the
            extension's own trigger, which fires every iteration.

    Raises:
        OptionalDependencyError: ``writer`` is None and TensorBoard is not installed.
    """

    def __init__(
        self,
        writer: ScalarWriter | None = None,
        out_dir: str | None = None,
        keys: Iterable[str] | None = None,
        trigger: TriggerLike = (1, "epoch"),
    ) -> None:
        if writer is None:
            _check_tensorboard("TensorBoard")
        self._given_writer = writer
        self._out_dir = out_dir
        self._keys = None if keys is None else key_tuple(keys, "TensorBoard", "keys")
        self.trigger = EveryIteration()  # it must see every iteration's values
        self._trigger = DueCheck(get_trigger(trigger))
        self._summary = DictSummary()
        self._sink: TensorBoardWriter | None = None

    def initialize(self, manager: ManagerView) -> None:
        """Creates the ``SummaryWriter`` (unless one was given)."""
        self._sink = self._make_sink(manager)

    def _make_sink(self, manager: ManagerView) -> TensorBoardWriter:
        if self._given_writer is not None:
            return TensorBoardWriter(summary_writer=self._given_writer)
        out_dir = manager.out if self._out_dir is None else self._out_dir
        return TensorBoardWriter(out_dir=out_dir)

    def __call__(self, manager: ManagerView) -> None:
        """Accumulates this iteration's values; sends their means when the trigger fires."""
        observation = manager.observation
        if self._keys is None:
            self._summary.add(observation)
        else:
            self._summary.add({k: observation[k] for k in self._keys if k in observation})
        if not self._trigger(manager):
            return
        summary, self._summary = self._summary, DictSummary()
        entry: dict[str, Any] = to_floats(summary.compute_mean())
        entry["epoch"] = manager.epoch
        entry["iteration"] = manager.iteration
        if self._sink is None:
            self._sink = self._make_sink(manager)
        self._sink.add_entry(entry)
        self._sink.flush()

    def finalize(self, manager: ManagerView) -> None:
        """Closes the ``SummaryWriter`` it created, or flushes the given one."""
        if self._sink is not None:
            self._sink.finalize()
            self._sink = None
