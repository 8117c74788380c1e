"""ppe-testing installed alone beside the core, in a new venv: no device plugin, no tracker.

The README's environment has every package at once, so a kit that imported a first-party
plugin (ppe-cpu) or something only another package brings would pass there and fail here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ppe_testing import check_installs_alone

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "plugins" / "ppe_testing"


@pytest.mark.slow
def test_the_package_installs_alone_beside_the_core_and_its_tests_pass(tmp_path: Path) -> None:
    check_installs_alone(
        PLUGIN,
        ["tests/test_ppe_testing_kit.py"],
        core=ROOT,
        workdir=tmp_path,
        constraints=ROOT / "constraints.txt",
        absent=["ppe_cpu", "mlflow"],
    )


@pytest.mark.slow
def test_a_package_importing_what_it_does_not_declare_fails_the_check(tmp_path: Path) -> None:
    # It imports ppe_cpu (here in the development environment, not among its dependencies):
    # its tests pass here and fail installed alone, and the check says so with pytest's output.
    project = tmp_path / "ppe_forgetful"
    (project / "ppe_forgetful").mkdir(parents=True)
    (project / "ppe_forgetful" / "__init__.py").write_text("import ppe_cpu  # undeclared\n")
    (project / "tests").mkdir()
    (project / "tests" / "test_it.py").write_text("def test_it():\n    import ppe_forgetful\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "ppe-forgetful"\nversion = "0.1.0"\ndependencies = ["ppe-core"]\n'
        '[tool.setuptools]\npackages = ["ppe_forgetful"]\n'
    )
    with pytest.raises(AssertionError) as info:
        check_installs_alone(
            project,
            ["tests/test_it.py"],
            core=ROOT,
            workdir=tmp_path / "work",
            constraints=ROOT / "constraints.txt",
        )
    message = str(info.value)
    assert "ppe_forgetful's tests failed installed alone" in message
    assert "No module named 'ppe_cpu'" in message
