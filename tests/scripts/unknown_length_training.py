"""Training on a loader without ``len()`` that snapshots and resumes itself (crash tests).

Usage: python unknown_length_training.py OUT_DIR [--loader plain|stateful] [--workers N]

The dataset is an ``IterableDataset`` (9 batches per epoch, which the trainer learns when the
first epoch runs out) that draws its order and per-sample noise from the global torch RNG;
the model has dropout and Adam. Snapshots every 4 iterations fall inside epochs, the first
ones while the epoch length is still unknown. ``--loader stateful`` reads it through
torchdata's ``StatefulDataLoader``, whose own state is saved and restored. Prints
``iteration N`` after every step and writes ``final.pt`` (weights) and the log at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
from small_mlp import Net, labelled_points

import ppe_core as ppe

SAMPLES = 43  # 9 batches of 5 (the last one of 3)


class Stream(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """Samples in an order drawn at each iter() from the global RNG, each with fresh noise."""

    def __init__(self, seed: int) -> None:
        self.x, self.t = labelled_points(SAMPLES, seed)
        self._order: list[int] = []
        self._position = 0
        self._resume: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._resume is not None:  # a loaded position (StatefulDataLoader's resume)
            order, start = self._resume["order"], self._resume["position"]
            self._resume = None
        else:
            order, start = torch.randperm(SAMPLES).tolist(), 0
            info = torch.utils.data.get_worker_info()
            if info is not None:  # each worker yields its share
                order = order[info.id :: info.num_workers]
        self._order = order
        for position in range(start, len(order)):
            i = order[position]
            self._position = position + 1  # the next to yield, while this one is out
            yield {"x": self.x[i] + 0.1 * torch.randn(6), "t": self.t[i]}

    # torchdata's Stateful protocol: StatefulDataLoader saves and restores the position.
    def state_dict(self) -> dict[str, Any]:
        return {"order": list(self._order), "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = dict(state)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--loader", choices=["plain", "stateful"], default="plain")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader: Any
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(Stream(0), batch_size=5, num_workers=args.workers)
    else:
        loader = torch.utils.data.DataLoader(Stream(0), batch_size=5, num_workers=args.workers)
    val_loader = torch.utils.data.DataLoader(Stream(1), batch_size=10)  # no len() either

    def announce(manager: Any) -> None:
        print(f"iteration {manager.iteration}", flush=True)

    E = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        args.epochs,
        out_dir=args.out,
        evaluator=ppe.engine.create_evaluator(model),
        extensions=[
            E.LogReport(),
            ppe.training.ExtensionEntry(
                E.snapshot(autoload=True, n_retains=2), trigger=(4, "iteration")
            ),
            ppe.training.make_extension(trigger=(1, "iteration"), priority=-1000)(announce),
        ],
    )
    trainer.run(loader, val_loader)
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
    print("done", trainer.manager.iters_per_epoch, flush=True)


if __name__ == "__main__":
    sys.exit(main())
