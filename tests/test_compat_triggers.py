"""PPE 0.9 compatibility of ``ppe.training.triggers``: the same code run with PPE and ppe-core.

The value triggers (best/min/max value, early stopping) average the monitored value over each
check interval, as PPE's do; these tests drive both libraries' managers with the same reported
sequence and compare where the triggers fire and where training stops.
"""

from __future__ import annotations

import importlib
import inspect
import io
import types
from typing import Any

import pytest
import torch

import ppe_core as ppe


def _ppe() -> types.ModuleType:
    import pytorch_pfn_extras

    return pytorch_pfn_extras


LIBRARIES = ["ppe_core", "pytorch_pfn_extras"]


def _lib(name: str) -> Any:
    return ppe if name == "ppe_core" else _ppe()


def _manager(lib: Any, iters_per_epoch: int, **kwargs: Any) -> Any:
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return lib.training.ExtensionsManager(
        {"main": model}, {"main": optimizer}, 100, iters_per_epoch=iters_per_epoch, **kwargs
    )


# Per-iteration losses whose last value in an interval often disagrees with the interval mean:
# read at the check iteration only, the early-stopping decision would differ.
LOSSES = [5.0, 1.0, 2.0, 3.0, 0.5, 4.0, 2.0, 2.2, 2.0, 2.1, 2.6, 2.0, 2.8, 2.4, 3.0, 3.0] * 2


def _train_until_stop(lib: Any, losses: list[float], iters_per_epoch: int, **kwargs: Any) -> Any:
    trigger = lib.training.triggers.EarlyStoppingTrigger(**kwargs)
    manager = _manager(lib, iters_per_epoch, stop_trigger=trigger)
    values = iter(losses)
    while not manager.stop_trigger:
        with manager.run_iteration():
            lib.reporting.report({"main/loss": torch.tensor(next(values))})
    return manager.iteration


@pytest.mark.parametrize(
    ("iters_per_epoch", "kwargs", "expected"),
    [
        # Epoch means 3, 2.5, 2.25, 2.1, 2.05, 2.3, 2.6: the 2nd miss is at epoch 7. Read at
        # the check iterations only (1, 3, 4, ...), it would have stopped at epoch 3.
        (2, {"patience": 2}, 14),
        # Means of 3 iterations: 2.67, 2.5, 2.07, 2.23 (a miss).
        (2, {"patience": 1, "check_trigger": (3, "iteration")}, 12),
        # Epoch means 2.75, 2.175, 2.175 (not better).
        (4, {"patience": 1, "check_trigger": (1, "epoch")}, 12),
        (2, {"patience": 3, "max_trigger": (5, "iteration")}, 5),
    ],
)
def test_early_stopping_stops_where_ppe_stops(
    iters_per_epoch: int, kwargs: dict[str, Any], expected: int
) -> None:
    stops = [_train_until_stop(_lib(n), LOSSES, iters_per_epoch, **kwargs) for n in LIBRARIES]
    assert stops == [expected, expected]


def test_early_stopping_uses_the_interval_mean_not_the_last_value() -> None:
    # Epoch means 3, 2, 1.5 keep improving; the epochs' last values 1, 2, 3 get worse.
    losses = [5.0, 1.0, 2.0, 2.0, 0.0, 3.0] + [9.0] * 10
    for name in LIBRARIES:
        assert _train_until_stop(_lib(name), losses, 2, patience=2) == 10


@pytest.mark.parametrize(
    ("kind", "check", "iters_per_epoch"),
    [
        ("min", (1, "epoch"), 2),
        ("max", (1, "epoch"), 3),
        ("min", (3, "iteration"), 2),
        ("best", (2, "iteration"), 5),
    ],
)
def test_value_triggers_fire_where_ppe_fires(
    kind: str, check: tuple[int, str], iters_per_epoch: int
) -> None:
    def fired(lib: Any) -> list[int]:
        triggers = lib.training.triggers
        if kind == "min":
            trigger = triggers.MinValueTrigger("main/loss", check)
        elif kind == "max":
            trigger = triggers.MaxValueTrigger("main/loss", check)
        else:
            trigger = triggers.BestValueTrigger(
                "main/loss", lambda best, new: abs(new - 2.5) < abs(best - 2.5), check
            )
        manager = _manager(lib, iters_per_epoch)
        calls: list[int] = []
        manager.extend(lambda m: calls.append(m.iteration), name="record", trigger=trigger)
        for loss in LOSSES[:24]:
            with manager.run_iteration():
                lib.reporting.report({"main/loss": torch.tensor(loss)})
        return calls

    ours, theirs = fired(ppe), fired(_ppe())
    assert ours == theirs and ours


def _drive(trigger: Any, manager: Any, values: list[Any], key: str) -> list[bool]:
    """PPE's way of testing triggers: set the observation after each iteration, then call."""
    results = []
    for value in values:
        with manager.run_iteration():
            pass
        manager.observation = {key: value}
        results.append(bool(trigger(manager)))
    return results


