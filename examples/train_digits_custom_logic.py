"""Handwritten digits with a custom Logic: gradient accumulation plus gradient clipping.

A Logic is the math of one training step. This example writes one from scratch on the same
data and model as ``train_digits.py``: it accumulates gradients over ``accumulation_steps``
small batches (an effective batch of ``batch_size * accumulation_steps`` without its memory),
clips the global gradient norm before each optimizer step and reports that norm as
``grad_norm``, which LogReport, PrintReport and PlotReport then show like any other value.

(The standard ``Logic`` already accumulates with ``options={"grad_accumulation_steps": N}``;
write a Logic when the step itself is yours: clipping, several models, a GAN, RL, ...)

Run it (needs the ``examples`` extra)::

    python examples/train_digits_custom_logic.py --out result/digits_custom --epochs 15
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader
from train_digits import Classifier, load_digits_split

import ppe_core as ppe

E = ppe.training.extensions


class AccumulateClipLogic(ppe.handler.BaseLogic):
    """Accumulates gradients over a window of batches, clips their norm, then steps.

    Each batch's loss is divided by the size of its window, so one update equals a step on
    the window's concatenated batches. The last window of an epoch may be shorter; it still
    ends with a step, inside the epoch's last ``train_step``, so a snapshot taken at the end
    of the epoch holds every update and a resumed run continues exactly.

    Args:
        accumulation_steps: Batches per optimizer step.
        max_norm: The global gradient norm is clipped to this before each step.
        model_name: Key of the model and of its optimizer in the trainer.
    """

    def __init__(
        self, accumulation_steps: int = 4, max_norm: float = 1.0, model_name: str = "main"
    ) -> None:
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        super().__init__()
        self.accumulation_steps = accumulation_steps
        self.max_norm = max_norm
        self.model_name = model_name
        self._epoch_length = 0

    def train_epoch_begin(
        self, models: Mapping[str, torch.nn.Module], epoch: int, loader: Iterable[Any]
    ) -> None:
        """Puts the model in train mode and notes the epoch's length (for the last window)."""
        models[self.model_name].train()
        self._epoch_length = len(loader)  # type: ignore[arg-type]

    def _window(self, batch_idx: int) -> tuple[int, bool]:
        """The size of ``batch_idx``'s window, and whether ``batch_idx`` ends it."""
        n = self.accumulation_steps
        start = batch_idx - batch_idx % n
        size = min(n, self._epoch_length - start)
        return size, batch_idx == start + size - 1

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        """Adds this batch's gradients; on a window's last batch clips and steps."""
        model = models[self.model_name]
        optimizer = optimizers[self.model_name]
        if batch_idx % self.accumulation_steps == 0:
            optimizer.zero_grad()
        outputs = model(**batch)
        size, ends = self._window(batch_idx)
        (outputs["loss"] / size).backward()
        if ends:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_norm)
            ppe.reporting.report({"grad_norm": norm})  # stays a tensor: no sync per step
            optimizer.step()
        return outputs

    def eval_step(self, models: Mapping[str, torch.nn.Module], batch_idx: int, batch: Any) -> Any:
        """Forward only (the evaluator calls it under ``torch.no_grad``)."""
        return models[self.model_name](**batch)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="result/digits_custom", help="output directory")
    parser.add_argument("--epochs", type=int, default=15, help="epochs to train in total")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accumulation-steps", type=int, default=4)
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    parser.add_argument("--device", default=os.environ.get("PPE_DEVICE", "cpu"))
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

    model = ppe.to(Classifier(), args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    log_report = E.LogReport()
    snapshot = E.snapshot(autoload=True, n_retains=2)
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        args.epochs,
        device=args.device,
        out_dir=args.out,
        logic=AccumulateClipLogic(args.accumulation_steps, args.max_norm),
        evaluator=ppe.engine.create_evaluator(
            model,
            device=args.device,
            metrics=[ppe.training.metrics.AccuracyMetric("t", "y")],
        ),
        extensions=[
            log_report,
            E.LRScheduler(torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.85)),
            E.ProgressBar(),
            E.PrintReport(["epoch", "iteration", "train/loss", "grad_norm", "val/accuracy"]),
            E.PlotReport(["grad_norm"], x_key="epoch", filename="grad_norm.png"),
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
