"""Trainer at a glance: the main example the README's first command runs.

A small classifier on synthetic data, trained for 10 epochs on the device named by the
PPE_DEVICE environment variable (default "cpu"; "auto" asks the installed plugins), with a
progress bar, a log file (result/log) and a printed table, evaluated once per epoch.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader, Dataset

import ppe_core as ppe


class Model(torch.nn.Module):
    """Takes keyword inputs from the batch and returns a dict holding its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.LazyLinear(32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.net(x)
        return {
            "loss": torch.nn.functional.cross_entropy(y, t),
            "accuracy": (y.argmax(dim=1) == t).float().mean(),
        }


class DictDataset(Dataset[dict[str, torch.Tensor]]):
    """Yields ``{"x": ..., "t": ...}`` so batches map onto ``forward``'s keyword arguments."""

    def __init__(self, x: torch.Tensor, t: torch.Tensor) -> None:
        self.x = x
        self.t = t

    def __len__(self) -> int:
        return len(self.t)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "t": self.t[index]}


def make_loader(n: int, seed: int, shuffle: bool) -> DataLoader[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    t = ((x[:, 0] + x[:, 1] * x[:, 2]) > 0).long()
    return DataLoader(DictDataset(x, t), batch_size=32, shuffle=shuffle, generator=g)


def main() -> None:
    device = os.environ.get("PPE_DEVICE", "cpu")
    torch.manual_seed(0)
    model = Model()
    ppe.to(model, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    extensions = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        10,
        device=device,
        evaluator=ppe.engine.create_evaluator(model, device=device, progress_bar=True),
        extensions=[
            extensions.LogReport(),
            extensions.ProgressBar(),
            extensions.PrintReport(
                ["epoch", "iteration", "train/loss", "val/loss", "val/accuracy"]
            ),
        ],
    )
    trainer.run(make_loader(1024, seed=0, shuffle=True), make_loader(256, seed=1, shuffle=False))


if __name__ == "__main__":
    main()
