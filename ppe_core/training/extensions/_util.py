"""Helpers shared by the extensions: triggers, writing files, log formats, distributed."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any, Protocol

from ppe_core.errors import ArgumentTypeError, DistributedNotInitializedError, PPEError
from ppe_core.training.triggers import Trigger, next_due

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView

__all__ = [
    "LOG_FORMATS",
    "DueCheck",
    "EveryIteration",
    "LogSaver",
    "OptionalDependencyError",
    "SaveFun",
    "WriterLike",
    "dist_gather",
    "in_notebook",
    "is_output_rank",
    "is_terminal",
    "key_tuple",
    "missing_extra_error",
    "require_distributed",
    "write_file",
]

#: ``savefun(target, file_object)``: what writers call to serialize a target.
SaveFun = Callable[[Any, IO[bytes]], object]

#: The accepted values of ``LogReport(format=...)`` (and ProfileReport's).
LOG_FORMATS = ("json", "json-lines", "yaml")


def is_output_rank() -> bool:
    """Whether this process prints and writes files: rank 0, or any process when not distributed.

    Called when an extension starts or writes (never per step). Reads ``sys.modules`` first: a
    process that never imported ``torch.distributed`` has no process group, and checking costs no
    import.
    """
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return True
    return int(dist.get_rank()) == 0


class OptionalDependencyError(PPEError, ImportError):
    """A feature needs a package that is not installed; the message says what to install."""


class EveryIteration(Trigger):
    """Fires after every iteration, and says so through ``next_check``.

    Cheaper than ``IntervalTrigger(1, 'iteration')`` for extensions that must see every
    observation: the manager's check is a constant ``True``.
    """

    fires_every_iteration = True

    def __call__(self, manager: ManagerView) -> bool:
        return True

    def next_check(self, iteration: int, iters_per_epoch: int) -> int:
        return iteration + 1

    def may_fire(self, iteration: int, epoch_length: int) -> bool:
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def is_terminal(out: IO[Any]) -> bool:
    """Whether ``out`` is an interactive terminal (so cursor control is allowed)."""
    isatty = getattr(out, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where tqdm's notebook widget works).

    Only looks at already imported modules, so it never imports IPython itself.
    """
    return "ipykernel.zmqshell" in sys.modules


def key_tuple(keys: object, owner: str, argument: str) -> tuple[str, ...]:
    """``keys`` as a tuple of observation keys, rejecting a bare string.

    A string is iterable, so ``LogReport(keys="loss")`` would otherwise track the keys
    ``"l"``, ``"o"``, ``"s"`` and never report anything.

    Raises:
        ArgumentTypeError: ``keys`` is a string, not iterable, or holds a non-string.
    """
    if isinstance(keys, str):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got the string {keys!r}; wrap it in a "
            f"list: {owner}({argument}=[{keys!r}])"
        )
    if not isinstance(keys, Iterable):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got {type(keys).__name__} {keys!r}"
        )
    result = tuple(keys)
    wrong = [key for key in result if not isinstance(key, str)]
    if wrong:
        raise ArgumentTypeError(
            f"{owner} {argument} must hold observation keys (strings) such as 'train/loss', "
            f"got {wrong!r}"
        )
    return result


class DueCheck:
    """Consults a trigger only at the iterations its ``next_check`` announces.

    For extensions that run every iteration (to accumulate values) but act on an inner
    trigger: the trigger sees the same calls it would get from the manager, scheduled by
    :func:`~ppe_core.training.triggers.next_due` as the manager schedules its own.

    Args:
        trigger: The inner trigger.
    """

    def __init__(self, trigger: Trigger) -> None:
        self.trigger = trigger
        self._due = -1
        self._last = -1

    def __call__(self, manager: ManagerView) -> bool:
        """Returns whether the trigger fires at ``manager.iteration``."""
        iteration = manager.iteration
        if iteration <= self._last:  # the iteration was reset (e.g. a loaded state)
            self._due = -1
        self._last = iteration
        if iteration < self._due:
            return False
        trigger = self.trigger
        if self._due < 0:
            self._due = next_due(trigger, iteration - 1, manager.iters_per_epoch)
            if iteration < self._due:
                return False
        fired = bool(trigger(manager))
        self._due = next_due(trigger, iteration, manager.iters_per_epoch)
        return fired

    def reset(self) -> None:
        """Forgets the schedule: the next call asks ``next_check`` again (after a load)."""
        self._due = -1
        self._last = -1


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


def missing_extra_error(feature: str, package: str, extra: str) -> OptionalDependencyError:
    """Builds the error raised when ``feature`` needs the uninstalled ``package``."""
    return OptionalDependencyError(
        f"{feature} needs {package}, which is not installed. Install it with "
        f"`pip install 'ppe-core[{extra}]'` (or `pip install {package}`)."
    )


def write_file(
    manager: ManagerView,
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
        from ppe_core.writing import SimpleWriter

        chosen = SimpleWriter()
    chosen(filename, manager.out, target, savefun=savefun, append=append)


class LogSaver:
    """The ``savefun`` for a list of log entries in one of :data:`LOG_FORMATS`.

    A module-level class so process-based writers can pickle it. ``'json'`` writes one JSON
    list; ``'json-lines'`` one object per line (appends stay valid); ``'yaml'`` a sequence
    (needs PyYAML; appended chunks concatenate into one longer sequence).
    """

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt

    def __call__(self, target: list[dict[str, Any]], file_obj: IO[bytes]) -> None:
        if self.fmt == "json":
            text = json.dumps(target, indent=4)
        elif self.fmt == "json-lines":
            text = "".join(json.dumps(entry) + "\n" for entry in target)
        else:
            yaml: Any = importlib.import_module("yaml")
            text = yaml.safe_dump(target) if target else ""
        file_obj.write(text.encode("utf-8"))


def require_distributed(owner: str) -> None:
    """Raises unless ``torch.distributed`` is initialised (``owner`` names the feature).

    Raises:
        DistributedNotInitializedError: No process group (a ``RuntimeError``, as in PPE).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedNotInitializedError(
            f"{owner} needs torch.distributed to be initialised; call "
            "torch.distributed.init_process_group(...) first (torchrun sets up the "
            "environment), or use the non-distributed variant"
        )


def dist_gather(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``torch.distributed.all_gather_object``)."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
