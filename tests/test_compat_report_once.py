"""A key is observed once per step: a model's own report wins over the Handler's automatic one.

PPE's "Trainer and Evaluator" guide has the model report ``{f"{prefix}/loss": loss.item()}``
and return ``{"loss": loss}``; PPE's default report keys are empty, so the log holds the
model's Python floats. ppe-core reports every scalar output by default; it must leave a key the
step already reported alone, so the guide's script (``tests/compat_scripts/trainer_guide.py``)
logs exactly PPE's values, also when the model's value differs from the returned loss.
"""

from __future__ import annotations

import json
import runpy
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core as ppe

pytest.importorskip("pytorch_pfn_extras")

SCRIPT = Path(__file__).parent / "compat_scripts" / "trainer_guide.py"
PPE_IMPORT = "import pytorch_pfn_extras as ppe"


def _run(core: bool, out: Path, *args: str) -> Path:
    """The script as ``python trainer_guide.py OUT ARGS`` with PPE, or with ppe-core's import."""
    script = SCRIPT
    if core:
        script = out.parent / f"{out.name}_trainer_guide.py"
        script.write_text(SCRIPT.read_text().replace(PPE_IMPORT, "import ppe_core as ppe"))
    argv, sys.argv = sys.argv, [str(script), str(out), *args]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    if core:
        assert [str(w.message) for w in caught] == []
    return out


def _log(out: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((out / "result" / "log").read_text())
    for entry in entries:
        entry.pop("elapsed_time")  # wall clock
    return entries


@pytest.mark.parametrize("scale", ["1", "2"])
def test_trainer_guide_logs_ppe_values_bit_for_bit(scale: str, tmp_path: Path) -> None:
    ppe_out = _run(False, tmp_path / "ppe", "--scale", scale)
    core_out = _run(True, tmp_path / "core", "--scale", scale)
    expected = _log(ppe_out)
    assert [sorted(e) for e in expected] == [["epoch", "iteration", "train/loss", "val/loss"]] * 2
    assert _log(core_out) == expected  # floats compared exactly
    losses = [json.loads((out / "losses.json").read_text()) for out in (ppe_out, core_out)]
    assert losses[0] == losses[1]
    weights = [torch.load(out / "model.pt") for out in (ppe_out, core_out)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


class _SelfReporting(torch.nn.Module):
    """Reports its own ``<prefix>/loss`` (twice the loss) and returns the loss and a count."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = self.fc(x).pow(2).mean()
        prefix = "train" if self.training else "val"
        ppe.reporting.report({f"{prefix}/loss": 2 * loss.item()})
        return {"loss": loss, "rows": torch.tensor(float(x.shape[0]))}


def test_automatic_report_adds_only_keys_the_step_did_not_report() -> None:
    torch.manual_seed(0)
    model = _SelfReporting()
    ppe.to(model, "cpu")
    log_report = ppe.training.extensions.LogReport(filename=None)
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),  # lr 0: every step sees the same weights
        1,
        evaluator=ppe.engine.create_evaluator(model),
        extensions=[log_report],
    )
    data = [torch.ones(3, 2)] * 2
    with torch.no_grad():
        own = 2 * model.fc(data[0]).pow(2).mean().item()
    trainer.run(data, data)
    (entry,) = log_report.log
    # The model's values (Python floats, twice the loss), not the returned tensors' mean.
    assert entry["train/loss"] == own and entry["val/loss"] == own
    # Keys the step did not report itself are still reported automatically.
    assert entry["train/rows"] == 3.0 and entry["val/rows"] == 3.0
