"""ppe-testing on its own: the kit and the emulated device with only ppe-core beside them.

These tests need no other package (no ppe-cpu, no numpy), so they also run in the new venv of
``test_ppe_testing_installs_alone.py``. The kit's tests against the first-party runtimes are in
the repository's ``tests/``.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from ppe_testing import (
    CHECKS,
    EMULATED_DEVICE,
    EmulatedDeviceRuntime,
    RuntimeTarget,
    enable_emulated_device,
    run_checks,
)

import ppe_core.testing
from ppe_core.errors import OptionalDependencyError
from ppe_core.plugins import PluginHost, PluginSettings

# Before any backward pass in this process (torch's autograd takes no new device type later).
enable_emulated_device()


@pytest.mark.parametrize("name", ["RuntimeConformance", "enable_emulated_device", "CHECKS"])
def test_the_old_core_path_says_where_the_kit_went(name: str) -> None:
    with pytest.raises(ImportError) as info:
        exec(f"from ppe_core.testing import {name}", {})  # the statement users wrote
    assert isinstance(info.value, OptionalDependencyError)
    message = str(info.value)
    assert "pip install ppe-testing" in message
    assert f"from ppe_testing import {name}" in message
    with pytest.raises(OptionalDependencyError, match="moved to the ppe-testing distribution"):
        getattr(ppe_core.testing, name)


def test_the_core_keeps_ppe_s_testing_names_and_plugin_host() -> None:
    state = {"w": torch.ones(2), "steps": [1, 2]}
    assert ppe_core.testing._compare_states(state, {"w": torch.ones(2), "steps": (1, 2)})
    assert not ppe_core.testing._compare_states(state, {"w": torch.zeros(2), "steps": [1, 2]})
    with ppe_core.testing.plugin_host() as host:
        assert isinstance(host, PluginHost)
    assert not hasattr(ppe_core.testing, "no_such_name")


def test_the_plugin_registers_through_the_ppe_core_entry_point_group() -> None:
    (entry,) = [ep for ep in entry_points(group="ppe_core") if ep.name == "ppe_testing"]
    assert entry.value == "ppe_testing.plugin"
    host = PluginHost(PluginSettings(autoload=False, plugins=("ppe_testing",)))
    record = host.records["ppe_testing"]
    assert (record.status, record.distribution) == ("loaded", "ppe-testing")
    (line,) = [line for line in host.environment_info() if line.startswith("testing:")]
    assert line.endswith(f"emulated device enabled as {EMULATED_DEVICE!r}")
    # It registers no runtime: the emulated device stays opt-in (runtime_class=...).
    assert EMULATED_DEVICE not in host.runtimes


def test_the_kit_passes_the_emulated_device_runtime(tmp_path: Path) -> None:
    names = ["module_move", "convert_batch", "training_matches_reference"]
    results = run_checks(RuntimeTarget(EMULATED_DEVICE, EmulatedDeviceRuntime), names, tmp_path)
    assert [(r.name, r.passed, r.message) for r in results] == [(n, True, "") for n in names]
    assert set(names) < set(CHECKS)


def test_the_core_names_every_name_the_kit_exports() -> None:
    # ppe_core cannot import ppe_testing, so it keeps its own list of the moved names (the kit
    # and the emulated device, once ppe_core.testing's): the two must not drift apart (a name
    # missing from the core's list would lose its message). Names new in ppe-testing, such as
    # check_installs_alone, were never the core's.
    from ppe_testing import _conformance, _emulated

    from ppe_core import testing

    assert {*_conformance.__all__, *_emulated.__all__} == testing._MOVED_TO_PPE_TESTING
