"""Two gloo ranks with SnapshotMode.DCP + MLflowLogger(snapshots=True), for test_mlflow_logger.py.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 dcp_shared_out_dir.py URI OUT

First each rank trains into an out_dir of its own (``OUT/apart/rank<r>``: as the local disks of
two nodes, rank 0's holds only its shards), then both into ``OUT/shared``. Each rank writes
``OUT/rank<r>.json``: the error of the first training (or None) and the second's run id and
artifact count.
"""

from __future__ import annotations

import json
import sys

import torch

import ppe_core as ppe
from ppe_core.errors import ConfigurationError
from ppe_core.training import extensions
from ppe_core.training.extension import ExtensionEntry


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def train(uri: str, out_dir: str, experiment: str) -> extensions.MLflowLogger:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    data = [
        {"x": torch.randn(4, 3, generator=generator), "t": torch.randn(4, 1, generator=generator)}
        for _ in range(4)
    ]
    log = extensions.LogReport(trigger=(1, "iteration"), filename="log.json")
    tracker = extensions.MLflowLogger(
        uri, experiment_name=experiment, snapshots=True, sender="thread"
    )
    snap = extensions.snapshot(saver_rank=0, snapshot_mode=extensions.SnapshotMode.DCP)
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        2,
        extensions=[log, tracker, ExtensionEntry(snap, trigger=(4, "iteration"))],
        out_dir=out_dir,
    )
    trainer.run(data)
    return tracker


def main(uri: str, out: str) -> None:
    world = ppe.distributed.init_from_env("cpu")
    error = None
    try:
        train(uri, f"{out}/apart/rank{world.rank}", "dcp-apart")
    except ConfigurationError as exc:
        error = str(exc)
    tracker = train(uri, f"{out}/shared", "dcp-shared")
    with open(f"{out}/rank{world.rank}.json", "w") as file_obj:
        json.dump(
            {
                "error": error,
                "run_id": tracker.run_id,
                "artifacts_sent": tracker.report.artifacts_sent,
            },
            file_obj,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
