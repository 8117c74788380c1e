"""Rank agreement: which collective-using extensions every rank's manager has, agreed at start.

An extension that issues a ``torch.distributed`` collective (a gather, a barrier) hangs the
run unless every rank reaches the same collective at the same iteration. Ranks may register
different extensions (PPE's examples give rank 0 the extensions and the other ranks none), so
such an extension may use collectives only when every rank has it with the same trigger and
the same epoch length. When a manager starts under a process group of several ranks, the
ranks exchange that once (one ``all_gather_object``: every rank that trains has a manager, in
ppe-core's Trainer and in PPE's hand-written loops alike); each extension then asks its
manager's :meth:`~ppe_core.training.ExtensionsManager.ranks_lacking`.

A distributed evaluation agrees likewise, before it all-reduces its means, that every rank
reported the same keys (:func:`check_same_keys`; PPE reduces whatever each rank holds).

An extension declares its collectives with a ``collectives`` attribute: a string naming what
it issues and when (e.g. ``"snapshot(mode=DEFAULT, autoload=True)"``); None or absent: none.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ppe_core.distributed import group_world, object_device, run_collective
from ppe_core.distributed._env import require_object_collectives
from ppe_core.errors import ConfigurationError

__all__ = ["agree_on_collectives", "check_same_keys"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe(trigger: Any) -> str:
    # A trigger's repr names its kind and schedule; object addresses differ between processes.
    return _ADDRESS.sub("", repr(trigger))


def agree_on_collectives(
    entries: Iterable[Any], iters_per_epoch: int, device: torch.device | None = None
) -> dict[str, tuple[int, ...]] | None:
    """Which ranks lack each of this rank's collective-using extensions.

    Called by every rank's manager when its extensions start. An extension counts as present
    on another rank when that rank has one of the same name, declaring the same
    ``collectives``, with a trigger of the same description and the same epoch length (so it
    fires at the same iterations).

    Args:
        entries: The manager's registered extensions (``ExtensionEntry`` objects).
        iters_per_epoch: The manager's epoch length.
        device: Where this rank trains (see :func:`object_device`).

    Returns:
        ``{name: ranks lacking it}`` for this rank's collective-using extensions (an empty
        tuple: every rank has it), or None without a process group of several ranks.
    """
    world, _ = group_world()
    if world < 2:
        return None
    import torch.distributed as dist

    require_object_collectives(f"a manager under torch.distributed ({world} processes)")
    mine: dict[str, tuple[str, str, int]] = {}
    for entry in entries:
        declared = getattr(entry.extension, "collectives", None)
        if isinstance(declared, str):
            mine[entry.name] = (declared, _describe(entry.trigger), iters_per_epoch)
    everyone: list[Any] = [None] * world
    with object_device(device):
        dist.all_gather_object(everyone, mine)
    return {
        name: tuple(r for r, theirs in enumerate(everyone) if theirs.get(name) != signature)
        for name, signature in mine.items()
    }


def check_same_keys(keys: Sequence[str], move: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Raises on every rank unless every rank passes the same ``keys`` (one small all-reduce).

    A distributed evaluation calls it before reducing its per-key sums, which would otherwise
    hang or mix values when ranks reported different keys. ``move`` puts the tensor where the
    backend needs it (NCCL: on the rank's device).

    Raises:
        ConfigurationError: The ranks' keys differ.
    """
    import torch.distributed as dist

    digest = zlib.crc32("\0".join(keys).encode())
    check = move(torch.tensor([len(keys), -len(keys), digest, -digest], dtype=torch.float64))
    run_collective(dist.all_reduce, check, op=dist.ReduceOp.MAX)  # often the last before exit
    high_n, low_n, high_d, low_d = check.tolist()
    if high_n != -low_n or high_d != -low_d:
        raise ConfigurationError(
            f"the ranks reported different values during distributed evaluation (this rank: "
            f"{list(keys)}); every rank must report the same keys, e.g. give each rank batches "
            "from a DistributedSampler and report values unconditionally"
        )
