"""ppe-wandb installed alone beside the core, in a new venv: no other tracker, no numpy.

Its dependencies are the core's, ppe-extensions' and wandb's only; the README's environment has
every package at once, so a dependency on something only another package brings (numpy, which
mlflow pulls in and whose absence makes torch warn at import) would pass there and fail here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ppe_testing import check_installs_alone

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "plugins" / "ppe_wandb"


@pytest.mark.slow
def test_the_package_installs_alone_beside_the_core_and_its_tests_pass(tmp_path: Path) -> None:
    check_installs_alone(
        PLUGIN,
        ["tests/test_wandb_logger.py"],
        core=ROOT,
        workdir=tmp_path,
        constraints=ROOT / "constraints.txt",
        absent=["mlflow", "numpy"],
        dependencies=[ROOT / "plugins" / "ppe_extensions"],  # no index has it
    )
