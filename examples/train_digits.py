"""Handwritten digits: the main example, a classifier trained on real data with ppe-core.

scikit-learn ships the 8x8 handwritten digits data set (1,797 images, 10 classes), so this
runs without a download. A small MLP is trained with ``create_trainer`` and evaluated once per
epoch by ``create_evaluator`` with ``AccuracyMetric``; the run logs (``LogReport``), prints a
table (``PrintReport``), shows progress (``ProgressBar``), decays the learning rate
(``LRScheduler``), plots the loss and accuracy curves (``PlotReport``, PNG files) and
snapshots every epoch with ``autoload=True``, so running the same command again resumes from
the newest snapshot instead of starting over.

Run it (needs the ``examples`` extra: scikit-learn and matplotlib)::

    python examples/train_digits.py --out result/digits --epochs 15

It prints the final validation accuracy (98.05 % with the default seed) after 10-20 s on two
CPU cores. ``--epochs`` larger than a finished run's continues that run from its snapshot.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader, Dataset

import ppe_core as ppe

E = ppe.training.extensions


class DigitsDataset(Dataset[dict[str, torch.Tensor]]):
    """Yields ``{"x": pixels, "t": label}``, so a batch maps onto ``forward``'s arguments."""

    def __init__(self, x: torch.Tensor, t: torch.Tensor) -> None:
        self.x = x
        self.t = t

    def __len__(self) -> int:
        return len(self.t)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "t": self.t[index]}


class Classifier(torch.nn.Module):
    """An MLP over the 64 pixels; returns the loss and the predicted labels.

    The handler reports every scalar output (``train/loss``, ``val/loss``); the predictions
    ``y`` are not scalars, so they are not reported but are what ``AccuracyMetric`` reads.
    """

    def __init__(self, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(scores, t), "y": scores.argmax(dim=1)}


def load_digits_split(
    seed: int = 0, val_fraction: float = 0.2
) -> tuple[DigitsDataset, DigitsDataset]:
    """Loads scikit-learn's digits, scales pixels to [0, 1] and splits them, seeded."""
    from sklearn.datasets import load_digits  # the `examples` extra

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    t = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(t), generator=torch.Generator().manual_seed(seed))
    n_val = int(len(t) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return DigitsDataset(x[train], t[train]), DigitsDataset(x[val], t[val])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="result/digits", help="output directory")
    parser.add_argument("--epochs", type=int, default=15, help="epochs to train in total")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (layers this small run fastest on one)",
    )
    parser.add_argument(
        "--device",
        default=os.environ.get("PPE_DEVICE", "cpu"),
        help='e.g. "cpu", "cuda", or "exampledev" (the example plugin: ppe-core\'s emulated '
        "device, a non-CPU device type in host memory)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    """Trains (or resumes), prints and returns the final validation accuracy."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_set, val_set = load_digits_split(args.seed)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    val_loader = DataLoader(val_set, batch_size=len(val_set))

    model = ppe.to(Classifier(), args.device)  # tag the module with its runtime, and move it
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    # A schedule that does not depend on --epochs, so a longer rerun continues the same curve.
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.85)
    evaluator = ppe.engine.create_evaluator(
        model,
        device=args.device,
        metrics=[ppe.training.metrics.AccuracyMetric("t", "y")],  # reported as val/accuracy
    )
    log_report = E.LogReport()
    snapshot = E.snapshot(autoload=True, n_retains=2)  # one file per epoch, the last two kept
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        args.epochs,
        device=args.device,
        out_dir=args.out,
        evaluator=evaluator,
        extensions=[
            log_report,
            E.observe_lr(optimizer=optimizer),
            E.LRScheduler(scheduler),
            E.ProgressBar(),
            E.PrintReport(["epoch", "iteration", "lr", "train/loss", "val/loss", "val/accuracy"]),
            E.PlotReport(["train/loss", "val/loss"], x_key="epoch", filename="loss.png"),
            E.PlotReport(["val/accuracy"], x_key="epoch", filename="accuracy.png"),
            snapshot,
        ],
    )
    trainer.run(train_loader, val_loader)

    if snapshot.loaded_from is not None:
        print(f"resumed from {snapshot.loaded_from}")
    accuracy = float(log_report.log[-1]["val/accuracy"])
    print(f"final validation accuracy: {accuracy:.4f} (epoch {trainer.epoch})")
    return accuracy


if __name__ == "__main__":
    main()
