"""Structural types for what triggers and extensions may see of a manager."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

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
