"""LRScheduler: steps a PyTorch learning-rate scheduler when its trigger fires."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ppe_core.errors import ConfigurationError, MissingObservationError
from ppe_core.training.extension import Extension
from ppe_core.training.triggers import get_trigger

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["LRScheduler", "MissingObservationError", "Stepper"]


class _Scheduler(Protocol):
    """What :class:`LRScheduler` needs of a scheduler (every ``torch.optim.lr_scheduler``)."""

    optimizer: torch.optim.Optimizer

    def step(self, *args: Any, **kwargs: Any) -> object: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


#: ``stepper(manager, scheduler)`` steps ``scheduler`` once; see ``LRScheduler.step_by_value``.
Stepper = Callable[["ManagerView", Any], object]


def _observed_value(manager: ManagerView, key: str) -> Any:
    observation = manager.observation
    if key not in observation:
        raise MissingObservationError(
            f"LRScheduler needs the reported value {key!r} to step its scheduler, but it is not "
            f"in the observation at iteration {manager.iteration} (reported: "
            f"{sorted(observation)}). Attach an evaluator so that it is reported before the "
            "scheduler runs (create_trainer(..., evaluator=...)), or pass "
            "stepper=LRScheduler.step_by_value('<a reported key>')."
        )
    return observation[key]


def _default_stepper(manager: ManagerView, scheduler: Any) -> None:
    # ReduceLROnPlateau is the one built-in scheduler that needs a metric.
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(_observed_value(manager, "val/loss"))
    else:
        scheduler.step()


def _optimizer_has_stepped(optimizer: torch.optim.Optimizer) -> bool:
    # torch >= 2.4: the scheduler wraps optimizer.step to set ``_opt_called``; older torch
    # counted calls in ``_step_count`` on the optimizer instead.
    if getattr(optimizer, "_opt_called", False):
        return True
    return int(getattr(optimizer, "_step_count", 0)) >= 1


def _check_scheduler(scheduler: object) -> None:
    if not callable(getattr(scheduler, "step", None)):
        raise ConfigurationError(
            f"LRScheduler needs a torch.optim.lr_scheduler scheduler, got "
            f"{type(scheduler).__name__}; e.g. LRScheduler(StepLR(optimizer, step_size=10))"
        )


class LRScheduler(Extension):
    """Steps a ``torch.optim.lr_scheduler`` scheduler when the trigger fires.

    Extensions run after the iteration's optimizer step, so ``scheduler.step()`` follows
    ``optimizer.step()`` as PyTorch requires. ``ReduceLROnPlateau`` is stepped with the
    reported ``'val/loss'`` by default (an evaluator reports it before this extension runs);
    pass ``stepper=LRScheduler.step_by_value(key)`` to use another value.

    Args:
        scheduler: Any ``torch.optim.lr_scheduler`` scheduler (``StepLR``, ``ReduceLROnPlateau``,
            ...).
        stepper: ``stepper(manager, scheduler)`` performs one step; the default calls
            ``scheduler.step()``, or ``scheduler.step(observation['val/loss'])`` for
            ``ReduceLROnPlateau``.
        trigger: When to step; once per epoch by default.
        wait_for_first_optimizer_step: Skip steps until the optimizer has stepped once. With a
            ``GradScaler`` the first optimizer steps may be skipped (inf/NaN gradients), and
            stepping the scheduler before the optimizer would skip a learning-rate value.
            Only torch schedulers can tell; other schedulers are stepped from the start.
        is_async: Whether the extension may run decoupled from the model state (PPE's flag).

    Example::

        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1)
        trainer = ppe.engine.create_trainer(
            model, optimizer, 30, extensions=[ppe.training.extensions.LRScheduler(scheduler)]
        )
    """

    def __init__(
        self,
        scheduler: _Scheduler,
        *,
        stepper: Stepper = _default_stepper,
        trigger: TriggerLike = (1, "epoch"),
        wait_for_first_optimizer_step: bool = False,
        is_async: bool = True,
    ) -> None:
        _check_scheduler(scheduler)
        self.scheduler = scheduler
        self.stepper = stepper
        self.trigger = get_trigger(trigger)
        self.wait_for_first_optimizer_step = wait_for_first_optimizer_step
        self.is_async = is_async
        # Whether the optimizer's first step can be detected: torch schedulers wrap
        # optimizer.step to record it. For other schedulers there is nothing to wait for
        # (PPE steps them from the start too).
        optimizer_step = getattr(getattr(scheduler, "optimizer", None), "step", None)
        self._step_observable = isinstance(
            scheduler, torch.optim.lr_scheduler.LRScheduler
        ) or hasattr(optimizer_step, "_with_counter")

    def __call__(self, manager: ManagerView) -> None:
        """Steps the scheduler (unless waiting for the optimizer's first step).

        Raises:
            MissingObservationError: The default stepper of ``ReduceLROnPlateau`` (or one made
                by :meth:`step_by_value`) found no value under its key.
        """
        if (
            self.wait_for_first_optimizer_step
            and self._step_observable
            and not _optimizer_has_stepped(self.scheduler.optimizer)
        ):
            return
        self.stepper(manager, self.scheduler)

    @staticmethod
    def step_by_value(key: str | None) -> Stepper:
        """Returns a stepper that calls ``scheduler.step(observation[key])``.

        Args:
            key: The reported value to pass, e.g. ``'val/accuracy'``; ``None`` calls
                ``scheduler.step()`` without a value.

        Returns:
            A stepper for the ``stepper`` argument; it raises :class:`MissingObservationError`
            when ``key`` was not reported.
        """

        def stepper(manager: ManagerView, scheduler: Any) -> None:
            if key is None:
                scheduler.step()
            else:
                scheduler.step(_observed_value(manager, key))

        return stepper

    def state_dict(self) -> dict[str, Any]:
        """Returns ``{'scheduler': scheduler.state_dict()}`` (PPE's layout)."""
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the scheduler's state from :meth:`state_dict`."""
        self.scheduler.load_state_dict(dict(to_load["scheduler"]))
