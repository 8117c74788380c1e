"""The TensorBoard extension (its writer, TensorBoardWriter, lives in ``ppe_core.writing``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ppe_core.reporting import DictSummary, to_floats
from ppe_core.training.extension import Extension
from ppe_core.training.triggers import DueCheck, EveryIteration, get_trigger
from ppe_extensions._keys import key_tuple
from ppe_extensions._tensorboard_writer import (
    ScalarWriter,
    TensorBoardWriter,
    check_tensorboard,
)

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["ScalarWriter", "TensorBoard", "TensorBoardWriter"]


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
        out_dir: str | os.PathLike[str] | None = None,
        keys: Iterable[str] | None = None,
        trigger: TriggerLike = (1, "epoch"),
    ) -> None:
        if writer is None:
            check_tensorboard("TensorBoard")
        self._given_writer = writer
        self._out_dir = None if out_dir is None else os.fspath(out_dir)
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
