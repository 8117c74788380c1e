"""``ppe.distributed``'s public names for the rank checks and collectives the core uses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ppe_core as ppe
from ppe_core.distributed import _env


def test_group_world_answers_for_the_group_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launched but without a group, the process shares nothing: it is a world of its own for
    the extensions (it writes its snapshots and log), while get_rank reads the launcher's."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    d = ppe.distributed
    assert not d.is_distributed()
    assert (d.get_world_size(), d.get_rank()) == (2, 1)
    assert d.group_world() == (1, 0)


def test_a_launched_process_without_a_group_writes_its_snapshots_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    model = ppe.to(torch.nn.Linear(2, 1), "cpu")

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            loss = self.model(x).pow(2).mean()
            ppe.reporting.report({"loss": loss})
            return {"loss": loss}

    wrapped = ppe.to(Loss(), "cpu")
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.1),
        1,
        out_dir=str(tmp_path),
        extensions=[ppe.training.extensions.LogReport(trigger=(2, "iteration"))],
    )
    trainer.extend(ppe.training.extensions.snapshot(), trigger=(2, "iteration"))
    trainer.run([{"x": torch.ones(3, 2)}] * 4)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "log",
        "snapshot_iter_2",
        "snapshot_iter_4",
    ]


def test_the_collective_helpers_are_public_and_the_private_names_stay() -> None:
    assert ppe.distributed.run_collective is _env.run_collective
    assert ppe.distributed.timeout_error is _env.timeout_error
    error = ppe.distributed.timeout_error(RuntimeError("Timed out waiting 30ms"), "testing")
    assert isinstance(error, ppe.distributed.CollectiveTimeoutError)
