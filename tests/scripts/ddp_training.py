"""Data-parallel training under torchrun (gloo on CPU), used by tests/test_distributed.py.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_training.py OUT
Each rank writes OUT/rank{N}.pt with its final weights and its evaluator means.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import ppe_core as ppe


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = [{"x": x[i], "t": (x[i, 0] > 0).long()} for i in range(64)]
    val = data[:36]  # 18 per rank: ranks see different batches with different means
    torch.manual_seed(0)  # the same initial weights on every rank
    model = ppe.to(Net(), "cpu")
    ddp = DistributedDataParallel(model)
    E = ppe.training.extensions
    extensions = [E.snapshot(saver_rank=0, filename="snapshot_{.iteration}")]
    if rank == 0:
        extensions.append(E.LogReport())
    trainer = ppe.engine.create_trainer(
        ddp,
        torch.optim.SGD(ddp.parameters(), lr=0.1),
        3,
        out_dir=out,
        extensions=extensions,
        evaluator=ppe.engine.create_evaluator(ddp, distributed=True),
        options={"grad_accumulation_steps": 2},
    )
    sampler = DistributedSampler(data, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=4, sampler=sampler)  # type: ignore[arg-type]
    val_loader = DataLoader(val, batch_size=6, sampler=DistributedSampler(val, shuffle=False))  # type: ignore[arg-type]
    trainer.run(loader, val_loader)
    means = trainer.evaluator.run(val_loader) if trainer.evaluator else {}
    torch.save(
        {"weights": model.state_dict(), "means": means, "iterations": trainer.iteration},
        os.path.join(out, f"rank{rank}.pt"),
    )
    dist.barrier()  # every rank done with collectives before the group is torn down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
