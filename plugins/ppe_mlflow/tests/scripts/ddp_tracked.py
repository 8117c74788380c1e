"""Two gloo ranks train with LogReport + MLflowLogger, for test_mlflow_logger.py.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_tracked.py URI OUT

Each rank trains 8 iterations of a DDP-wrapped Linear and writes ``OUT/rank<r>.json`` with
its LogReport's entries and its tracker's report (only rank 0's tracker may have sent any).
"""

from __future__ import annotations

import json
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

import ppe_core as ppe
from ppe_core.training import extensions


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def main(uri: str, out: str) -> None:
    world = ppe.distributed.init_from_env("cpu")
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + world.rank)
    data = [
        {"x": torch.randn(4, 3, generator=generator), "t": torch.randn(4, 1, generator=generator)}
        for _ in range(4)
    ]
    log = extensions.LogReport(trigger=(1, "iteration"), filename="log.json")
    tracker = extensions.MLflowLogger(uri, experiment_name="ddp")
    trainer = ppe.engine.create_trainer(
        wrapped, optimizer, 2, extensions=[log, tracker], out_dir=f"{out}/run"
    )
    trainer.run(data)
    report = tracker.report
    with open(f"{out}/rank{world.rank}.json", "w") as file_obj:
        json.dump(
            {
                "log": log.log,
                "queued": report.queued,
                "sent": report.sent,
                "run_id": tracker.run_id,
                "report": str(report),
            },
            file_obj,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
