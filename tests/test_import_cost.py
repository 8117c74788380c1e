"""Start-up stays cheap: what ``import ppe_core`` and plugin discovery import (structurally).

No timed assertions: the benchmark suite (``python -m benchmarks --only import``) measures time;
these tests check the cause of slow start-ups, modules imported too early.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import ppe_core as ppe
from ppe_core._plugins import PluginHost
from ppe_core._registry import LazyTarget, Registry
from ppe_core.errors import ArgumentTypeError, DuplicateRegistrationError, PluginLoadError

_PROBE = """
import json, sys
import torch
before = set(sys.modules)
import ppe_core as ppe
ppe.runtime.runtime_registry.names()   # discovery: every first-party plugin loads
names = ppe.runtime.runtime_registry.names()
new = sorted(set(sys.modules) - before)
# A tracker looked up by name loads then (and only then).
trackers = [ppe.training.extensions.MLflowLogger.__module__,
            ppe.plugins.get_plugin_host().extensions.get("WandbLogger").__module__]
print(json.dumps({"new": new, "runtimes": names, "trackers": trackers,
                  "loaded": [m for m in trackers if m in sys.modules]}))
"""

#: Module prefixes that must not load before they are used.
_HEAVY = (
    "tqdm",
    "matplotlib",
    "tensorboard",
    "torch.utils.tensorboard",
    "torch._dynamo",
    "torch.distributed.elastic",
    "ppe_core.training",
    "ppe_core.handler",
    "ppe_core.writing",
    "ppe_core.engine",
    "ppe_core._reporting",
    "ppe_core.config",
    "ppe_extensions.tracking",
    "ppe_mlflow._logger",
    "ppe_wandb._logger",
    "mlflow",
    "wandb",
    "yaml",
)

#: Every first-party plugin (ppe-core's own extras), so their discovery cost is counted too.
FIRST_PARTY_PLUGINS = "ppe_cpu,ppe_cuda,ppe_mlflow,ppe_wandb"


def _probe() -> dict[str, Any]:
    # Only the first-party plugins: another installed plugin's imports are not ppe-core's.
    env = {**os.environ, "PPE_DISABLE_PLUGIN_AUTOLOAD": "1", "PPE_PLUGINS": FIRST_PARTY_PLUGINS}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env=env
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_import_and_discovery_load_no_training_or_heavy_module() -> None:
    """With every first-party plugin (trackers included), discovery imports only their
    ``plugin`` modules; a tracker's module loads at its first lookup."""
    result = _probe()
    assert {"cpu", "cuda"} <= set(result["runtimes"])  # discovery did run
    for plugin in FIRST_PARTY_PLUGINS.split(","):
        assert f"{plugin}.plugin" in result["new"]
    early = [m for m in result["new"] if m == "numpy" or m.startswith(_HEAVY)]
    assert early == [], f"imported by `import ppe_core` + discovery: {early}"
    assert result["trackers"] == ["ppe_mlflow._logger", "ppe_wandb._logger"]
    assert result["loaded"] == result["trackers"]


def test_builtin_names_are_registered_lazily_and_resolve_on_first_lookup() -> None:
    host = PluginHost(load=False)
    host.load()
    entry = host.extensions._entries["LogReport"]
    assert type(entry.obj) is LazyTarget  # not imported by discovery
    log_report = host.extensions.get("LogReport")
    from ppe_extensions._log_report import LogReport

    assert log_report is LogReport
    assert host.extensions._entries["LogReport"].obj is LogReport  # resolved once, kept
    assert host.extensions.entries()["LogReport"].registrant.plugin == "ppe_extensions"
    assert host.logics.get("default") is ppe.handler.Logic


def test_entries_view_resolves_every_lazy_name() -> None:
    registry: Registry[Any] = Registry("logic")
    registry.register_lazy("json", "json:dumps")
    assert "json" in registry and registry.names() == ["json"]
    assert registry.entries()["json"].obj is json.dumps


def test_lazy_target_that_fails_to_import_names_the_registrant() -> None:
    registry: Registry[Any] = Registry("extension")
    registry.register_lazy("Broken", "ppe_core_no_such_module:Thing")
    with pytest.raises(PluginLoadError, match=r"extension 'Broken'.*ppe_core_no_such_module"):
        registry.get("Broken")
    registry.register_lazy("Missing", "json:no_such_attribute")
    with pytest.raises(PluginLoadError, match="no_such_attribute"):
        registry.get("Missing")


def test_lazy_registration_keeps_duplicate_and_validation_rules() -> None:
    registry: Registry[Any] = Registry("logic")
    registry.register_lazy("dump", "json:dumps")
    with pytest.raises(DuplicateRegistrationError, match="already registered"):
        registry.register("dump", print)
    with pytest.raises(ArgumentTypeError, match=r"package\.module:attribute"):
        registry.register_lazy("other", "json.dumps")
    registry.register("dump", print, replace=True)
    assert registry.get("dump") is print
    assert registry.unregister("dump") is print
    assert registry.get("dump") is json.dumps  # the lazy entry it replaced comes back
