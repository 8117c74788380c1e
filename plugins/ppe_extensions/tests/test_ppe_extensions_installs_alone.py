"""ppe-extensions installed alone beside the core, in a new venv: no device plugin, no tracker.

The README's environment has every package at once, so an extension that needs something only
another package brings (ppe-cpu's runtime, a tracker's dependencies) would pass there and fail
for a user who installs ``ppe-core[standard]`` alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ppe_testing import check_installs_alone

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "plugins" / "ppe_extensions"


@pytest.mark.slow
def test_the_package_installs_alone_beside_the_core_and_its_tests_pass(tmp_path: Path) -> None:
    tests = sorted(
        f"tests/{path.name}"
        for path in (PLUGIN / "tests").glob("test_*.py")
        if path.name != Path(__file__).name
    )
    check_installs_alone(
        PLUGIN,
        tests,
        core=ROOT,
        workdir=tmp_path,
        constraints=ROOT / "constraints.txt",
        extras=["test"],
        absent=["ppe_cpu", "ppe_cuda", "ppe_mlflow", "ppe_wandb", "mlflow", "wandb"],
    )
