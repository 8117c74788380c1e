"""Trains 20 iterations (LogReport every iteration, a snapshot every 10, autoloaded) with an
MLflowLogger, for test_mlflow_logger.py; with a kill iteration, dies there by SIGKILL.

Usage: python killed_at_13.py URI OUT SENDER KILL_AT SENT_BEFORE_KILL

The logger sends batches of 8 and never for time alone (``send_interval=600``): before the
kill the script waits until the backend got ``SENT_BEFORE_KILL`` entries (0 or 8), so the
entries after them were handed to the queue and never sent. Prints a JSON line: the run id,
the report's counts and every warning raised.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from typing import Any

import torch
from ppe_mlflow import MLflowLogger

import ppe_core as ppe
from ppe_core.training import extensions
from ppe_core.training.extension import ExtensionEntry, make_extension


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def main(uri: str, out: str, sender: str, kill_at: int, sent_before_kill: int) -> None:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logger = MLflowLogger(
        uri, experiment_name=f"killed-13-{sender}", sender=sender, batch_size=8, send_interval=600
    )

    @make_extension(trigger=(1, "iteration"), priority=0)
    def kill(manager: Any) -> None:
        if manager.iteration == kill_at:
            while logger.report.sent < sent_before_kill:
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)

    snapshot = ExtensionEntry(extensions.snapshot(autoload=True), trigger=(10, "iteration"))
    log = extensions.LogReport(trigger=(1, "iteration"))
    trainer = ppe.engine.create_trainer(
        model, optimizer, 2, extensions=[log, logger, snapshot, kill], out_dir=out
    )
    generator = torch.Generator().manual_seed(1)
    data = [
        {"x": torch.randn(4, 3, generator=generator), "t": torch.randn(4, 1)} for _ in range(10)
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.run(data)
    report = logger.report
    print(
        json.dumps(
            {
                "run_id": logger.run_id,
                "sent": report.sent,
                "skipped": report.skipped,
                "dropped": report.dropped,
                "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
