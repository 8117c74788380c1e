"""The standard extensions as a package of their own (ppe-extensions): PPE's paths resolve to it
with it installed, name it without, and the core trains alone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ppe_core as ppe
import ppe_core.writing

#: PPE paths and the names at them that ppe-extensions provides.
_PATHS = {
    "ppe_core.training.extensions.log_report": ("LogReport", "_LogBuffer", "_LogLooker"),
    "ppe_core.training.extensions.accumulate.average_accumulate": ("AverageAccumulate",),
    "ppe_core.training.extensions.snapshot_writers": ("ThreadWriter", "SimpleWriter"),
    "ppe_core.training.extensions.util": ("ProgressBar",),
    "ppe_core.writing": ("ThreadWriter", "ProcessQueueWriter", "TensorBoardWriter"),
}


def test_ppe_paths_resolve_to_the_packages_classes() -> None:
    import importlib

    import ppe_extensions._evaluator
    import ppe_extensions._log_report
    import ppe_extensions._parallel_writer

    assert ppe.training.extensions.LogReport is ppe_extensions._log_report.LogReport
    log_report = importlib.import_module("ppe_core.training.extensions.log_report")
    assert log_report.LogReport is ppe_extensions._log_report.LogReport
    assert ppe_core.writing.ThreadWriter is ppe_extensions._parallel_writer.ThreadWriter
    # An alias: PPE's util.ProgressBar is the text progress-bar base class.
    util = importlib.import_module("ppe_core.training.extensions.util")
    assert util.ProgressBar is ppe_extensions._evaluator.TextProgressBar
    for path, names in _PATHS.items():
        module = importlib.import_module(path)
        assert set(names) <= set(dir(module)), path
        assert all(getattr(module, name) is not None for name in names)
    # A name PPE has there but ppe-core leaves out still says what to use instead.
    with pytest.raises(AttributeError, match="LogWriterSaveFunc"):
        log_report.LogWriterSaveFunc  # noqa: B018
    # PPE's tests patch helpers through evaluator's path: it is the implementation module.
    evaluator = importlib.import_module("ppe_core.training.extensions.evaluator")
    assert evaluator is ppe_extensions._evaluator


_WITHOUT = textwrap.dedent(
    """
    import importlib, torch
    import ppe_core as ppe
    from ppe_core.errors import OptionalDependencyError

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x, t):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x), t)}

    torch.manual_seed(0)
    model = Model()
    ppe.to(model, "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [{"x": torch.randn(4, 2), "t": torch.randn(4, 1)} for _ in range(3)]
    evaluator = ppe.engine.create_evaluator(model, device="cpu")
    trainer = ppe.engine.create_trainer(model, optimizer, 2, device="cpu", evaluator=evaluator)
    trainer.run(data, data)
    print("trained", trainer.manager.iteration)
    for path, name in PATHS:
        try:
            getattr(importlib.import_module(path), name)
        except OptionalDependencyError as exc:
            print("refused", path, name, "|", exc)
    try:
        ppe.training.extensions.LogReport
    except OptionalDependencyError as exc:
        print("refused ppe.training.extensions LogReport |", exc)
    """
)


@pytest.mark.slow  # two fresh interpreters import torch
def test_without_the_package_the_core_trains_and_ppe_paths_name_it(tmp_path: Path) -> None:
    paths = [(path, name) for path, names in _PATHS.items() for name in names]
    paths = [(p, n) for p, n in paths if n != "SimpleWriter"]  # the core's own writer
    script = tmp_path / "user.py"
    script.write_text(f"PATHS = {paths!r}\n" + _WITHOUT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    env["PPE_DISABLED_PLUGINS"] = "ppe-extensions"
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "trained 6" in lines
    refused = [line for line in lines if line.startswith("refused")]
    assert len(refused) == len(paths) + 1, out.stdout
    for line in refused:
        assert "ppe-extensions package" in line and "pip install 'ppe-core[standard]'" in line
    # The CLI's export-snapshot needs the snapshot family: it says what to install.
    cli = subprocess.run(
        [sys.executable, "-m", "ppe_core", "export-snapshot", "missing", "out.pt"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert cli.returncode == 1
    assert "ppe-extensions" in cli.stderr and "ppe-core[standard]" in cli.stderr, cli.stderr


def test_the_package_provides_exactly_the_core_s_faces() -> None:
    # ppe_core names its faces (ppe_core._compat.FACES) and the package names what it provides
    # (ppe_register_modules); a face nobody provides, or a provided path with no face, is a bug.
    from ppe_extensions.plugin import MODULES

    from ppe_core import _compat

    namespaces = {"ppe_core.training.extensions", "ppe_core.writing"}  # packages, not faces
    assert set(MODULES) == set(_compat.FACES) | namespaces
