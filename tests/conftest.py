"""Shared fixtures: an isolated plugin host per test and the installed fixture plugins."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import pip_install_fixtures

import ppe_core.testing
from ppe_core.plugins import PluginHost


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test in its own directory: default out_dir="result" lands there."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _no_process_group_left_behind() -> Iterator[None]:
    """A test that creates a torch.distributed group must destroy it (later tests assume none)."""
    yield
    dist: Any = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialised; destroy it")


@pytest.fixture(autouse=True)
def plugin_host() -> Iterator[PluginHost]:
    """A fresh plugin host with autoload off: built-ins plus the first-party plugins."""
    import ppe_cpu.plugin
    import ppe_cuda.plugin

    with ppe_core.testing.plugin_host() as host:
        host.register(ppe_cpu.plugin, name="ppe_cpu")
        host.register(ppe_cuda.plugin, name="ppe_cuda")
        yield host


@pytest.fixture
def hide_module(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make an installed optional package look absent, to test the "install the extra" errors."""

    def hide(name: str) -> None:
        real_find_spec = importlib.util.find_spec

        def find_spec(fullname: str, *args: Any, **kwargs: Any) -> Any:
            if fullname == name or fullname.startswith(name + "."):
                return None
            return real_find_spec(fullname, *args, **kwargs)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        for module in list(sys.modules):
            if module == name or module.startswith(name + "."):
                monkeypatch.delitem(sys.modules, module)
        monkeypatch.setitem(sys.modules, name, None)  # ``import name`` raises ImportError

    return hide


@pytest.fixture(scope="session")
def installed_plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip-install the fixture plugin distributions into a private ``--target`` directory.

    They are installed from a copy outside the repository, the way a user installs a
    third-party package, and never into the developer's environment.
    """
    root = tmp_path_factory.mktemp("third_party")
    return pip_install_fixtures(root, ("ppe_testdevice", "ppe_brokenplugin"))


@pytest.fixture(scope="session")
def misbehaving_plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip-install ``ppe-misbehaving`` (plugins that misbehave on purpose) into its own
    ``--target`` directory, so the tests that put it on ``sys.path`` choose where."""
    return pip_install_fixtures(tmp_path_factory.mktemp("misbehaving"), ("ppe_misbehaving",))
