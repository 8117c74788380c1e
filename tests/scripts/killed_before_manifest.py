"""A run SIGKILLed between a snapshot's data file and its manifest (used by the leftovers tests).

Usage: python killed_before_manifest.py OUT_DIR EPOCHS [KILL_AT]

Snapshots every 2 iterations (2 per epoch) with ``n_retains=2`` and autoload, through a
writer on a file system that hands every call to the local one, except that it SIGKILLs its
own process when asked to rename the manifest of ``snapshot_iter_<KILL_AT>`` into place: the
moment after the data file was renamed into place and before its manifest exists.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import IO, Any

import torch

import ppe_core as ppe


class KillingFS:
    def __init__(self, kill_at: int) -> None:
        self.victim = f".snapshot_iter_{kill_at}.manifest.json" if kill_at else None

    def open(self, file_path: str, mode: str = "rb") -> IO[Any]:
        return open(file_path, mode)

    def makedirs(self, file_path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        os.makedirs(file_path, mode, exist_ok)

    def exists(self, file_path: str) -> bool:
        return os.path.exists(file_path)

    def rename(self, src: str, dst: str) -> None:
        if os.path.basename(dst) == self.victim:
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace(src, dst)

    def remove(self, file_path: str, recursive: bool = False) -> None:
        os.remove(file_path)


class Loss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.fc(x).square().mean()}


def main() -> None:
    out, epochs = sys.argv[1], int(sys.argv[2])
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    torch.manual_seed(0)
    model = ppe.to(Loss(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        epochs,
        out_dir=out,
        writer=ppe.writing.SimpleWriter(fs=KillingFS(kill_at)),
        extensions=[
            ppe.training.ExtensionEntry(
                ppe.training.extensions.snapshot(autoload=True, n_retains=2),
                trigger=(2, "iteration"),
            )
        ],
    )
    g = torch.Generator().manual_seed(0)
    trainer.run([{"x": torch.randn(2, 3, generator=g)} for _ in range(2)])


if __name__ == "__main__":
    main()
