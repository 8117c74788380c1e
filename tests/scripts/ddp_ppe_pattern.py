"""PPE's own DDP example pattern (pytorch-pfn-extras' example/mnist_ddp.py) on ppe-core,
with synthetic data: run under torchrun (gloo) by tests/test_distributed_resume.py.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_ppe_pattern.py OUT
    [--mode default|distributed] [--autoload]

Every rank builds an ``ExtensionsManager`` and trains in a hand-written
``with manager.run_iteration():`` loop; rank 0's manager has the extensions (a LogReport and a
snapshot, without ``saver_rank`` in the default mode), the other ranks' have none. Writes
``OUT/rank{N}.pt`` with the final weights and iteration.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader, DistributedSampler

import ppe_core as ppe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mode", choices=["default", "distributed"], default="default")
    parser.add_argument("--autoload", action="store_true")
    args = parser.parse_args()
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 4, generator=g)
    samples = [(x[i], (x[i, 0] > 0).long()) for i in range(len(x))]
    loader = DataLoader(samples, batch_size=8, sampler=DistributedSampler(samples, seed=0))  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = ppe.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    E = ppe.training.extensions
    if rank == 0:
        if args.mode == "default":
            snapshot = E.snapshot(autoload=args.autoload)
        else:
            snapshot = E.snapshot(saver_rank=0, snapshot_mode=E.SnapshotMode.DISTRIBUTED)
        my_extensions = [E.LogReport(), snapshot]
    else:
        my_extensions = []
    manager = ppe.training.ExtensionsManager(
        model,
        optimizer,
        3,
        extensions=my_extensions,
        iters_per_epoch=len(loader),
        out_dir=args.out,
    )
    while not manager.stop_trigger:
        for data, target in loader:
            with manager.run_iteration(step_optimizers=["main"]):
                loss = torch.nn.functional.cross_entropy(model(data), target)
                ppe.reporting.report({"train/loss": loss.item()})
                loss.backward()
    torch.save(
        {"weights": model.module.state_dict(), "iteration": manager.iteration},
        os.path.join(args.out, f"rank{rank}.pt"),
    )
    torch.distributed.barrier()  # as PPE's example: wait for every process to finish
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
