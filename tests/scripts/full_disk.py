"""Snapshots into a directory on a nearly full file system (used by the leftovers tests).

Usage: python full_disk.py OUT_DIR   (OUT_DIR on a 1 MiB tmpfs; the state is about 2 MB)

Trains with the synchronous writer, then with a ThreadWriter, each snapshotting at iteration
2, and prints ``<writer>: <error class>: <message>`` for the error each run raised.
"""

from __future__ import annotations

import os
import sys

import torch

import ppe_core as ppe


class Wide(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(400, 400)  # 640 KB of weights, twice that in Adam's state

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.fc(x).square().mean()}


def run(out: str, writer: ppe.writing.Writer) -> None:
    torch.manual_seed(0)
    model = ppe.to(Wide(), "cpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        1,
        out_dir=out,
        writer=writer,
        extensions=[
            ppe.training.ExtensionEntry(
                ppe.training.extensions.snapshot(), trigger=(2, "iteration")
            )
        ],
    )
    trainer.run([{"x": torch.randn(2, 400)} for _ in range(4)])


def main() -> None:
    out = sys.argv[1]
    for name, writer in (
        ("simple", ppe.writing.SimpleWriter()),
        ("thread", ppe.writing.ThreadWriter()),
    ):
        try:
            run(os.path.join(out, name), writer)
        except Exception as exc:
            print(f"{name}: {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        else:
            print(f"{name}: no error", flush=True)
        leftovers = [n for _, _, names in os.walk(out) for n in names if n.endswith(".tmp")]
        print(f"{name} leftovers: {leftovers}", flush=True)


if __name__ == "__main__":
    main()
