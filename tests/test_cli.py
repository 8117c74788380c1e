"""The command line: ``python -m ppe_core`` and the ``ppe-core`` console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ppe_core


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_help_is_plain_text_and_names_the_module_form() -> None:
    result = run(sys.executable, "-m", "ppe_core", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m ppe_core [-h] [--version] {plugins,info}")
    assert "``" not in result.stdout  # no reST markup from a docstring
    assert "plugins, runtimes, logics, extensions" in result.stdout


def test_version_is_the_packages() -> None:
    result = run(sys.executable, "-m", "ppe_core", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"ppe-core {ppe_core.__version__}\n"


def test_the_console_script_calls_itself_ppe_core() -> None:
    script = Path(sys.executable).parent / "ppe-core"
    assert script.exists(), f"the editable install puts the ppe-core script at {script}"
    version = run(str(script), "--version")
    assert version.stdout == f"ppe-core {ppe_core.__version__}\n"
    usage = run(str(script), "plugins", "--bogus")
    assert usage.returncode == 2
    assert usage.stderr.startswith("usage: ppe-core ")
