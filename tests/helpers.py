"""Builders shared by the tests (imported as ``helpers``: tests/ is on sys.path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from ppe_core.training.manager import ExtensionsManager


def linear_manager(
    out: Path, extensions: list[Any], *, max_epochs: int, iters_per_epoch: int, **kwargs: Any
) -> ExtensionsManager:
    """A manager over a seeded Linear(4, 1) and SGD, writing into ``out``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return ExtensionsManager(
        model,
        optimizer,
        max_epochs,
        iters_per_epoch=iters_per_epoch,
        out_dir=str(out),
        extensions=extensions,
        **kwargs,
    )


def run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (state a test must not leave in its own process:
    the emulated device, a first backward pass); output captured, never raises on failure."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )
