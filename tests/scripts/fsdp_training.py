"""FSDP2 (``fully_shard``) training through ``create_trainer`` under torchrun (gloo, CPU), used
by tests/test_fsdp.py and tests/test_fsdp_dcp.py.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 fsdp_training.py OUT
    [--phase first|resume|reshard|load|kill|accumulate] [--mode sharded|dcp|default|distributed]
    [--model fsdp|ddp] [--n-retains N]

``--phase first`` (the default) runs, in one launch:

* ``reference``: 2 epochs of AdamW on a sharded MLP (no dropout), with a distributed evaluator
  on an odd-sized validation set (37 samples: ranks get 19 and 18, 4 batches each);
* ``amp``: the same 2 epochs under CPU autocast (bfloat16), without the evaluator;
* ``refusals``: the snapshots that cannot hold sharded state, each in a directory of its own,
  each expected to raise ``ShardedStateError`` (the messages are kept): when training starts,
  and, for sharded tensors only an extension's state holds, when the state is taken;
* ``straight``: 2 epochs with dropout and per-rank seeds, snapshot (``--mode``) every 4
  iterations with autoload, in ``OUT/straight``;
* ``stopped``: the same run stopped at iteration 12 (mid-epoch 2), in ``OUT/run``.

With ``--mode dcp`` (used by tests/test_fsdp_dcp.py) the first phase runs the last two only.
``--phase resume`` resumes ``OUT/run`` to the end; ``--phase reshard`` (at another world size)
expects that resume to raise ``ShardedStateError``; ``--phase load`` resumes it and stops at
once (the weights as loaded); ``--phase kill`` trains in ``OUT/run`` and SIGKILLs every rank
at iteration 10, while the save of snapshot 8 is unfinished. Each phase writes
``OUT/{phase}_rank{N}.pt`` with, per run, the full (gathered) weights and optimizer state, the
final RNG state, the iteration, the snapshot resumed from and the DCP snapshots' blocked times.
``--model ddp`` trains the same net replicated by DistributedDataParallel instead of sharded;
``--n-retains`` is the snapshot's. ``--phase accumulate`` trains the sharded net without dropout
for 2 epochs accumulating gradients over 2 batches (``grad_accumulation_steps``).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import time
from typing import Any

import torch
from ddp_training import dataset  # the DDP script's samples (this script's directory)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import ppe_core as ppe
from ppe_core.distributed import DistributedValidationSampler
from ppe_core.errors import ShardedStateError

BATCH = 4  # per rank; a single process takes 2 * BATCH
STOP_AT = 12


class Net(torch.nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 16),
            torch.nn.Dropout(dropout),
            torch.nn.ReLU(),
            torch.nn.Linear(16, 2),
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


class Average(ppe.training.Extension):
    """Holds (sharded) tensors, e.g. an average of the weights: a custom snapshot target, or
    an extension whose state the manager's snapshot saves."""

    trigger = (1000, "iteration")  # never runs: only its state matters

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __call__(self, manager: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"tensors": self.tensors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tensors = state["tensors"]


def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def sharded_model(dropout: float = 0.0) -> torch.nn.Module:
    """``Net`` with the same initial weights on every rank, sharded over all ranks."""
    torch.manual_seed(0)
    model = ppe.to(Net(dropout), "cpu")
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in model.body:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def replicated_model(dropout: float = 0.0) -> torch.nn.Module:
    """``Net`` with the same initial weights on every rank, wrapped by DDP."""
    torch.manual_seed(0)
    return DistributedDataParallel(ppe.to(Net(dropout), "cpu"))


def full_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole optimizer state (keyed by parameter names) on every rank (a collective)."""
    options = StateDictOptions(full_state_dict=True)
    return dict(get_optimizer_state_dict(model, opt, options=options))


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights on every rank (``full_tensor`` is a collective)."""
    if isinstance(model, DistributedDataParallel):
        return dict(model.module.state_dict())
    return {
        k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()
    }


def loaders() -> tuple[DataLoader[Any], DataLoader[Any]]:
    train, val = dataset()
    sampler: Any = DistributedSampler(train, shuffle=True, seed=1)  # type: ignore[arg-type]
    val_sampler: Any = DistributedValidationSampler(val, shuffle=False)
    return (
        DataLoader(train, batch_size=BATCH, sampler=sampler),  # type: ignore[arg-type]
        DataLoader(val, batch_size=5, sampler=val_sampler),  # type: ignore[arg-type]
    )


def reference(out: str, amp: bool = False) -> dict[str, Any]:
    """2 epochs, no snapshot; with a distributed evaluator unless ``amp`` (then autocast)."""
    model = sharded_model()
    trainer = ppe.engine.create_trainer(
        model,
        optimizer(model),
        2,
        out_dir=out,
        evaluator=None if amp else ppe.engine.create_evaluator(model, distributed=True),
        options={"autocast": amp},
    )
    train_loader, val_loader = loaders()
    if amp:
        trainer.run(train_loader)
        return {"weights": full_weights(model), "iteration": trainer.iteration}
    trainer.run(train_loader, val_loader)
    assert trainer.evaluator is not None
    means = {k: float(v) for k, v in trainer.evaluator.run(val_loader).items()}
    return {"weights": full_weights(model), "means": means, "iteration": trainer.iteration}


def refusals(out: str) -> dict[str, str]:
    """Each snapshot that cannot hold sharded state, expected to refuse: name -> message."""
    E = ppe.training.extensions
    model = sharded_model()
    opt = optimizer(model)
    snapshots = {
        "default": lambda: E.snapshot(autoload=True),
        "distributed": lambda: E.snapshot(saver_rank=0, snapshot_mode=E.SnapshotMode.DISTRIBUTED),
        "object_model": lambda: E.snapshot_object(model, "model_{.iteration}"),
        "object_optimizer": lambda: E.snapshot_object({"optimizer": opt}, "optimizer_{.iteration}"),
    }
    # Neither a module nor an optimizer: its state_dict() is looked into at start.
    average = Average({k: v.detach().clone() for k, v in model.state_dict().items()})
    snapshots["object_custom"] = lambda: E.snapshot_object(average, "average_{.iteration}")
    # In an extension's state (the trained model is a plain one), which the manager's
    # snapshot saves: found only when the state is taken, on the saver (rank 0), at the end
    # of the epoch (the last iteration, so rank 1, which does not save, ends alike: under
    # torchrun, rank 0's error stops every rank).
    snapshots["extension_state"] = lambda: E.snapshot()
    plain = ppe.to(Net(), "cpu")
    messages = {}
    for name, make in snapshots.items():
        if name == "extension_state":
            trained, extensions = (plain, optimizer(plain)), [make(), average]
        else:
            trained, extensions = (model, opt), [make()]
        trainer = ppe.engine.create_trainer(
            *trained, 1, out_dir=os.path.join(out, name), extensions=extensions
        )
        try:
            trainer.run(loaders()[0])
        except ShardedStateError as exc:
            messages[name] = str(exc)
        else:
            messages[name] = "no error"
    return messages


def accumulated(out: str) -> dict[str, Any]:
    """2 epochs without dropout, gradients accumulated over 2 batches (FSDP2's no_sync)."""
    model = sharded_model()
    trainer = ppe.engine.create_trainer(
        model, optimizer(model), 2, out_dir=out, options={"grad_accumulation_steps": 2}
    )
    unreduced: list[bool] = []  # after each window's first batch: no sharded gradient yet

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def record(manager: Any) -> None:
        if manager.iteration % 2 == 1:
            unreduced.append(all(p.grad is None for p in model.parameters()))

    trainer.extend(record)
    trainer.run(loaders()[0])
    return {"weights": full_weights(model), "iteration": trainer.iteration, "unreduced": unreduced}


def snapshotted_run(
    out: str,
    mode: str,
    stop_at: int | None,
    kill_at: int | None = None,
    model_kind: str = "fsdp",
    n_retains: int = -1,
) -> dict[str, Any]:
    """2 epochs with dropout and per-rank seeds, a snapshot every 4 iterations (autoload)."""
    model = replicated_model(0.2) if model_kind == "ddp" else sharded_model(dropout=0.2)
    torch.manual_seed(100 + torch.distributed.get_rank())  # each rank's own dropout masks
    E = ppe.training.extensions
    modes = {
        "default": E.SnapshotMode.DEFAULT,
        "distributed": E.SnapshotMode.DISTRIBUTED,
        "dcp": E.SnapshotMode.DCP,
    }
    snapshot = E.snapshot(
        autoload=True,
        filename="snapshot_{.iteration}",
        saver_rank=0,
        snapshot_mode=modes.get(mode, E.SnapshotMode.SHARDED),
        n_retains=n_retains,
    )
    opt = optimizer(model)
    trainer = ppe.engine.create_trainer(
        model,
        opt,
        2,
        out_dir=out,
        stop_trigger=None if stop_at is None else (stop_at, "iteration"),
    )
    trainer.extend(snapshot, trigger=(4, "iteration"))
    if kill_at is not None:
        trainer.extend(kill_during_save(kill_at), trigger=(kill_at, "iteration"))
    trainer.run(loaders()[0])
    return {
        "weights": full_weights(model),
        "optimizer": full_optimizer_state(model, opt),
        "rng": torch.get_rng_state(),
        "iteration": trainer.iteration,
        "loaded_from": snapshot.loaded_from and os.path.relpath(snapshot.loaded_from, out),
        "blocked_times": getattr(snapshot, "blocked_times", None),
    }


def kill_during_save(kill_at: int) -> Any:
    """An extension SIGKILLing this process at ``kill_at``, while the DCP save of the last
    snapshot before is still in progress (its manifest, written before the rename, is held
    back), as a crash would."""
    from ppe_extensions import _snapshot_dcp_mode

    write_manifest = _snapshot_dcp_mode.write_manifest

    def slow_write_manifest(directory: str, iteration: int, world_size: int) -> None:
        if iteration == kill_at - kill_at % 4:
            time.sleep(60)
        write_manifest(directory, iteration, world_size)

    _snapshot_dcp_mode.write_manifest = slow_write_manifest  # type: ignore[assignment]

    @ppe.training.make_extension(trigger=(kill_at, "iteration"))
    def kill(manager: Any) -> None:
        torch.distributed.barrier()  # both ranks die here, none waiting for the other
        os.kill(os.getpid(), signal.SIGKILL)

    return kill


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    phases = ["first", "resume", "reshard", "load", "kill", "accumulate"]
    parser.add_argument("--phase", choices=phases, default="first")
    modes = ["sharded", "default", "distributed", "dcp"]
    parser.add_argument("--mode", choices=modes, default="sharded")
    parser.add_argument("--model", choices=["fsdp", "ddp"], default="fsdp")
    parser.add_argument("--n-retains", type=int, default=-1)
    args = parser.parse_args()
    world = ppe.distributed.init_from_env("cpu")
    results: dict[str, Any] = {}
    snapshotted = functools.partial(
        snapshotted_run, model_kind=args.model, n_retains=args.n_retains
    )
    if args.phase == "accumulate":
        results["accumulated"] = accumulated(os.path.join(args.out, "accumulated"))
    elif args.phase == "first":
        if args.mode == "sharded":
            results["reference"] = reference(os.path.join(args.out, "reference"))
            results["amp"] = reference(os.path.join(args.out, "amp"), amp=True)
            results["refusals"] = refusals(os.path.join(args.out, "refusals"))
        results["straight"] = snapshotted(os.path.join(args.out, "straight"), args.mode, None)
        results["stopped"] = snapshotted(os.path.join(args.out, "run"), args.mode, STOP_AT)
    elif args.phase == "resume":
        results["resumed"] = snapshotted(os.path.join(args.out, "run"), args.mode, None)
    elif args.phase == "load":  # resumed and stopped at once: the weights as loaded
        results["loaded"] = snapshotted(os.path.join(args.out, "run"), args.mode, STOP_AT)
    elif args.phase == "kill":
        snapshotted(os.path.join(args.out, "run"), args.mode, None, kill_at=STOP_AT - 2)
    else:  # another world size: a sharded snapshot must refuse to resume
        try:
            snapshotted(os.path.join(args.out, "run"), args.mode, None)
        except ShardedStateError as exc:
            results["refusal"] = str(exc)
        else:
            results["refusal"] = "no error"
    torch.save(results, os.path.join(args.out, f"{args.phase}_rank{world.rank}.pt"))


if __name__ == "__main__":
    main()
