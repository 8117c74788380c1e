"""Gradient accumulation with snapshots inside the windows, alone or under torchrun (gloo):
used to test that a resume equals the uninterrupted run (tests/test_accumulation_resume.py).

Usage: [python -m torch.distributed.run --standalone --nproc_per_node=2]
    accumulation_training.py OUT [OUT ...] [--model plain|ddp|fsdp] [--kill-at ITERATION]

2 epochs of 10 batches with ``grad_accumulation_steps=4`` (windows of 4, 4 and 2 batches) and
a snapshot every 3 iterations with autoload, so most snapshots fall inside a window. The model
has dropout and the dataset adds noise from the global RNG; under torchrun each rank reseeds
with its rank after the (shared) initialization and reads its own DistributedSampler part.
``--model ddp`` wraps the net in DistributedDataParallel (``no_sync`` windows), ``--model
fsdp`` shards it with FSDP2 (``SnapshotMode.DCP``). ``--kill-at N`` SIGKILLs every process at
iteration N, once the last snapshot is on disk (a DCP save finishes in the background).
Several OUTs are trained one after the other in the same processes (fewer launches). Writes
``OUT/rank{N}.pt``: the final (full) weights, the iteration and the snapshot resumed from.
"""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ppe_core as ppe

WINDOW = 4
SNAPSHOT_EVERY = 3


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


class Noisy(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.t = (self.x[:, 0] - self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i] + 0.1 * torch.randn(4), "t": self.t[i]}


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    weights = getattr(model, "module", model).state_dict()
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in weights.items()}


def train(out: str, model_kind: str, kill_at: int | None) -> None:
    """One run in ``out`` (resumed from its newest snapshot), writing ``out/rank{N}.pt``."""
    distributed = ppe.distributed.is_distributed()
    world_size, rank = ppe.distributed.get_world_size(), ppe.distributed.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank ...
    net = ppe.to(Net(), "cpu")
    model: torch.nn.Module = net
    E = ppe.training.extensions
    mode = E.SnapshotMode.DEFAULT
    if model_kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(net)
    elif model_kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world_size,))
        for layer in net.body:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
        mode = E.SnapshotMode.DCP
    torch.manual_seed(100 + rank)  # ... then each rank's own dropout masks and noise
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.02),
        2,
        out_dir=out,
        options={"grad_accumulation_steps": WINDOW},
    )
    snapshot = E.snapshot(
        autoload=True, filename="snapshot_{.iteration}", saver_rank=0, snapshot_mode=mode
    )
    trainer.extend(snapshot, trigger=(SNAPSHOT_EVERY, "iteration"))
    if kill_at is not None:

        @ppe.training.make_extension(trigger=(kill_at, "iteration"), priority=-1000)
        def kill(manager: Any) -> None:
            snapshot._wait_in_flight()  # a DCP save finishes in the background: wait for it
            if distributed:
                torch.distributed.barrier()  # every rank dies here, none waiting for another
            os.kill(os.getpid(), signal.SIGKILL)

        trainer.extend(kill)
    data = Noisy(40 if distributed else 20)
    sampler: Any = DistributedSampler(data, shuffle=True, seed=1) if distributed else None
    loader = DataLoader(data, batch_size=2, sampler=sampler, shuffle=sampler is None)
    trainer.run(loader)
    torch.save(
        {
            "weights": full_weights(model),
            "iteration": trainer.iteration,
            "loaded_from": snapshot.loaded_from and os.path.relpath(snapshot.loaded_from, out),
        },
        os.path.join(out, f"rank{rank}.pt"),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="+")
    parser.add_argument("--model", choices=["plain", "ddp", "fsdp"], default="plain")
    parser.add_argument("--kill-at", type=int, default=None)
    args = parser.parse_args()
    ppe.distributed.init_from_env("cpu")
    for out in args.out:  # one after the other, in these processes
        train(out, args.model, args.kill_at)
    if ppe.distributed.is_distributed():
        ppe.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
