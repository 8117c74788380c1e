"""Plugin isolation: first-party device types stay first-party, misbehaving hooks are named.

The misbehaving plugins are a real installed distribution (``tests/fixtures/ppe_misbehaving``,
pip-installed into a private directory); the first-party ``ppe-cpu`` is the one installed in
this environment (README's set-up command), found through its entry point like any plugin.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core import hookimpl
from ppe_core.errors import PluginConflictWarning, PluginHookError, TeardownHookWarning
from ppe_core.plugins import ENTRY_POINT_GROUP, PluginHost, PluginSettings

ORDERS = ("intruder_first", "first_party_first")


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def batches(n: int = 2) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 3, generator=g), "t": torch.randn(4, 1, generator=g)}] * n


def train_once(host: PluginHost) -> Regressor:
    """One short training run on ``cpu`` with ``host`` active; returns the model."""
    previous = ppe.plugins.set_plugin_host(host)
    try:
        torch.manual_seed(0)
        model = ppe.to(Regressor(), "cpu")
        trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
        trainer.run(batches())
        return model
    finally:
        ppe.plugins.set_plugin_host(previous)


@pytest.fixture
def on_path(misbehaving_plugins: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Put a directory on ``sys.path`` before or after the environment's site-packages, which
    is what decides the entry points' discovery order."""

    def put(directory: Path, order: str) -> None:
        if order == "intruder_first":
            monkeypatch.syspath_prepend(str(directory))
        else:
            monkeypatch.setattr(sys, "path", [*sys.path, str(directory)])

    yield put


def discovered(*names: str) -> list[str]:
    """The discovery order of the named entry points, as ``importlib.metadata`` gives it."""
    return [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name in names]


# Item 13: a plugin cannot take over a first-party device type --------------------------------


@pytest.mark.parametrize("order", ORDERS)
def test_first_party_cpu_stays_whatever_the_discovery_order(
    order: str, on_path: Any, misbehaving_plugins: Path
) -> None:
    from ppe_cpu import CPURuntime

    on_path(misbehaving_plugins, order)
    seen = discovered("intruder", "ppe_cpu")
    expected = ["intruder", "ppe_cpu"] if order == "intruder_first" else ["ppe_cpu", "intruder"]
    assert seen == expected  # the order really is the one under test
    settings = PluginSettings(disabled=("intruder_replace", "failing_setup"))
    with pytest.warns(PluginConflictWarning) as caught:
        host = PluginHost(settings)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    # The warning names the intruder (distribution and version), the device type and the
    # plugin that keeps it; it does not blame the genuine plugin.
    assert "plugin 'intruder' (ppe-misbehaving 0.3.0)" in message
    assert "runtime 'cpu'" in message and "ppe-cpu" in message and "skipped" in message
    assert host.records["ppe_cpu"].status == "loaded"
    assert host.records["intruder"].status == "loaded"  # only the conflicting name is skipped
    assert host.runtimes.get("cpu") is CPURuntime
    assert host.runtimes.entries()["cpu"].registrant.distribution == "ppe-cpu"
    assert "intruderdev" in host.runtimes  # its own device type is its own
    model = train_once(host)
    assert type(ppe.runtime.get_runtime(model)) is CPURuntime


def test_explicit_plugin_list_loads_the_first_party_plugin_first(
    misbehaving_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ppe_cpu import CPURuntime

    monkeypatch.syspath_prepend(str(misbehaving_plugins))
    settings = PluginSettings(autoload=False, plugins=("intruder", "ppe_cpu"))  # PPE_PLUGINS
    with pytest.warns(PluginConflictWarning, match="plugin 'intruder' .*runtime 'cpu'"):
        host = PluginHost(settings)
    assert host.runtimes.get("cpu") is CPURuntime
    assert list(host.records)[-2:] == ["ppe_cpu", "intruder"]


@pytest.mark.parametrize("order", ORDERS)
def test_replace_over_a_first_party_device_type_needs_the_users_consent(
    order: str, on_path: Any, misbehaving_plugins: Path
) -> None:
    from ppe_cpu import CPURuntime
    from ppe_misbehaving._runtime import IntruderRuntime

    on_path(misbehaving_plugins, order)
    refused = PluginSettings(disabled=("intruder", "failing_setup"))
    with pytest.warns(PluginConflictWarning) as caught:
        host = PluginHost(refused)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "plugin 'intruder_replace' (ppe-misbehaving 0.3.0)" in message
    assert "replace=True" in message and "PPE_ALLOW_OVERRIDE=ppe-misbehaving" in message
    assert host.runtimes.get("cpu") is CPURuntime
    # The user's explicit opt-in names the distribution (any PEP 503 spelling), read from the
    # environment when the host is created.
    allowed = PluginSettings.from_env(
        {"PPE_ALLOW_OVERRIDE": "PPE_Misbehaving", "PPE_DISABLED_PLUGINS": "intruder,failing_setup"}
    )
    host = PluginHost(allowed)  # no warning: the user asked for it
    entry = host.runtimes.entries()["cpu"]
    assert entry.obj is IntruderRuntime
    assert entry.registrant.distribution == "ppe-misbehaving"
    assert entry.replaced is not None and entry.replaced.obj is CPURuntime
    model = train_once(host)
    assert type(ppe.runtime.get_runtime(model)) is IntruderRuntime


@pytest.mark.parametrize("order", ORDERS)
def test_an_entry_point_claiming_a_first_party_name_does_not_displace_it(
    order: str, on_path: Any, tmp_path: Path
) -> None:
    # A distribution may name its entry point anything, "ppe_cpu" included.
    site = tmp_path / "impostor_site"
    info = site / "ppe_impostor-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ppe-impostor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ppe_core]\nppe_cpu = ppe_impostor.plugin\n")
    on_path(site, order)
    with pytest.warns(PluginConflictWarning) as caught:
        host = PluginHost(PluginSettings())
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "'ppe_cpu' of ppe-impostor 1.0" in message and "ppe-cpu" in message
    record = host.records["ppe_cpu"]
    assert (record.status, record.distribution) == ("loaded", "ppe-cpu")
    assert host.runtimes.entries()["cpu"].registrant.distribution == "ppe-cpu"


