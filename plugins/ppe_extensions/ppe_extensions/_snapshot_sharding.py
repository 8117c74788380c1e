"""Sharded tensors (DTensors) in what a snapshot saves, looked for when it starts or saves.

An FSDP2 (``fully_shard``) or tensor-parallel model holds DTensors: each rank has only its
shard, so a snapshot that writes one whole state from one rank would hold that rank's part. The
snapshot modes that write one state refuse them; ``SnapshotMode.SHARDED`` keeps each rank's
shards and resumes at the same world size only; the others raise the error below, which
says what to use instead. Never called per step.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ppe_core.errors import ShardedStateError

__all__ = [
    "dtensor_type",
    "find_sharded",
    "saved_objects",
    "sharded_error",
    "sharded_paths",
    "sharded_tensors",
]


def dtensor_type() -> type[torch.Tensor] | None:
    """``DTensor``'s class, or None while ``torch.distributed.tensor`` is not imported.

    No DTensor can exist before that module is imported, so this never imports it (nor makes
    ``import ppe_core`` load torch.distributed pieces).
    """
    module = sys.modules.get("torch.distributed.tensor")
    found = getattr(module, "DTensor", None)
    return found if isinstance(found, type) and issubclass(found, torch.Tensor) else None


def sharded_tensors(objects: Mapping[str, Any]) -> list[str]:
    """Where ``objects`` hold DTensors: a module's parameters and buffers, an optimizer's
    parameters, any other object's ``state_dict()``.

    Args:
        objects: Names (as the message shows them, e.g. ``"models['main']"``) to objects.

    Returns:
        E.g. ``["models['main'].body.0.weight", "optimizers['main'].param_groups[0][1]"]``.
    """
    dtensor = dtensor_type()
    if dtensor is None:
        return []
    found = []
    for where, obj in objects.items():
        if isinstance(obj, torch.nn.Module):
            named = itertools.chain(obj.named_parameters(), obj.named_buffers())
            found += [f"{where}.{name}" for name, t in named if isinstance(t, dtensor)]
        elif isinstance(obj, torch.optim.Optimizer):
            for g, group in enumerate(obj.param_groups):
                found += [
                    f"{where}.param_groups[{g}][{i}]"
                    for i, p in enumerate(group["params"])
                    if isinstance(p, dtensor)
                ]
        elif hasattr(obj, "state_dict"):  # a custom target: its state is what is saved
            found += [f"{where}.state_dict(){path}" for path in sharded_paths(obj.state_dict())]
    return found


def sharded_paths(state: Any) -> list[str]:
    """Where a state (nested dicts, lists and tuples) holds DTensors, e.g. ``["['w']"]``."""
    dtensor = dtensor_type()
    if dtensor is None:
        return []
    found = []
    pending: list[tuple[str, Any]] = [("", state)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, dtensor):
            found.append(path)
        elif isinstance(value, Mapping):
            pending += [(f"{path}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            pending += [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    return sorted(found)


def saved_objects(target: Any, manager: Any) -> dict[str, Any]:
    """The models and optimizers a snapshot of ``target`` (None: the manager) saves, named as
    in the messages."""
    if target is None:
        models = getattr(manager, "raw_models", {})
        optimizers = getattr(manager, "optimizers", {})
        return {
            **{f"models[{k!r}]": v for k, v in models.items()},
            **{f"optimizers[{k!r}]": v for k, v in optimizers.items()},
        }
    if isinstance(target, Mapping):
        return {f"target[{k!r}]": v for k, v in target.items()}
    return {"target": target}


def find_sharded(objects: Mapping[str, Any], refuse: Callable[[str], Exception] | None) -> bool:
    """Whether ``objects`` hold sharded tensors; with ``refuse``, raises what it makes of the
    first few places instead."""
    found = sharded_tensors(objects)
    if found and refuse is not None:
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise refuse(", ".join(found[:3]) + more)
    return bool(found)


def sharded_error(snapshot: str, saver: int, what: str) -> ShardedStateError:
    """The refusal of ``snapshot`` (a mode writing rank ``saver``'s state) to save ``what``."""
    return ShardedStateError(
        f"{snapshot} cannot save {what}: sharded "
        "DTensors (an FSDP2 fully_shard or tensor-parallel model, or its optimizer), of "
        f"which each rank holds only its own shard. This mode writes one file, from rank "
        f"{saver}, which would hold rank {saver}'s shards only, and a run resumed from it "
        "would train other weights, so nothing was written. Use "
        "snapshot_mode=SnapshotMode.DCP with saver_rank=0 (every rank writes its shards "
        "with torch.distributed.checkpoint, in the background; it reshards on load at "
        "another world size) or snapshot_mode=SnapshotMode.SHARDED with saver_rank=0 "
        "(every rank writes its own shards; it resumes at the same world size only), save "
        "a full state dict yourself (torch.distributed.checkpoint.state_dict."
        "get_model_state_dict with StateDictOptions(full_state_dict=True)), or train with "
        "DDP."
    )
