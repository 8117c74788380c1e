"""Structural types for what triggers and extensions may see of a manager."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


class ManagerView(Protocol):
    """The part of an ``ExtensionsManager`` that triggers and extensions rely on.

    ``iteration`` counts completed iterations: it is already incremented when
    extensions and triggers run for that iteration.
    """

    @property
    def iteration(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def epoch_detail(self) -> float: ...

    @property
    def iters_per_epoch(self) -> int: ...

    @property
    def observation(self) -> dict[str, Any]: ...

    @property
    def elapsed_time(self) -> float: ...

    @property
    def models(self) -> Mapping[str, torch.nn.Module]: ...

    @property
    def raw_models(self) -> Mapping[str, torch.nn.Module]: ...

    @property
    def optimizers(self) -> Mapping[str, torch.optim.Optimizer]: ...

    @property
    def out(self) -> str: ...

    @property
    def is_before_training(self) -> bool: ...

    @property
    def stop_trigger(self) -> bool: ...

    @property
    def writer(self) -> Any: ...

    @property
    def reporter(self) -> Any: ...

    def get_extension(self, name: str) -> Any: ...


class ExtensionsManagerProtocol(ManagerView, Protocol):
    """PPE's name for what an extension may use of its manager: the same as ManagerView."""


@runtime_checkable
class StateObjectProtocol(Protocol):
    """An object whose state a manager saves and restores (``state_objects=``).

    Anything with ``state_dict()`` and ``load_state_dict(state)`` qualifies: a GradScaler,
    an LR scheduler, a sampler, ...
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...
