"""Issue 42, item 12: a state from a newer ppe-core warns naming both versions, and a state
that differs from the model only by torch.compile's ``_orig_mod.`` prefix says so."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core
from ppe_core.errors import SnapshotError, StateDictMismatchError, StateVersionWarning
from ppe_core.training import ExtensionsManager

E = ppe_core.training.extensions


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)
        self.out = torch.nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(x))


def _manager(
    model: torch.nn.Module, out: Path | str = "unused", **kwargs: Any
) -> ExtensionsManager:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return ExtensionsManager(model, optimizer, 1, iters_per_epoch=2, out_dir=str(out), **kwargs)


def _newer(version: str) -> str:
    major, minor, *_ = (int(part) for part in version.split("."))
    return f"{major}.{minor + 1}.0"


def test_a_state_from_a_newer_ppe_core_warns_naming_both_versions() -> None:
    state = _manager(Net()).state_dict()
    newer = _newer(ppe_core.__version__)
    state["_ppe_core"]["version"] = newer
    with pytest.warns(StateVersionWarning) as record:
        _manager(Net()).load_state_dict(state)
    assert len(record) == 1
    message = str(record[0].message)
    assert f"ppe-core {newer}" in message and f"this ppe-core ({ppe_core.__version__})" in message
    assert "newer" in message and f"upgrade ppe-core to {newer}" in message
    assert record[0].filename == __file__  # points at the load_state_dict call
    for version in ["0.0.1", ppe_core.__version__]:  # an older one's or this one's: silent
        state["_ppe_core"]["version"] = version
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _manager(Net()).load_state_dict(state)


def test_an_unreadable_ppe_core_version_warns_as_unknown() -> None:
    state = _manager(Net()).state_dict()
    state["_ppe_core"]["version"] = "nightly"
    with pytest.warns(
        StateVersionWarning, match=r"ppe-core 'nightly', which this ppe-core \(.*\) cannot compare"
    ):
        _manager(Net()).load_state_dict(state)


# --------------------------------------------------------------------- torch.compile prefix

# Importing dynamo the first time in a process warns about torch.jit (as in test_compile.py).
_DYNAMO_IMPORT = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


@_DYNAMO_IMPORT
def test_resuming_a_compiled_model_s_snapshot_without_compile_names_compile(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    compiled = torch.compile(Net())  # a wrapper: its state keys start with '_orig_mod.'
    saving = _manager(compiled, tmp_path)  # type: ignore[arg-type]
    saving.extend(E.snapshot(), trigger=(1, "iteration"))
    with saving.run_iteration():
        pass
    saving.finalize()
    assert (tmp_path / "snapshot_iter_1").exists()

    resuming = _manager(Net(), tmp_path, extensions=[E.snapshot(autoload=True)])
    with pytest.raises(SnapshotError) as info, resuming.run_iteration():
        pass
    message = str(info.value)
    assert "'_orig_mod.'" in message and "torch.compile" in message
    assert "compiled as when it was saved" in message and "strip the prefix" in message
    assert "model.compile()" in message  # compiling in place keeps the keys
    assert isinstance(info.value.__cause__, StateDictMismatchError)


@_DYNAMO_IMPORT
def test_resuming_an_uncompiled_snapshot_into_a_compiled_model_names_compile() -> None:
    state = _manager(Net()).state_dict()
    compiled = torch.compile(Net())
    with pytest.raises(StateDictMismatchError) as info:
        _manager(compiled).load_state_dict(state)  # type: ignore[arg-type]
    message = str(info.value)
    assert "The model's keys carry '_orig_mod.'" in message and "torch.compile" in message
    assert "._orig_mod" in message  # pass the uncompiled module
    assert "same architecture" not in message  # it is the same architecture
    # Another architecture's state is explained as before, without compile.
    with pytest.raises(StateDictMismatchError) as info:
        _manager(torch.nn.Linear(2, 1)).load_state_dict(state)
    assert "_orig_mod" not in str(info.value) and "compile" not in str(info.value)
    assert "same architecture" in str(info.value)
