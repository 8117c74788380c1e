"""observe_value and observe_lr: extensions that put a value into the observation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.training.extension import PRIORITY_WRITER, Extension

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["observe_lr", "observe_value"]


def _check_observation(observation_key: object, target_func: object) -> None:
    if not isinstance(observation_key, str) or not observation_key:
        raise ConfigurationError(
            f"observe_value needs a non-empty str observation_key such as 'lr', got "
            f"{observation_key!r}"
        )
    if not callable(target_func):
        raise ConfigurationError(
            f"observe_value needs a callable target_func(manager), got {type(target_func).__name__}"
        )


class _ObserveValue(Extension):
    """Writes ``target_func(manager)`` into ``manager.observation[observation_key]``."""

    trigger: TriggerLike = (1, "epoch")
    # A writer, so that LogReport and other readers of the same iteration see the value.
    priority = PRIORITY_WRITER

    def __init__(self, observation_key: str, target_func: Callable[[ManagerView], Any]) -> None:
        _check_observation(observation_key, target_func)
        self.observation_key = observation_key
        self.target_func = target_func

    # PPE's name for these extensions; keeping it lets PPE snapshots load without warnings.
    default_name = "_observe_value"

    def __call__(self, manager: ManagerView) -> None:
        manager.observation[self.observation_key] = self.target_func(manager)


def observe_value(observation_key: str, target_func: Callable[[ManagerView], Any]) -> Extension:
    """Returns an extension that reports ``target_func(manager)`` under ``observation_key``.

    It runs once per epoch by default (change it with ``extend(..., trigger=...)``) at writer
    priority, so that ``LogReport`` of the same iteration records the value. The value is
    stored as returned: a tensor is not copied to the host.

    Args:
        observation_key: Key to store the value under, e.g. ``'lr'``.
        target_func: Called with the manager; returns the value to record.

    Returns:
        The extension.

    Raises:
        ConfigurationError: ``observation_key`` is not a non-empty str or ``target_func`` is
            not callable.
    """
    return _ObserveValue(observation_key, target_func)


def observe_lr(
    optimizer: torch.optim.Optimizer, param_group: int = 0, observation_key: str = "lr"
) -> Extension:
    """Returns an extension that reports an optimizer's learning rate (see :func:`observe_value`).

    Args:
        optimizer: The optimizer whose learning rate is recorded.
        param_group: Index of the parameter group to read.
        observation_key: Key to store the learning rate under.

    Returns:
        The extension.

    Raises:
        ConfigurationError: ``param_group`` is not an index of ``optimizer.param_groups``.
    """
    _check_param_group(optimizer, param_group)

    def learning_rate(manager: ManagerView) -> Any:
        return optimizer.param_groups[param_group]["lr"]

    return observe_value(observation_key, learning_rate)


def _check_param_group(optimizer: torch.optim.Optimizer, param_group: object) -> None:
    groups = optimizer.param_groups
    if isinstance(param_group, bool) or not isinstance(param_group, int):
        raise ConfigurationError(
            f"observe_lr param_group must be an int index, got {type(param_group).__name__}"
        )
    if not -len(groups) <= param_group < len(groups):
        raise ConfigurationError(
            f"observe_lr param_group={param_group} is out of range: the optimizer has "
            f"{len(groups)} parameter group(s)"
        )