def _roundtrip(state: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("writer", LIBRARIES)
def test_min_value_state_saved_mid_interval_resumes_in_either_library(writer: str) -> None:
    values = [0.5, 0.5, 0.4, 0.3, 0.6, 0.2, 0.5, 0.1, 0.3]
    reader = "pytorch_pfn_extras" if writer == "ppe_core" else "ppe_core"
    expected = _drive(
        _ppe().training.triggers.MinValueTrigger("k", (2, "iteration")),
        _manager(_ppe(), 1),
        values,
        "k",
    )
    first = _lib(writer).training.triggers.MinValueTrigger("k", (2, "iteration"))
    manager = _manager(_lib(reader), 1)
    head = _drive(first, _manager(_lib(writer), 1), values[:5], "k")  # one value pending
    state = _roundtrip(first.state_dict())
    assert set(state) == {"interval_trigger", "_summary", "_best_value"}
    resumed = _lib(reader).training.triggers.MinValueTrigger("k", (2, "iteration"))
    resumed.load_state_dict(state)
    for _ in range(5):
        with manager.run_iteration():
            pass
    assert head + _drive(resumed, manager, values[5:], "k") == expected


def test_early_stopping_loads_ppe_state_and_keeps_its_own() -> None:
    key = "main/loss"
    values = [torch.tensor(v) for v in [100.0, 80.0, 30.0, 10.0, 20.0, 24.0, 30.0, 35.0]]
    theirs = _ppe().training.triggers.EarlyStoppingTrigger(monitor=key, patience=3)
    expected = _drive(theirs, _manager(_ppe(), 1), values, key)
    assert expected == [False] * 6 + [True, True]
    ours = ppe.training.triggers.EarlyStoppingTrigger(monitor=key, patience=3)
    ours.load_state_dict(_roundtrip(theirs.state_dict()))  # PPE saves {}: a fresh trigger
    manager = _manager(ppe, 1)
    assert _drive(ours, manager, values[:5], key) == expected[:5]
    state = _roundtrip(ours.state_dict())
    assert (state["best"], state["count"]) == (10.0, 1)
    resumed = ppe.training.triggers.EarlyStoppingTrigger(monitor=key, patience=3)
    resumed.load_state_dict(state)
    assert _drive(resumed, manager, values[5:], key) == expected[5:]


def test_value_triggers_do_not_synchronize_device_tensors_between_checks() -> None:
    # Meta tensors have no data: reading one on the host raises. Between checks the triggers
    # only buffer the reported tensors.
    manager = _manager(ppe, 1000)
    triggers = [
        ppe.training.triggers.MinValueTrigger("main/loss"),
        ppe.training.triggers.EarlyStoppingTrigger(monitor="main/loss"),
    ]
    for _ in range(300):
        with manager.run_iteration():
            pass
        manager.observation = {"main/loss": torch.zeros((), device="meta")}
        assert not any(trigger(manager) for trigger in triggers)
    with pytest.raises(NotImplementedError):
        triggers[0].state_dict()  # the interval's values reach the host only now


CLASSES = [
    "BestValueTrigger",
    "EarlyStoppingTrigger",
    "FunctionTrigger",
    "IntervalTrigger",
    "ManualScheduleTrigger",
    "MaxValueTrigger",
    "MinValueTrigger",
    "OnceTrigger",
    "TimeTrigger",
]


@pytest.mark.parametrize("name", CLASSES)
def test_constructor_parameters_and_defaults_match_ppe(name: str) -> None:
    def parameters(cls: type) -> list[tuple[str, Any]]:
        signature = inspect.signature(cls)
        return [(p.name, p.default) for p in signature.parameters.values()]

    ours = getattr(ppe.training.triggers, name)
    theirs = getattr(_ppe().training.triggers, name)
    assert parameters(ours) == parameters(theirs)


def _state_keys(lib: Any) -> dict[str, set[str]]:
    triggers = lib.training.triggers
    made = {
        "BestValueTrigger": triggers.BestValueTrigger("k", lambda best, new: new < best),
        "MinValueTrigger": triggers.MinValueTrigger("k"),
        "MaxValueTrigger": triggers.MaxValueTrigger("k"),
        "FunctionTrigger": triggers.FunctionTrigger(lambda: True),
        "IntervalTrigger": triggers.IntervalTrigger(2, "iteration"),
        "ManualScheduleTrigger": triggers.ManualScheduleTrigger([1, 3], "epoch"),
        "OnceTrigger": triggers.OnceTrigger(),
        "TimeTrigger": triggers.TimeTrigger(10.0),
    }
    return {name: set(trigger.state_dict()) for name, trigger in made.items()}


def test_state_dict_keys_match_ppe() -> None:
    assert _state_keys(ppe) == _state_keys(_ppe())


@pytest.mark.parametrize(
    "module",
    [
        "early_stopping_trigger",
        "function_trigger",
        "interval_trigger",
        "manual_schedule_trigger",
        "minmax_value_trigger",
        "once_trigger",
        "time_trigger",
    ],
)
def test_ppe_trigger_module_paths_import(module: str) -> None:
    theirs = importlib.import_module(f"pytorch_pfn_extras.training.triggers.{module}")
    ours = importlib.import_module(f"ppe_core.training.triggers.{module}")
    classes = [n for n, v in vars(theirs).items() if isinstance(v, type) and n.endswith("Trigger")]
    defined = [n for n in classes if getattr(theirs, n).__module__ == theirs.__name__]
    assert defined
    for name in defined:
        assert getattr(ours, name) is getattr(ppe.training.triggers, name)
    assert getattr(ppe.training.triggers, module) is ours


def test_training_trigger_module_alias() -> None:
    from ppe_core.training import trigger

    for name in ("IntervalTrigger", "Trigger", "TriggerFunc", "TriggerLike", "get_trigger"):
        assert hasattr(_ppe().training.trigger, name)
        assert getattr(trigger, name) is getattr(ppe.training.triggers, name)
    assert ppe.training.trigger is trigger
    assert isinstance(trigger.get_trigger((1, "epoch")), trigger.IntervalTrigger)
