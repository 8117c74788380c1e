"""A run with ``snapshot_on_error=True`` whose loader fails once (used by the leftovers tests).

Usage: python error_resume_training.py OUT_DIR [--writer simple|thread] [--fail-at N --marker F]

The dataset draws random augmentation from the global torch RNG, the loader shuffles, the
model uses dropout: any RNG state advanced by the failed loader call shows in the final
weights. With ``--fail-at N`` the N-th sample fetch of this process raises, unless the file
``--marker`` exists (it is created then), so only the first run fails. Snapshots every 7
iterations of 10-iteration epochs; writes ``final.pt`` with the weights at the end. The model
and points are small_mlp's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from small_mlp import Net, labelled_points

import ppe_core as ppe


class FlakyNoisy(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, fail_at: int, marker: Path | None) -> None:
        self.x, self.t = labelled_points(50)
        self.fail_at, self.marker, self.calls = fail_at, marker, 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        noise = 0.1 * torch.randn(6)  # drawn before the failure: the RNG moves on regardless
        self.calls += 1
        if self.calls == self.fail_at and self.marker is not None and not self.marker.exists():
            self.marker.touch()
            raise OSError(f"simulated read error at sample fetch {self.calls}")
        return {"x": self.x[i] + noise, "t": self.t[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--writer", choices=["simple", "thread"], default="simple")
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--marker", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        FlakyNoisy(args.fail_at, args.marker), batch_size=5, shuffle=True
    )
    writer = ppe.writing.ThreadWriter() if args.writer == "thread" else ppe.writing.SimpleWriter()
    E = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        3,
        out_dir=args.out,
        writer=writer,
        extensions=[
            ppe.training.ExtensionEntry(
                E.snapshot(autoload=True, n_retains=2, snapshot_on_error=True),
                trigger=(7, "iteration"),
            ),
        ],
    )
    trainer.run(loader)
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))


if __name__ == "__main__":
    sys.exit(main())
