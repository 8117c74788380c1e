"""The command line: ``python -m ppe_core`` and the ``ppe-core`` console script."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ppe_core


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_help_is_plain_text_and_names_the_module_form() -> None:
    result = run(sys.executable, "-m", "ppe_core", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m ppe_core [-h] [--version]")
    assert "{plugins,info,export-snapshot}" in result.stdout
    assert "``" not in result.stdout  # no reST markup from a docstring
    assert "plugins, runtimes, logics, extensions" in result.stdout


def test_export_snapshot_refuses_a_directory_without_a_manifest(tmp_path: Path) -> None:
    # A save that never finished leaves its shards without the manifest: nothing verifies them.
    (tmp_path / "snapshot_4").mkdir()
    (tmp_path / "snapshot_4" / "__0_0.distcp").write_bytes(b"shard")
    result = run(
        sys.executable,
        "-m",
        "ppe_core",
        "export-snapshot",
        str(tmp_path / "snapshot_4"),
        str(tmp_path / "model.pt"),
    )
    assert result.returncode == 1
    assert "error: refusing to export" in result.stderr
    assert "no readable snapshot manifest" in result.stderr
    assert not (tmp_path / "model.pt").exists()


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


@pytest.mark.parametrize(
    ("extension", "plugin", "distribution"),
    [("MLflowLogger", "ppe_mlflow", "ppe-mlflow"), ("WandbLogger", "ppe_wandb", "ppe-wandb")],
)
def test_plugins_lists_the_tracker_extensions_with_their_packages(
    extension: str, plugin: str, distribution: str
) -> None:
    # The dev install (README command 2, CI) installs both tracker packages; without one, the
    # listing must not claim its extension.
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    table = run(sys.executable, "-m", "ppe_core", "plugins")
    listing = run(sys.executable, "-m", "ppe_core", "plugins", "--json")
    assert table.returncode == 0 and listing.returncode == 0, table.stderr + listing.stderr
    extensions = {row["name"]: row for row in json.loads(listing.stdout)["extensions"]}
    if version is None:
        assert extension not in extensions
        assert extension not in table.stdout
        return
    assert extensions[extension] == {
        "name": extension,
        "object": f"{plugin}._logger.{extension}",
        "plugin": plugin,
        "distribution": distribution,
        "version": version,
    }
    plugins = {row["name"]: row for row in json.loads(listing.stdout)["plugins"]}
    assert plugins[plugin]["status"] == "loaded"
    assert plugins[plugin]["distribution"] == distribution
    row = next(line for line in table.stdout.splitlines() if line.split()[:1] == [extension])
    assert row.split()[1:] == [
        f"{plugin}._logger.{extension}",
        f"[{plugin},",
        f"{distribution}",
        f"{version}]",
    ]