def test_first_party_is_decided_by_distribution_not_by_plugin_name(plugin_host: PluginHost) -> None:
    # An in-process object named like a first-party plugin is still the user's own: it is not
    # protected, so a later plugin conflicting with it raises as any duplicate does.
    record = plugin_host.records["ppe_cpu"]
    assert record.source == "register()" and not record.first_party
    assert plugin_host.records["ppe_core.logics"].first_party  # built-ins ship with ppe-core
    assert not PluginSettings().may_override("ppe-misbehaving")
    assert PluginSettings(allow_override=("ppe.misbehaving",)).may_override("PPE_misbehaving")


# Item 14: a failing per-run hook names its plugin; wrapper hooks run --------------------------


def test_failing_setup_hook_names_the_plugin_and_how_to_disable_it(
    misbehaving_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(misbehaving_plugins))
    plugins = ("ppe_cpu", "failing_setup")
    host = PluginHost(PluginSettings(autoload=False, plugins=plugins))
    with pytest.raises(PluginHookError) as info:
        train_once(host)
    message = str(info.value)
    for phrase in (
        "ppe_trainer_setup of plugin 'failing_setup'",
        "module ppe_misbehaving.failing_setup",
        "distribution ppe-misbehaving 0.3.0",
        "ValueError('oops')",
        "PPE_DISABLED_PLUGINS=ppe-misbehaving",
    ):
        assert phrase in message, message
    assert isinstance(info.value.__cause__, ValueError)
    # The way out the message gives works.
    blocked = ("ppe-misbehaving",)
    train_once(PluginHost(PluginSettings(autoload=False, plugins=plugins, disabled=blocked)))


def test_setup_error_blames_the_raising_plugin_not_a_wrapper_around_it(
    plugin_host: PluginHost,
) -> None:
    class Around:
        @hookimpl(wrapper=True)
        def ppe_evaluator_setup(self, evaluator: Any) -> Any:
            return (yield)

    class Broken:
        @hookimpl
        def ppe_evaluator_setup(self, evaluator: Any) -> None:
            raise KeyError("missing")

    plugin_host.register(Broken(), name="broken")
    plugin_host.register(Around(), name="around")
    model = ppe.to(Regressor(), "cpu")
    with pytest.raises(PluginHookError) as info:
        ppe.engine.create_evaluator(model).run(batches())
    message = str(info.value)
    assert "ppe_evaluator_setup of plugin 'broken'" in message and "KeyError('missing')" in message
    assert "get_plugin_host().unregister('broken')" in message


@pytest.mark.parametrize("style", ["wrapper", "hookwrapper"])
def test_teardown_wrappers_run_around_the_other_implementations(
    style: str, plugin_host: PluginHost
) -> None:
    calls: list[Any] = []

    class Plain:
        @hookimpl
        def ppe_trainer_teardown(self, trainer: Any, exception: Any) -> str:
            calls.append(("plain", type(exception).__name__))
            return "plain-result"

    if style == "wrapper":

        class Wrapping:
            @hookimpl(wrapper=True)
            def ppe_trainer_teardown(self, trainer: Any, exception: Any) -> Any:
                calls.append("before")
                result = yield
                calls.append(("after", result))
                return result

    else:

        class Wrapping:  # type: ignore[no-redef]
            @hookimpl(hookwrapper=True)
            def ppe_trainer_teardown(self, trainer: Any, exception: Any) -> Any:
                calls.append("before")
                outcome = yield
                calls.append(("after", outcome.get_result()))

    plugin_host.register(Plain(), name="plain")
    plugin_host.register(Wrapping(), name="wrapping")
    train_once(plugin_host)
    assert calls == ["before", ("plain", "NoneType"), ("after", ["plain-result"])]
    # A failing run tears down through the wrapper too.
    calls.clear()
    model = ppe.to(Regressor(), "cpu")
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    with pytest.raises(ppe.errors.BatchMismatchError):
        trainer.run([{"x": torch.randn(4, 3)}])
    assert calls == ["before", ("plain", "BatchMismatchError"), ("after", ["plain-result"])]


def test_failing_teardown_wrapper_is_reported_like_any_teardown(plugin_host: PluginHost) -> None:
    class BrokenAfterYield:
        @hookimpl(wrapper=True)
        def ppe_trainer_teardown(self, trainer: Any, exception: Any) -> Any:
            yield
            raise RuntimeError("wrapper broke")

    plugin_host.register(BrokenAfterYield(), name="broken_wrapper")
    with pytest.raises(PluginHookError, match="ppe_trainer_teardown of plugin 'broken_wrapper'"):
        train_once(plugin_host)
    model = ppe.to(Regressor(), "cpu")
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
    with (
        pytest.warns(TeardownHookWarning, match="'broken_wrapper' raised RuntimeError"),
        pytest.raises(ppe.errors.BatchMismatchError),
    ):
        trainer.run([{"x": torch.randn(4, 3)}])
