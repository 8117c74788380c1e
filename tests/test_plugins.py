"""The plugin host: registration hooks, registries, discovery switches and failure policy."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import ppe_core as ppe
from ppe_core import hookimpl, hookspecs
from ppe_core.errors import (
    ConfigurationError,
    DuplicateRegistrationError,
    PluginLoadError,
    PluginLoadWarning,
    RegistryLookupError,
    RuntimeNotFoundError,
)
from ppe_core.plugins import PluginHost, PluginSettings
from ppe_core.runtime import PyTorchRuntime


class RecordingRuntime(PyTorchRuntime):
    """A real runtime (moves to CPU) that records the modules it moved."""

    moved: ClassVar[list[torch.nn.Module]] = []

    def __init__(self, device_spec: Any, options: Any = None) -> None:
        super().__init__("cpu", options)
        self.requested = device_spec

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        RecordingRuntime.moved.append(module)
        return super().move_module(module)


class InlinePlugin:
    """An in-process plugin object: what tests and notebooks register without installing."""

    @hookimpl
    def ppe_register_runtimes(self, registry: Any) -> None:
        registry.register("inlinedev", RecordingRuntime)

    @hookimpl
    def ppe_register_extensions(self, registry: Any) -> None:
        registry.register("InlineExt", dict)

    @hookimpl
    def ppe_register_logics(self, registry: Any) -> None:
        registry.register("inline-logic", list)


def _module_plugin(name: str, **hooks: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(module, hook_name, hookimpl(fn))
    return module


def test_inline_plugin_registers_into_all_three_registries(plugin_host: PluginHost) -> None:
    plugin_host.register(InlinePlugin(), name="inline")
    assert ppe.runtime.runtime_registry.get_runtime_class_for_device_spec("inlinedev") is (
        RecordingRuntime
    )
    assert ppe.training.extensions.InlineExt is dict
    assert plugin_host.logics.get("inline-logic") is list
    entry = plugin_host.runtimes.entries()["inlinedev"]
    assert entry.registrant.plugin == "inline"


def test_registration_hooks_are_historic_for_late_plugins(plugin_host: PluginHost) -> None:
    # The host called the registration hooks at start-up; a plugin registered afterwards
    # still receives them.
    assert "inlinedev" not in plugin_host.runtimes
    plugin_host.register(InlinePlugin(), name="late")
    assert "inlinedev" in plugin_host.runtimes


def test_ppe_to_moves_through_the_registered_runtime_and_tags(plugin_host: PluginHost) -> None:
    plugin_host.register(InlinePlugin(), name="inline")
    RecordingRuntime.moved.clear()
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    returned = ppe.to(model, "inlinedev:0", options={})
    assert returned is model
    assert RecordingRuntime.moved == [model]
    runtime = ppe.runtime.get_runtime(model)
    assert isinstance(runtime, RecordingRuntime)
    assert runtime.requested == "inlinedev:0"
    assert all(ppe.runtime.get_runtime(m) is runtime for m in model.modules())


def test_duplicate_registration_names_both_registrants(plugin_host: PluginHost) -> None:
    plugin_host.register(InlinePlugin(), name="first")

    class Other(PyTorchRuntime):
        pass

    second = _module_plugin(
        "second_plugin",
        ppe_register_runtimes=lambda registry: registry.register("inlinedev", Other),
    )
    with pytest.raises(DuplicateRegistrationError) as info:
        plugin_host.register(second, name="second")
    message = str(info.value)
    assert "'first'" in message and "'second'" in message
    assert "replace=True" in message
    # The failed plugin is rolled back: the first registration still stands.
    assert plugin_host.runtimes.get("inlinedev") is RecordingRuntime
    assert "second" not in plugin_host.records


def test_replace_true_overrides_and_unregister_restores(plugin_host: PluginHost) -> None:
    class Mine(PyTorchRuntime):
        pass

    registry = plugin_host.runtimes
    original = registry.get("cpu")
    registry.register("cpu", Mine, replace=True)
    assert registry.get_runtime_class_for_device_spec("cpu") is Mine
    entry = registry.entries()["cpu"]
    assert entry.registrant.plugin == f"<code in module {__name__}>"
    assert entry.replaced is not None and entry.replaced.obj is original
    registry.unregister("cpu")
    assert registry.get("cpu") is original


def test_registry_views_are_read_only(plugin_host: PluginHost) -> None:
    view = plugin_host.runtimes.entries()
    with pytest.raises(TypeError):
        view["cpu"] = None  # type: ignore[index]


def test_registry_rejects_non_runtime_and_bad_names(plugin_host: PluginHost) -> None:
    with pytest.raises(TypeError, match=r"subclass of ppe_core\.runtime\.BaseRuntime"):
        plugin_host.runtimes.register("x", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device type"):
        plugin_host.runtimes.register("x:0", PyTorchRuntime)
    with pytest.raises(TypeError, match="non-empty strings"):
        plugin_host.logics.register("", list)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("cpu", "cpu"), ("cuda:1", "cuda"), (torch.device("cuda", 1), "cuda"), ("cuda", "cuda")],
)
def test_device_spec_forms_resolve(spec: Any, expected: str, plugin_host: PluginHost) -> None:
    cls = ppe.runtime.runtime_registry.get_runtime_class_for_device_spec(spec)
    assert cls is plugin_host.runtimes.get(expected)


def test_torch_native_device_without_plugin_falls_back_to_generic_runtime() -> None:
    registry = ppe.runtime.runtime_registry
    assert registry.get_runtime_class_for_device_spec("meta") is PyTorchRuntime
    model = ppe.to(torch.nn.Linear(4, 4), "meta")
    assert model.weight.device.type == "meta"
    assert isinstance(ppe.runtime.get_runtime(model), PyTorchRuntime)


def test_unknown_device_error_lists_runtimes_failures_and_install_hint(
    plugin_host: PluginHost,
) -> None:
    broken = _module_plugin("half_broken", ppe_register_runtimes=_raise_in_hook)
    sys.modules["half_broken"] = broken
    try:
        with pytest.warns(PluginLoadWarning, match="half_broken"):
            host = PluginHost(PluginSettings(autoload=False, plugins=("half_broken",)))
    finally:
        del sys.modules["half_broken"]
    with pytest.raises(RuntimeNotFoundError) as info:
        host.runtimes.get_runtime_class_for_device_spec("npu9")
    message = str(info.value)
    assert "'npu9'" in message
    assert "Registered runtimes: (none)" in message
    assert "half_broken" in message and "boom in hook" in message
    assert "pip install ppe-cuda" in message
    assert isinstance(info.value, RegistryLookupError)


def _raise_in_hook(registry: Any) -> None:
    registry.register("npu9", PyTorchRuntime)  # registered, then the hook fails: rolled back
    raise RuntimeError("boom in hook")


def test_failed_plugin_is_rolled_back_recorded_and_warned_once() -> None:
    sys.modules["half_broken2"] = _module_plugin(
        "half_broken2", ppe_register_runtimes=_raise_in_hook
    )
    try:
        with pytest.warns(PluginLoadWarning) as caught:
            host = PluginHost(PluginSettings(autoload=False, plugins=("half_broken2",)))
    finally:
        del sys.modules["half_broken2"]
    assert len(caught) == 1
    assert "PPE_DISABLED_PLUGINS=half_broken2" in str(caught[0].message)
    assert "npu9" not in host.runtimes  # the half-done registration was undone
    (record,) = host.failures
    assert record.status == "failed" and "RuntimeError: boom in hook" in (record.error or "")
    assert host.pm.get_plugin("half_broken2") is None


def test_strict_mode_turns_load_failures_into_errors() -> None:
    with pytest.raises(PluginLoadError, match="no_such_plugin_module"):
        PluginHost(PluginSettings(autoload=False, plugins=("no_such_plugin_module",), strict=True))


def test_unknown_hook_name_is_rejected_not_silently_ignored(plugin_host: PluginHost) -> None:
    typo = _module_plugin("typo_plugin", ppe_register_runtime=lambda registry: None)
    with pytest.raises(ConfigurationError, match="unknown hook 'ppe_register_runtime'"):
        plugin_host.register(typo)


def test_settings_are_read_from_the_environment_when_created() -> None:
    env = {
        "PPE_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PPE_PLUGINS": "a.b, c",
        "PPE_DISABLED_PLUGINS": "ppe-cuda,x",
        "PPE_STRICT_PLUGINS": "true",
        "PPE_TRACE_PLUGINS": "0",
    }
    settings = PluginSettings.from_env(env)
    assert settings == PluginSettings(
        autoload=False, plugins=("a.b", "c"), disabled=("ppe-cuda", "x"), strict=True
    )
    assert settings.is_disabled("ppe_cuda") and settings.is_disabled(None, "ppe-cuda")
    assert PluginSettings.from_env({}) == PluginSettings()


def test_blocked_first_party_plugin_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Uses the first-party plugins installed in this environment (README's set-up command).
    host = PluginHost(PluginSettings(autoload=True, disabled=("ppe-cuda",)))
    assert host.records["ppe_cuda"].status == "blocked"
    assert host.records["ppe_cpu"].status == "loaded"
    assert "cuda" not in host.runtimes
    with pytest.raises(RuntimeNotFoundError, match="blocked") as info:
        host.runtimes.get_runtime_class_for_device_spec("cuda:0")
    assert "ppe_cuda" in str(info.value)
    # A blocked plugin cannot sneak back in later either.
    import ppe_cuda.plugin

    assert host.pm.register(ppe_cuda.plugin, name="ppe_cuda") is None


def test_trace_switch_writes_hook_calls_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    host = PluginHost(PluginSettings(autoload=False, trace=True))
    host.pm.hook.ppe_environment_info()
    assert "ppe_environment_info" in capsys.readouterr().err


def test_default_device_asks_plugins_first_result_wins(
    plugin_host: PluginHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plugin_host.default_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert plugin_host.default_device() == "cuda"  # ppe_cuda answers before trylast ppe_cpu


def test_default_device_without_any_answer_explains_the_fix() -> None:
    host = PluginHost(PluginSettings(autoload=False))
    with pytest.raises(ConfigurationError, match="pip install ppe-cpu"):
        host.default_device()


def test_environment_info_collects_every_plugin(plugin_host: PluginHost) -> None:
    lines = plugin_host.environment_info()
    assert any(line.startswith("cpu:") for line in lines)
    assert any(line.startswith("cuda:") for line in lines)


def test_every_hook_is_documented_with_an_example() -> None:
    specs = [name for name in dir(hookspecs) if name.startswith("ppe_")]
    assert set(specs) >= {
        "ppe_register_runtimes",
        "ppe_register_logics",
        "ppe_register_extensions",
        "ppe_default_device",
        "ppe_trainer_setup",
        "ppe_trainer_teardown",
        "ppe_evaluator_setup",
        "ppe_evaluator_teardown",
        "ppe_environment_info",
    }
    for name in specs:
        doc = getattr(hookspecs, name).__doc__ or ""
        assert "Example::" in doc and "Called" in doc, name


def test_registration_specs_are_declared_historic() -> None:
    host = PluginHost(PluginSettings(autoload=False))
    for name in ("ppe_register_runtimes", "ppe_register_logics", "ppe_register_extensions"):
        assert getattr(host.pm.hook, name).is_historic()


def test_active_host_is_swappable_and_lazy() -> None:
    with ppe.testing.plugin_host(InlinePlugin()) as host:
        assert ppe.plugins.get_plugin_host() is host
        assert "inlinedev" in ppe.runtime.runtime_registry
    assert "inlinedev" not in ppe.runtime.runtime_registry


def test_plugin_names_must_be_unique_for_register(plugin_host: PluginHost) -> None:
    with pytest.raises(ConfigurationError, match="already registered"):
        plugin_host.register(InlinePlugin(), name="ppe_cpu")


# Real discovery: installed third-party distributions ------------------------------------------


def test_installed_plugins_are_discovered_in_process(
    installed_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(installed_plugins))
    with pytest.warns(PluginLoadWarning) as caught:
        host = PluginHost(PluginSettings(autoload=True))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "brokenplugin" in message and "ppe-brokenplugin 0.0.1" in message
    assert "libbroken" in message
    record = host.records["testdevice"]
    assert (record.status, record.distribution, record.version) == (
        "loaded",
        "ppe-testdevice",
        "1.2.3",
    )
    entry = host.runtimes.entries()["testdev"]
    assert entry.registrant.distribution == "ppe-testdevice"
    assert "CountIterations" in host.extensions and "testdev-logic" in host.logics
    assert host.records["brokenplugin"].status == "failed"


def test_disable_autoload_loads_no_entry_point(
    installed_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(installed_plugins))
    host = PluginHost(PluginSettings(autoload=False))  # no warning: broken plugin not loaded
    assert set(host.records) == {"ppe_core.logics", "ppe_extensions"}  # the standard set stays
    assert "testdev" not in host.runtimes
    explicit = PluginHost(PluginSettings(autoload=False, plugins=("testdevice",)))
    assert explicit.records["testdevice"].source == "PPE_PLUGINS"
    assert "testdev" in explicit.runtimes


def test_blocking_a_failing_plugin_silences_it(
    installed_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(installed_plugins))
    host = PluginHost(PluginSettings(disabled=("ppe-brokenplugin",)))
    assert host.records["brokenplugin"].status == "blocked"
    assert host.failures == []


def test_third_party_runtime_and_logic_drive_a_training_run(
    installed_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(installed_plugins))
    with ppe.testing.plugin_host(settings=PluginSettings(disabled=("brokenplugin",))):
        from ppe_testdevice import _impl, _logic

        _impl.CALLS.clear()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = model

            def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
                return {"loss": self.net(x).pow(2).mean()}

        wrapped = ppe.to(Wrapped(), "testdev")
        assert ("move_module", "Wrapped") in _impl.CALLS
        counter = ppe.training.extensions.CountIterations()
        trainer = ppe.engine.create_trainer(
            wrapped,
            torch.optim.SGD(wrapped.parameters(), lr=0.1),
            2,
            device="testdev",
            logic="testdev-logic",
            extensions=[counter],
            evaluator=ppe.engine.create_evaluator(wrapped, device="testdev"),
        )
        batches = [{"x": torch.randn(4, 4)} for _ in range(3)]
        trainer.run(batches, batches[:2])
        names = [name for name, _ in _impl.CALLS]
        assert names.count("train_pre_step") == names.count("train_post_step") == 6
        assert names.count("eval_pre_step") == names.count("eval_post_step") == 4
        assert _logic.TestDeviceLogic.steps == 6
        assert counter.iterations == [1, 2, 3, 4, 5, 6]


def test_cli_lists_installed_plugins_with_versions_and_failures(installed_plugins: Path) -> None:
    from helpers import run_python

    result = run_python("", path=installed_plugins, module="ppe_core plugins --json")
    assert result.returncode == 0, result.stderr
    import json

    report = json.loads(result.stdout)
    plugins = {p["name"]: p for p in report["plugins"]}
    assert plugins["testdevice"]["status"] == "loaded"
    assert (plugins["testdevice"]["distribution"], plugins["testdevice"]["version"]) == (
        "ppe-testdevice",
        "1.2.3",
    )
    assert plugins["brokenplugin"]["status"] == "failed"
    assert "libbroken" in plugins["brokenplugin"]["error"]
    assert plugins["ppe_core.logics"]["builtin"] is True
    assert plugins["ppe_extensions"]["distribution"] == "ppe-extensions"  # an entry point
    rows = {
        (section, row["name"]): row
        for section in ("runtimes", "logics", "extensions")
        for row in report[section]
    }
    for key in (
        ("runtimes", "testdev"),
        ("logics", "testdev-logic"),
        ("extensions", "CountIterations"),
    ):
        assert rows[key]["distribution"] == "ppe-testdevice" and rows[key]["version"] == "1.2.3"
    assert rows[("runtimes", "cpu")]["plugin"] == "ppe_cpu"
    for name in ("LogReport", "PrintReport", "ProgressBar", "snapshot", "LRScheduler"):
        assert rows[("extensions", name)]["plugin"] == "ppe_extensions"  # ppe-extensions' plugin
    assert rows[("logics", "default")]["plugin"] == "ppe_core.logics"
    # One warning for the broken plugin, on stderr, naming it.
    assert result.stderr.count("PluginLoadWarning") == 1
    assert "ppe-brokenplugin 0.0.1" in result.stderr

    table = run_python("", path=installed_plugins, module="ppe_core plugins")
    assert "testdev-logic" in table.stdout and "failed" in table.stdout


def test_import_survives_a_broken_plugin_and_autoload_switch(installed_plugins: Path) -> None:
    from helpers import run_python

    code = (
        "import warnings, ppe_core as ppe\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    names = ppe.runtime.runtime_registry.names()\n"
        "print(sorted(names), len([x for x in w if 'brokenplugin' in str(x.message)]))\n"
    )
    result = run_python(code, path=installed_plugins)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("]")[1].strip() == "1"
    assert "testdev" in result.stdout
    off = run_python(code, path=installed_plugins, env={"PPE_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "[] 0"
    strict = run_python(code, path=installed_plugins, env={"PPE_STRICT_PLUGINS": "1"})
    assert strict.returncode != 0 and "PluginLoadError" in strict.stderr
    assert "brokenplugin" in strict.stderr


def test_cli_info_prints_versions_and_plugin_lines(installed_plugins: Path) -> None:
    from helpers import run_python

    result = run_python(
        "",
        path=installed_plugins,
        module="ppe_core info",
        env={"PPE_DISABLED_PLUGINS": "brokenplugin"},
    )
    assert result.returncode == 0, result.stderr
    assert "torch: " in result.stdout and "ppe-core: 0.1.0" in result.stdout
    assert "testdev: simulated device, always available" in result.stdout
    assert "cuda: " in result.stdout


def test_a_broken_plugin_does_not_take_down_training_on_another_device(
    installed_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(installed_plugins))
    with pytest.warns(PluginLoadWarning, match="brokenplugin"):
        host = PluginHost(PluginSettings(autoload=True))
    previous = ppe.plugins.set_plugin_host(host)
    try:
        model = ppe.to(torch.nn.Linear(3, 1), "cpu")

        class Loss(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = model

            def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
                return {"loss": self.net(x).pow(2).mean()}

        wrapped = ppe.to(Loss(), "cpu")
        trainer = ppe.engine.create_trainer(
            wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1), 2
        )
        trainer.run([{"x": torch.randn(4, 3)} for _ in range(3)])
        assert trainer.iteration == 6
    finally:
        ppe.plugins.set_plugin_host(previous)


def test_static_extension_names_match_the_builtin_registrations(plugin_host: PluginHost) -> None:
    # The names type checkers see (TYPE_CHECKING imports) are exactly what the built-in
    # plugin registers, and resolve to the same objects at run time.
    import ast
    import inspect

    from ppe_extensions.plugin import EXTENSIONS

    import ppe_core.training.extensions as extensions_module

    tree = ast.parse(inspect.getsource(extensions_module))
    static = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ppe_extensions._")
        for alias in node.names
    }
    # Non-extension names (SnapshotMode) are module attributes, not registry entries.
    assert static == set(EXTENSIONS) | set(extensions_module._ATTRIBUTES)
    for name in EXTENSIONS:
        assert plugin_host.extensions.entries()[name].registrant.plugin == "ppe_extensions"
        assert getattr(ppe.training.extensions, name) is plugin_host.extensions.get(name)
