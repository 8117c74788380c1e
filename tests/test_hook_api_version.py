"""The hook API version: a plugin declares the ppe-core hook API it was written for
(``PPE_CORE_HOOK_API``) and a host that does not provide it refuses the plugin by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import pip_install_fixtures

import ppe_core
from ppe_core import hookspecs
from ppe_core.errors import PluginAPIVersionError, PluginLoadError, PluginLoadWarning
from ppe_core.plugins import PluginHost, PluginSettings
from ppe_core.runtime import PyTorchRuntime


@pytest.fixture(scope="session")
def future_api_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ppe-futureapi`` (declares hook API 2.0) pip-installed into its own directory."""
    return pip_install_fixtures(tmp_path_factory.mktemp("futureapi"), ("ppe_futureapi",))


class Declares:
    """An inline plugin declaring ``version`` and registering the runtime ``declaredev``."""

    def __init__(self, version: Any) -> None:
        self.PPE_CORE_HOOK_API = version

    @ppe_core.hookimpl
    def ppe_register_runtimes(self, registry: Any) -> None:
        registry.register("declaredev", PyTorchRuntime)


def test_the_hook_api_version_is_public() -> None:
    assert hookspecs.PPE_CORE_HOOK_API == (1, 1)
    assert "PPE_CORE_HOOK_API" in hookspecs.__all__
    assert issubclass(PluginAPIVersionError, PluginLoadError)


def test_an_installed_plugin_for_a_future_major_version_is_skipped_naming_it(
    future_api_plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(future_api_plugin))
    with pytest.warns(PluginLoadWarning) as caught:
        host = PluginHost(PluginSettings())
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    message = messages[0]
    assert "plugin 'futureapi' (entry point: module ppe_futureapi.plugin, distribution " in message
    assert "ppe-futureapi 2.1.0" in message
    assert "PluginAPIVersionError: " in message
    assert "was written for ppe-core hook API 2.0, but this ppe-core" in message
    assert "provides hook API 1.1" in message
    assert "pip install -U ppe-core" in message and "written for hook API 1.x" in message
    record = host.records["futureapi"]
    assert record.status == "failed" and isinstance(record.exception, PluginAPIVersionError)
    # Refused before its hooks ran: nothing of it is registered; the other plugins loaded.
    assert "futuredev" not in host.runtimes
    assert host.records["ppe_cpu"].status == "loaded"


def test_strict_mode_raises_the_version_error(
    future_api_plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(future_api_plugin))
    with pytest.raises(PluginLoadError, match=r"hook API 2\.0") as info:
        PluginHost(PluginSettings(strict=True))
    assert isinstance(info.value.__cause__, PluginAPIVersionError)


@pytest.mark.parametrize("version", [(1, 0), None])
def test_a_plugin_for_this_version_or_undeclared_loads(version: Any) -> None:
    host = PluginHost(PluginSettings(autoload=False))
    host.register(Declares(version), name="declares")
    assert "declaredev" in host.runtimes


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ((1, 7), "written for ppe-core hook API 1.7, but this ppe-core"),
        ((0, 9), "upgrade test_hook_api_version to a release written for hook API 1.x"),
        ("1.0", "declares PPE_CORE_HOOK_API = '1.0', which is not a (major, minor) tuple"),
    ],
)
def test_a_plugin_declaring_another_version_is_refused_at_register(version: Any, says: str) -> None:
    host = PluginHost(PluginSettings(autoload=False))
    with pytest.raises(PluginAPIVersionError, match=r"plugin 'declares'") as info:
        host.register(Declares(version), name="declares")
    assert says in str(info.value)
    assert "declaredev" not in host.runtimes and "declares" not in host.records
