"""A training run that snapshots every 7 iterations and resumes itself (used by the crash tests).

Usage: python resumable_training.py OUT_DIR [--workers N]

Everything that can make two runs differ is switched on: a shuffling DataLoader drawing from
the global RNG, random augmentation in the dataset (global torch RNG), dropout, Python's
``random`` in the forward pass, numpy noise, and Adam. Prints ``iteration N`` after every
step (for the test to kill it at) and writes ``final.pt`` with the weights at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Any

import numpy as np
import torch

import ppe_core as ppe


class Noisy(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(50, 6, generator=g)
        self.t = (self.x.sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i] + 0.1 * torch.randn(6), "t": self.t[i]}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        scale = 1.0 + 0.01 * random.random() + 0.01 * float(np.random.rand())
        y = self.body(x * scale)
        return {"loss": torch.nn.functional.cross_entropy(y, t)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        Noisy(), batch_size=5, shuffle=True, num_workers=args.workers
    )  # 10 iterations per epoch; snapshots every 7 fall inside epochs

    def announce(manager: Any) -> None:
        print(f"iteration {manager.iteration}", flush=True)

    E = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        args.epochs,
        out_dir=args.out,
        extensions=[
            E.LogReport(trigger=(5, "iteration")),
            ppe.training.ExtensionEntry(
                E.snapshot(autoload=True, n_retains=2), trigger=(7, "iteration")
            ),
            ppe.training.make_extension(trigger=(1, "iteration"), priority=-1000)(announce),
        ],
    )
    trainer.run(loader)
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
