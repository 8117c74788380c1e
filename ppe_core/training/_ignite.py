"""``IgniteExtensionsManager``: PPE's extensions manager for pytorch-ignite training loops.

Part of the compatibility layer (``ppe_core/_compat.py`` lists it): it adapts the core's
:class:`~ppe_core.training._manager.ExtensionsManager` to an ignite ``Engine`` and nothing in
the core imports it. It lives in the training package so that ``ppe.training``'s lazy table can
name it without an import circle through that package's ``__init__``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ppe_core.training._extension import Extension, ExtensionEntry, ExtensionLike
from ppe_core.training._manager import ExtensionsManager, TransformModel
from ppe_core.training._manager_checks import check_engine
from ppe_core.training._protocols import StateObjectProtocol, WriterProtocol

__all__ = ["IgniteExtensionsManager"]


class IgniteExtensionsManager(ExtensionsManager):
    """Runs ppe-core extensions inside a pytorch-ignite ``Engine``'s training loop.

    The manager registers handlers on ``engine``: each iteration gets a fresh observation
    (``report`` works inside the engine's process function), and after the engine's own
    ``ITERATION_COMPLETED`` handlers the due extensions run. When the engine starts, the
    extensions are initialized (so ``snapshot(autoload=True)`` restores the engine's
    iteration and epoch), and they are finalized when it completes. The epoch length is the
    engine's ``len(dataloader)``.

    Args:
        engine: The ``ignite.engine.Engine`` that trains.
        models: A module (named ``"main"``) or a mapping of names to modules.
        optimizers: An optimizer (named ``"main"``) or a mapping of names to optimizers.
        max_epochs: Length of training (the engine's ``run(max_epochs=...)`` decides).
        extensions: Extensions to register right away.
        out_dir: Output directory, used when ``writer`` is None.
        writer: Writer that extensions write files through.
        enable_profile: Whether to wrap each extension call in a profiler ``record_function``.
        enable_trace: Accepted for PPE compatibility (see :class:`ExtensionsManager`).
        state_objects: Further objects whose state is saved, by name.

    Raises:
        ArgumentTypeError: ``engine`` is not an ignite ``Engine``.
        IgniteNotInstalledError: pytorch-ignite is not installed (an ``ImportError``).
    """

    def __init__(
        self,
        engine: Any,
        models: torch.nn.Module | Mapping[str, torch.nn.Module],
        optimizers: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        max_epochs: int,
        *,
        extensions: Sequence[ExtensionLike | Extension | ExtensionEntry] | None = None,
        out_dir: str | os.PathLike[str] = "result",
        writer: WriterProtocol | None = None,
        enable_profile: bool = False,
        enable_trace: bool = False,
        state_objects: Mapping[str, StateObjectProtocol] | None = None,
    ) -> None:
        check_engine(engine)
        # The epoch length is only known when the engine starts (len of its data).
        super().__init__(
            models,
            optimizers,
            max_epochs,
            iters_per_epoch=1,
            extensions=extensions,
            out_dir=out_dir,
            writer=writer,
            enable_profile=enable_profile,
            enable_trace=enable_trace,
            state_objects=state_objects,
        )
        self.engine = engine
        self._epoch_length.known = False  # len(dataloader) is known when the engine starts
        self._start_epoch = 0
        self.set_ignite_handlers()

    def set_ignite_handlers(self) -> None:
        """Registers the manager's handlers on the engine (done by the constructor)."""
        from ignite.engine import Events

        self.engine.add_event_handler(Events.STARTED, self._on_engine_started)
        self.engine.add_event_handler(Events.ITERATION_STARTED, self._on_iteration_started)
        self.engine.add_event_handler(Events.COMPLETED, self._on_engine_completed)

    def _on_engine_started(self, engine: Any) -> None:
        from ignite.engine import Events

        iters_per_epoch = len(engine.state.dataloader)
        self._prepare_for_training(0, 0, iters_per_epoch)
        self._epoch_length.known = True
        self._take_run_lock()  # also when the engine runs again after completing
        self.start_extensions()  # an autoloading snapshot sets _start_iteration here
        start = self._start_iteration
        self._epoch_length.check(start, stacklevel=2)  # a state loaded before the engine ran
        engine.state.iteration = start
        engine.state.epoch = self._start_epoch
        self._start_time = time.perf_counter()
        self._prepare_for_training(start, start, iters_per_epoch)
        if not engine.has_event_handler(self._on_iteration_completed, Events.ITERATION_COMPLETED):
            # Added now so that they run after the handlers the user registered.
            engine.add_event_handler(Events.ITERATION_COMPLETED, self._on_iteration_completed)

    def _on_iteration_started(self, engine: Any) -> None:
        self._close_scope()  # left open when the previous iteration raised
        self.begin_iteration(())

    def _on_iteration_completed(self, engine: Any) -> None:
        try:
            self._iteration = int(engine.state.iteration)
            self.execution += 1
            self.run_extensions()
        except Exception as exc:
            self.abort_iteration(exc)
            raise
        self._close_scope()

    def _on_engine_completed(self, engine: Any) -> None:
        with self._run_lock.released_after():
            for entry in list(self._slots):
                entry.extension.finalize(self)

    def state_dict(self, *, transform_models: TransformModel | None = None) -> dict[str, Any]:
        """The state of :meth:`ExtensionsManager.state_dict`, with the engine's epoch length."""
        state = super().state_dict(transform_models=transform_models)
        state["_epoch_length"] = self.engine.state.epoch_length
        state["_start_iteration"] = self.engine.state.iteration
        return state

    def load_state_dict(
        self, to_load: Mapping[str, Any], *, transform_models: TransformModel | None = None
    ) -> None:
        """Restores a state; the engine resumes from it when it (re)starts."""
        super().load_state_dict(to_load, transform_models=transform_models)
        epoch_length = to_load.get("_epoch_length") or self._iters_per_epoch
        self._start_epoch = self._start_iteration // int(epoch_length)
