"""Training with per-rank randomness, alone or under torchrun (gloo): used to test bit-exact
distributed resume (tests/test_distributed_resume.py).

Usage: [python -m torch.distributed.run --standalone --nproc_per_node=2] ddp_resume.py OUT
    [--epochs N] [--stop-at ITERATION]

Every rank draws its own random numbers: the model has dropout, the dataset adds noise drawn
from torch, numpy and Python's ``random`` in ``__getitem__`` (for training and validation),
the validation set of 101 samples splits unevenly (51 and 50), and each rank reseeds all three
generators with its rank after the (shared) model initialization. A snapshot is taken every 4
iterations (8 per epoch) with autoload. Writes ``OUT/rank{N}.pt``: the final weights, the log's
entries (without elapsed times), the final RNG states, and the snapshot the run resumed from.
"""

from __future__ import annotations

import argparse
import os
import random
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ppe_core as ppe
from ppe_core.distributed import DistributedValidationSampler

N_TRAIN, N_VAL = 64, 101


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


class NoisySamples(Dataset[dict[str, torch.Tensor]]):
    """Fixed samples plus noise drawn, per access, from torch, numpy and ``random``."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.t = (x[:, 0] + 0.5 * x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        noise = 0.1 * torch.randn(4) + float(np.random.normal(0, 0.1)) + random.gauss(0, 0.1)
        return {"x": self.x[i] + noise, "t": self.t[i]}


def datasets() -> tuple[NoisySamples, NoisySamples]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_TRAIN + N_VAL, 4, generator=g)
    return NoisySamples(x[:N_TRAIN]), NoisySamples(x[N_TRAIN:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--stop-at", type=int, default=None)
    args = parser.parse_args()
    world = ppe.distributed.init_from_env("cpu")
    distributed = ppe.distributed.is_distributed()
    train, val = datasets()
    torch.manual_seed(0)  # the same initial weights on every rank ...
    model = ppe.to(Net(), "cpu")
    wrapped: torch.nn.Module = DistributedDataParallel(model) if distributed else model
    # ... then each rank's own random numbers (dropout masks, the datasets' noise).
    torch.manual_seed(100 + world.rank)
    np.random.seed(200 + world.rank)
    random.seed(300 + world.rank)
    E = ppe.training.extensions
    snapshot = E.snapshot(autoload=True, filename="snapshot_{.iteration}")
    log = E.LogReport()
    stop = None if args.stop_at is None else (args.stop_at, "iteration")
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9),
        args.epochs,
        out_dir=args.out,
        stop_trigger=stop,
        extensions=[log],
        evaluator=ppe.engine.create_evaluator(wrapped, distributed=distributed),
    )
    trainer.extend(snapshot, trigger=(4, "iteration"))
    if distributed:
        sampler: Any = DistributedSampler(train, shuffle=True, seed=1)
        loader = DataLoader(train, batch_size=4, sampler=sampler)
        val_loader = DataLoader(val, batch_size=10, sampler=DistributedValidationSampler(val))
    else:
        loader = DataLoader(train, batch_size=4, shuffle=True)
        val_loader = DataLoader(val, batch_size=10)
    trainer.run(loader, val_loader)
    torch.save(
        {
            "weights": model.state_dict(),
            "log": [{k: v for k, v in entry.items() if k != "elapsed_time"} for entry in log.log],
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": torch.from_numpy(np.random.get_state()[1].astype("int64")),
                "python": torch.tensor(random.getstate()[1]),
            },
            "iteration": trainer.iteration,
            "loaded_from": snapshot.loaded_from and os.path.basename(snapshot.loaded_from),
        },
        os.path.join(args.out, f"rank{world.rank}.pt"),
    )
    if distributed:
        ppe.distributed.barrier()  # every rank done with collectives before the group goes
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
