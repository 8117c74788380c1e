"""A run that signals itself mid-epoch (used by tests/test_interrupt.py), alone or under torchrun.

Usage: [torchrun --standalone --nproc_per_node=2] interrupted_training.py OUT [--workers N]
    [--signal TERM|INT] [--at ITERATION [ITERATION ...]] [--twice]

Shuffling DataLoader (``--workers`` processes), dropout and Adam; 10 iterations per epoch, 3
epochs, a periodic ``snapshot(autoload=True)`` every 7 iterations. With ``--at``, after the
iteration given (one per rank, else the same for all) an extension has ``kill`` send the signal to
its process group, which holds the DataLoader workers too, as a scheduler's kill does
(``--twice``: a second one after the first was handled); ``--die-at``: rank 1 SIGKILLs
itself after that iteration. Writes ``OUT/final{rank}.pt`` with the weights at the end. The model
and points are small_mlp's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
from typing import Any

import torch
from small_mlp import Net, labelled_points
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ppe_core as ppe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--signal", default="TERM")
    parser.add_argument("--at", type=int, nargs="*", default=[])
    parser.add_argument("--twice", action="store_true")
    parser.add_argument("--die-at", type=int, default=None)  # rank 1 SIGKILLs itself there
    args = parser.parse_args()
    world = ppe.distributed.init_from_env("cpu")
    distributed = ppe.distributed.is_distributed()
    dataset = TensorDataset(*labelled_points(50 * world.world_size))
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    wrapped: torch.nn.Module = DistributedDataParallel(model) if distributed else model
    torch.manual_seed(100 + world.rank)  # each rank's own dropout masks

    sampler: Any = DistributedSampler(dataset, shuffle=True, seed=1) if distributed else None
    loader = DataLoader(
        dataset, batch_size=5, shuffle=sampler is None, sampler=sampler, num_workers=args.workers
    )
    at = args.at[world.rank] if len(args.at) > 1 else (args.at[0] if args.at else None)

    def send(manager: Any) -> None:
        if world.rank == 1 and manager.iteration == args.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if manager.iteration == at:
            # From another process, as a scheduler's: torch's workers ignore their parent's.
            for count in range(2 if args.twice else 1):  # the second after the first's handler
                if count:
                    print("survived the first signal", flush=True)
                subprocess.run(["kill", f"-{args.signal}", "--", f"-{os.getpgid(0)}"])

    E = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.Adam(wrapped.parameters(), lr=0.01),
        3,
        out_dir=args.out,
        extensions=[
            ppe.training.ExtensionEntry(E.snapshot(autoload=True), trigger=(7, "iteration")),
            ppe.training.make_extension(trigger=(1, "iteration"), priority=-1000)(send),
        ],
    )
    trainer.run(loader)
    torch.save(model.state_dict(), os.path.join(args.out, f"final{world.rank}.pt"))


if __name__ == "__main__":
    main()
