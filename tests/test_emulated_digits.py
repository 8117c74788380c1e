"""The digits example trains end to end on the example plugin's device, which lives on the
emulated device ``ppe_emu``: evaluator, snapshots, bit-exact resume, weights equal to the CPU run.

Each run is a fresh interpreter, as a user runs ``python examples/train_digits.py --device
exampledev``; the example plugin is found through its installed entry point (CI installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_testing import EMULATED_DEVICE, enable_emulated_device

DIGITS = Path(__file__).parent.parent / "examples" / "train_digits.py"

# Before any test of the session runs a backward pass (see tests/test_emulated_device.py).
enable_emulated_device()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        "ppe_example_device" not in {ep.name for ep in entry_points(group="ppe_core")},
        reason="needs the example plugin installed: pip install -e examples/ppe_example_device",
    ),
]


def _train(out: Path, device: str, epochs: int) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    env["OMP_NUM_THREADS"] = "1"
    args = [sys.executable, str(DIGITS), "--out", str(out), "--epochs", str(epochs)]
    result = subprocess.run(
        [*args, "--device", device], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _last_snapshot(out: Path, map_location: str | None = "cpu") -> dict[str, Any]:
    newest = max(out.glob("snapshot_iter_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    state: dict[str, Any] = torch.load(newest, map_location=map_location, weights_only=True)
    return state


def _assert_same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want), where
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")


def test_digits_on_the_emulated_device_resumes_bit_exactly_and_equals_the_cpu_run(
    tmp_path: Path,
) -> None:
    cpu = _train(tmp_path / "cpu", "cpu", 2)
    straight = _train(tmp_path / "emu", "exampledev", 2)
    assert straight.splitlines()[-1] == cpu.splitlines()[-1]  # the same final accuracy line
    assert "val/accuracy" in straight
    _train(tmp_path / "resumed", "exampledev", 1)
    resumed = _train(tmp_path / "resumed", "exampledev", 2)  # continues from epoch 1
    assert "resumed from" in resumed
    # The snapshot's tensors were saved from the device (enabled at collection, see below).
    weights = _last_snapshot(tmp_path / "emu", map_location=None)["models"]["main"]
    assert {t.device.type for t in weights.values()} == {EMULATED_DEVICE}
    want = _last_snapshot(tmp_path / "cpu")
    for run in ("emu", "resumed"):
        got = _last_snapshot(tmp_path / run)
        _assert_same(got["models"], want["models"], f"{run}: models")
        _assert_same(got["optimizers"], want["optimizers"], f"{run}: optimizers")
