"""ppe-testing installed alone beside the core, in a new venv: no device plugin, no tracker.

The README's environment has every package at once, so a kit that imported a first-party
plugin (ppe-cpu) or something only another package brings would pass there and fail here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "plugins" / "ppe_testing"


@pytest.mark.slow
def test_the_package_installs_alone_beside_the_core_and_its_tests_pass(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt")]
    installed = subprocess.run(
        [*install, "-e", str(ROOT), "-e", str(PLUGIN), "pytest"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    absent = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; print(u.find_spec('ppe_cpu'), u.find_spec('mlflow'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,  # not the repository root, whose plugin folders are not installed
    )
    assert absent.stdout.split() == ["None", "None"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    tests = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(PLUGIN / "tests" / "test_ppe_testing_kit.py"),
        ],
        cwd=PLUGIN,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout
