"""Two gloo ranks train 2 epochs of 4 iterations with a SnapshotMode.DCP snapshot every 3
iterations that autoloads, for test_resume_messages.py.

Usage: python -m torch.distributed.run --nproc_per_node=2 resume_messages_ddp.py OUT_DIR

Each rank prints ``rank R trained N steps`` at the end. Run again on a finished OUT_DIR, it
resumes from the final snapshot and trains nothing.
"""

from __future__ import annotations

import sys

import torch

import ppe_core as ppe


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.steps += self.training
        return {"loss": (self.fc(x) ** 2).mean()}


def main() -> None:
    world = ppe.distributed.init_from_env("cpu")
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    E = ppe.training.extensions
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 2, out_dir=sys.argv[1]
    )
    snapshot = E.snapshot(
        autoload=True, n_retains=2, saver_rank=0, snapshot_mode=E.SnapshotMode.DCP
    )
    trainer.extend(snapshot, trigger=(3, "iteration"))
    g = torch.Generator().manual_seed(world.rank)
    trainer.run([{"x": torch.randn(4, 2, generator=g)} for _ in range(4)])
    print(f"rank {world.rank} trained {model.steps} steps", flush=True)


if __name__ == "__main__":
    main()
