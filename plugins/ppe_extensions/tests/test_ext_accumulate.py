"""The accumulate extensions (AverageAccumulate, ...), used as PPE code uses them."""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

import ppe_core as ppe

ITERS_PER_EPOCH = 6
EPOCHS = 5

# Class name -> what the reported value must equal for the values of one interval.
EXPECTED: dict[str, Callable[[list[float]], float]] = {
    "AverageAccumulate": statistics.mean,
    "StandardDeviationAccumulate": statistics.pstdev,
    "UnbiasedStandardDeviationAccumulate": lambda v: (
        statistics.stdev(v) if len(v) > 1 else math.nan
    ),
    "MaxAccumulate": max,
    "MinAccumulate": min,
}
TRIGGERS = [(1, "epoch"), (0.25, "epoch"), (7, "iteration"), (1, "iteration")]


def _reference() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPE warns about optional packages at import
        return importlib.import_module("pytorch_pfn_extras")


def _values(seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(0, 100) for _ in range(ITERS_PER_EPOCH * EPOCHS)]


def _run(
    lib: ModuleType, name: str, trigger: Any, values: list[Any], **kwargs: Any
) -> list[tuple[int, float]]:
    """Reports one value per iteration; returns (iteration, accumulated) whenever reported."""
    extension = getattr(lib.training.extensions, name)(
        conversion_key_pair=("value", "value/acc"), trigger=trigger, **kwargs
    )
    manager = lib.training.ExtensionsManager({}, {}, EPOCHS, iters_per_epoch=ITERS_PER_EPOCH)
    manager.extend(extension, trigger=(1, "iteration"))
    reported = []
    for value in values:
        with manager.run_iteration():
            lib.reporting.report({"value": value})
        if "value/acc" in manager.observation:
            reported.append((manager.iteration, float(manager.observation["value/acc"])))
    return reported


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("trigger", TRIGGERS)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reports_the_statistic_of_each_interval_like_ppe(name: str, trigger: Any) -> None:
    values = _values()
    ours = _run(ppe, name, trigger, values)
    fired = ppe.training.triggers.get_trigger(trigger)
    expected_at = [i for i in range(1, len(values) + 1) if fired.may_fire(i, ITERS_PER_EPOCH)]
    assert [i for i, _ in ours] == expected_at
    start = 0
    for iteration, value in ours:
        assert _same(value, EXPECTED[name](values[start:iteration])), (iteration, value)
        start = iteration
    theirs = _run(_reference(), name, trigger, values)
    assert [i for i, _ in theirs] == [i for i, _ in ours]
    assert all(_same(a, b) for (_, a), (_, b) in zip(ours, theirs, strict=True))


def test_default_trigger_is_one_epoch_and_the_extension_runs_every_iteration() -> None:
    ext = ppe.training.extensions.AverageAccumulate(("value", "value/acc"))
    ref = _reference().training.extensions.AverageAccumulate(("value", "value/acc"))
    assert ext.trigger == ref.trigger == (1, "iteration")
    assert ext.priority == ref.priority == ppe.training.PRIORITY_EDITOR
    assert ext.default_name == "AverageAccumulate"
    values = _values()
    manager = ppe.training.ExtensionsManager({}, {}, EPOCHS, iters_per_epoch=ITERS_PER_EPOCH)
    manager.extend(ext)
    means = []
    for value in values:
        with manager.run_iteration():
            ppe.reporting.report({"value": value})
        if "value/acc" in manager.observation:
            means.append(manager.observation["value/acc"])
    assert means == pytest.approx(
        [statistics.mean(values[i : i + ITERS_PER_EPOCH]) for i in range(0, 30, 6)]
    )


