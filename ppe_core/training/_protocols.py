"""Structural types: what triggers, extensions and trainers may use of a manager, and what
the manager needs of the objects it is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


class WriterProtocol(Protocol):
    """What the manager needs of a writer (``ppe_core.writing.Writer`` satisfies it)."""

    def initialize(self, out_dir: str) -> None: ...

    def finalize(self) -> None: ...


class IterationDriver(Protocol):
    """What a training loop calls on its manager, per iteration and when training fails.

    ``ExtensionsManager`` implements it (``run_iteration()`` is the same as a context
    manager). Per step a loop calls ``begin_iteration()``, runs the step, then
    ``end_iteration()``, which returns True once the stop condition fired; an exception that
    ends training goes to ``handle_training_error``.
    """

    def start_extensions(self) -> None: ...

    def begin_iteration(self, step_optimizers: Sequence[str] = ()) -> None: ...

    def end_iteration(self, step_optimizers: Sequence[str] = ()) -> bool: ...

    def abort_iteration(self, exc: BaseException) -> None: ...

    def handle_training_error(self, exc: BaseException) -> None: ...

    @property
    def stop_trigger(self) -> bool: ...

    @property
    def iteration(self) -> int: ...
