"""A SnapshotMode.DCP snapshot into a directory on a nearly full file system.

Usage: python dcp_full_disk.py OUT_DIR STORE [filled]   (OUT_DIR on a 1 MiB tmpfs; the state
is about 2 MB; STORE: a file for the one-process gloo group, elsewhere; ``filled``: the disk is
filled before training, so that even the small rank file, written before DCP's shards, fails)

Trains one process with a DCP snapshot at iteration 2 and prints ``error: <class>: <message>``
for the error the run raised, then ``leftovers: <what is left in OUT_DIR>`` (the filler aside).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import ppe_core as ppe


class Wide(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(400, 400)  # 640 KB of weights, twice that in Adam's state

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.fc(x).square().mean()}


def fill_disk(filler: str) -> Any:
    @ppe.training.make_extension(trigger=(1, "iteration"))
    def fill(manager: Any) -> None:
        if os.path.exists(filler):
            return
        with open(filler, "wb", buffering=0) as f:
            try:
                while f.write(b"\0" * 512):
                    pass
            except OSError:  # ENOSPC: the disk is full
                pass

    return fill


def main() -> None:
    out, store = sys.argv[1], sys.argv[2]
    filler = os.path.join(out, "filler")
    dist.init_process_group("gloo", init_method=f"file://{store}", world_size=1, rank=0)
    E = ppe.training.extensions
    torch.manual_seed(0)
    model = ppe.to(Wide(), "cpu")
    trainer = ppe.engine.create_trainer(
        model, torch.optim.Adam(model.parameters(), lr=0.01), 1, out_dir=out
    )
    trainer.extend(
        E.snapshot(saver_rank=0, snapshot_mode=E.SnapshotMode.DCP), trigger=(2, "iteration")
    )
    if sys.argv[3:] == ["filled"]:
        # At iteration 1 (the run's lock file written at start), before the snapshot of 2.
        trainer.extend(fill_disk(filler), trigger=(1, "iteration"))
    try:
        trainer.run([{"x": torch.randn(2, 400)} for _ in range(4)])
    except BaseException as exc:
        print(f"error: {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
    else:
        print("error: none", flush=True)
    print(f"leftovers: {sorted(set(os.listdir(out)) - {'filler'})}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