def test_log_report_logs_the_accumulated_value(tmp_path: Path) -> None:
    values = _values(1)
    manager = ppe.training.ExtensionsManager(
        {}, {}, EPOCHS, iters_per_epoch=ITERS_PER_EPOCH, out_dir=str(tmp_path)
    )
    manager.extend(ppe.training.extensions.MaxAccumulate(("value", "value/max")))
    manager.extend(ppe.training.extensions.LogReport(filename="log.json"))
    for value in values:
        with manager.run_iteration():
            ppe.reporting.report({"value": value})
    log = json.loads((tmp_path / "log.json").read_text())
    assert [entry["value/max"] for entry in log] == [
        max(values[i : i + 6]) for i in range(0, 30, 6)
    ]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tensor_values_stay_tensors_on_their_device(name: str) -> None:
    values = _values(2)[:ITERS_PER_EPOCH]
    tensors = [torch.tensor(v, dtype=torch.float64) for v in values]
    manager = ppe.training.ExtensionsManager({}, {}, 1, iters_per_epoch=ITERS_PER_EPOCH)
    manager.extend(getattr(ppe.training.extensions, name)(("value", "value/acc")))
    for value in tensors:
        with manager.run_iteration():
            ppe.reporting.report({"value": value})
    result = manager.observation["value/acc"]
    assert isinstance(result, torch.Tensor) and result.device == tensors[0].device
    assert _same(float(result), EXPECTED[name](values))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_state_dict_has_ppe_keys_and_resumes_mid_interval(name: str) -> None:
    values = _values(3)[: 2 * ITERS_PER_EPOCH]

    def manager_with(extension: Any) -> Any:
        manager = ppe.training.ExtensionsManager({}, {}, 2, iters_per_epoch=ITERS_PER_EPOCH)
        manager.extend(extension, name="acc")
        return manager

    cls = getattr(ppe.training.extensions, name)
    first = manager_with(cls(("value", "value/acc")))
    for value in values[:8]:  # stop in the middle of the second epoch
        with first.run_iteration():
            ppe.reporting.report({"value": value})
    state = first.state_dict()
    ours = state["extensions"]["acc"]["extension"]
    reference = getattr(_reference().training.extensions, name)(("value", "value/acc"))
    assert ours.keys() == reference.state_dict().keys() == {"_trigger", "_summary"}
    assert ours["_summary"].keys() == reference.state_dict()["_summary"].keys()

    resumed = manager_with(cls(("value", "value/acc")))
    resumed.load_state_dict(state)
    for value in values[8:]:
        with resumed.run_iteration():
            ppe.reporting.report({"value": value})
    assert _same(float(resumed.observation["value/acc"]), EXPECTED[name](values[6:]))


@pytest.fixture
def gloo_world(tmp_path: Path) -> Any:
    """A single-process gloo group (world size 1), torn down after the test."""
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("gloo_world")
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_distributed_in_a_one_process_group_matches_local(name: str) -> None:
    values = _values(4)
    local = _run(ppe, name, (1, "epoch"), values)
    distributed = _run(ppe, name, (1, "epoch"), values, distributed=True)
    assert [i for i, _ in distributed] == [i for i, _ in local]
    assert all(_same(a, b) for (_, a), (_, b) in zip(distributed, local, strict=True))


@pytest.mark.usefixtures("gloo_world")
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_distributed_combines_every_rank(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second rank whose interval held the values 200 and 300 (or held nothing at all).
    from ppe_extensions import _accumulate as _env

    cls = getattr(ppe.training.extensions, name)
    other = cls(("value", "value/acc"))
    for value in (200.0, 300.0):
        other._summary.add(value)
    empty = cls(("value", "value/acc"))
    real = _env.gather_objects
    monkeypatch.setattr(
        _env,
        "gather_objects",
        lambda obj: [*real(obj), other._summary.state_dict(), empty._summary.state_dict()],
    )
    values = _values(5)
    reported = _run(ppe, name, (1, "epoch"), values, distributed=True)
    expected = EXPECTED[name]([*values[:ITERS_PER_EPOCH], 200.0, 300.0])
    assert _same(reported[0][1], expected)


def test_distributed_needs_an_initialised_process_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        ppe.training.extensions.AverageAccumulate(("value", "acc"), distributed=True)


def test_missing_source_key_is_a_key_error_naming_the_key_and_the_fix() -> None:
    manager = ppe.training.ExtensionsManager({}, {}, 1, iters_per_epoch=2)
    manager.extend(ppe.training.extensions.MinAccumulate(("val/loss", "val/loss/min")))
    expected = r"no 'val/loss' in the observation of iteration 1 \(keys: "
    with pytest.raises(KeyError, match=expected), manager.run_iteration():
        ppe.reporting.report({"train/loss": 1.0})


def test_conversion_key_pair_must_be_a_pair_of_keys() -> None:
    with pytest.raises(TypeError, match="conversion_key_pair must be"):
        ppe.training.extensions.MaxAccumulate("value")  # type: ignore[arg-type]


def test_ppe_module_paths() -> None:
    from ppe_core.training.extensions.accumulate import (
        AverageAccumulate,
        MaxAccumulate,
        MinAccumulate,
        StandardDeviationAccumulate,
        UnbiasedStandardDeviationAccumulate,
    )
    from ppe_core.training.extensions.accumulate._accumulate_base import AccumulateBase

    for cls in (
        AverageAccumulate,
        MaxAccumulate,
        MinAccumulate,
        StandardDeviationAccumulate,
        UnbiasedStandardDeviationAccumulate,
    ):
        assert issubclass(cls, AccumulateBase)
        assert getattr(ppe.training.extensions, cls.__name__) is cls
