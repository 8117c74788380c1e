"""A run logging every iteration and resuming itself (used by the log crash tests).

Usage: python logging_training.py OUT_DIR FILENAME [--iterations N] [--append] [--kill-at N]

``LogReport(trigger=(1, "iteration"), filename=FILENAME)`` (the format follows the suffix),
a snapshot with ``autoload=True`` every 50 iterations, and a key that first appears at
iteration 30 (a CSV log's header grows then). Prints ``iteration N`` after every step, for
the test to kill it at, and ``done`` at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import torch

import ppe_core as ppe

ITERATIONS_PER_EPOCH = 20


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.fc(x), t)
        ppe.reporting.report({"train/loss": loss})
        return loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("filename")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--append", action="store_true", help="LogReport(append=True)")
    parser.add_argument("--kill-at", type=int, help="SIGKILL itself after this iteration")
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g))
        for _ in range(ITERATIONS_PER_EPOCH)
    ]
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def late_key(manager: Any) -> None:
        if manager.iteration >= 30:
            ppe.reporting.report({"late/value": float(manager.iteration)})

    def announce(manager: Any) -> None:
        print(f"iteration {manager.iteration}", flush=True)
        if manager.iteration == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    E = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        args.iterations // ITERATIONS_PER_EPOCH,
        out_dir=args.out,
        extensions=[
            ppe.training.make_extension(
                trigger=(1, "iteration"), priority=ppe.training.PRIORITY_WRITER
            )(late_key),
            E.LogReport(trigger=(1, "iteration"), filename=args.filename, append=args.append),
            ppe.training.ExtensionEntry(
                E.snapshot(autoload=True, n_retains=2), trigger=(50, "iteration")
            ),
            ppe.training.make_extension(trigger=(1, "iteration"), priority=-1000)(announce),
        ],
    )
    trainer.run(data)
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
