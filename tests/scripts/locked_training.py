"""A run that can pause while it holds its output directory (used by test_run_lock.py).

Usage: [python -m torch.distributed.run --standalone --nproc_per_node=2] locked_training.py OUT
       [--hold FILE] [--workers N]

Trains a small model for 2 epochs with a LogReport and an autoloading snapshot in OUT, alone
or data-parallel under torchrun (gloo). With ``--hold FILE`` every rank prints
``holding rank=R pid=P`` after the first iteration and waits until FILE exists, so a test can
start a second run (or kill this one) while this run is training. Prints ``done`` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import ppe_core as ppe


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--hold", default=None)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    world = ppe.distributed.init_from_env("cpu")
    distributed = ppe.distributed.is_distributed()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    data = [{"x": x[i], "t": (x[i, 0] > 0).long()} for i in range(32)]
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    wrapped: torch.nn.Module = DistributedDataParallel(model) if distributed else model
    sampler: Any = DistributedSampler(data, seed=1) if distributed else None  # type: ignore[arg-type]
    loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=args.workers)  # type: ignore[arg-type]

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def hold(manager: Any) -> None:
        if args.hold is None or manager.iteration != 1:
            return
        # One write(2) of a short line: the ranks of a torchrun job share this pipe, and
        # print() may split a line into two writes that the other rank's output splits.
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), f"holding rank={world.rank} pid={os.getpid()}\n".encode())
        deadline = time.monotonic() + 120
        while not os.path.exists(args.hold):
            if time.monotonic() > deadline:
                sys.exit(4)
            time.sleep(0.05)

    E = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.1),
        2,
        out_dir=args.out,
        extensions=[E.LogReport(trigger=(1, "epoch")), hold],
    )
    trainer.extend(E.snapshot(autoload=True), trigger=(1, "epoch"))
    trainer.run(loader)
    print("done", flush=True)
    if distributed:
        ppe.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
