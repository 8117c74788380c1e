"""Tests for ppe_core.training.triggers, driven by a fake ManagerView."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pytest
import torch

from ppe_core.errors import ConfigurationError
from ppe_core.training.triggers import (
    NEVER,
    BestValueTrigger,
    EarlyStoppingTrigger,
    FunctionTrigger,
    IntervalTrigger,
    ManualScheduleTrigger,
    MaxValueTrigger,
    MinValueTrigger,
    MissingObservationWarning,
    OnceTrigger,
    TimeTrigger,
    Trigger,
    TriggerTypeError,
    get_trigger,
)

Observations = Callable[[int], dict[str, Any]]


@dataclass
class FakeManager:
    """The ManagerView fields triggers read; ``iteration`` counts completed iterations."""

    iters_per_epoch: int
    iteration: int = 0
    observation: dict[str, Any] = field(default_factory=dict)
    elapsed_time: float = 0.0
    models: Mapping[str, torch.nn.Module] = field(default_factory=dict)
    optimizers: Mapping[str, torch.optim.Optimizer] = field(default_factory=dict)
    out: str = "result"

    @property
    def epoch(self) -> int:
        return self.iteration // self.iters_per_epoch

    @property
    def epoch_detail(self) -> float:
        return self.iteration / self.iters_per_epoch

    @property
    def is_before_training(self) -> bool:
        return self.iteration == 0


def _no_observations(iteration: int) -> dict[str, Any]:
    return {}


def fire_every_step(
    trigger: Trigger,
    iters_per_epoch: int,
    stop: int,
    observe: Observations = _no_observations,
    start: int = 0,
) -> list[int]:
    """Calls the trigger after every iteration in (start, stop]; returns where it fired."""
    manager = FakeManager(iters_per_epoch)
    fired = []
    for it in range(start + 1, stop + 1):
        manager.iteration = it
        manager.observation = observe(it)
        if trigger(manager):
            fired.append(it)
    return fired


def fire_by_next_check(
    trigger: Trigger,
    iters_per_epoch: int,
    stop: int,
    observe: Observations = _no_observations,
    start: int = 0,
) -> list[int]:
    """Calls the trigger only where next_check says, as the manager does."""
    manager = FakeManager(iters_per_epoch)
    fired = []
    due = trigger.next_check(start, iters_per_epoch)
    for it in range(start + 1, stop + 1):
        if due is not None and it < due:
            continue
        manager.iteration = it
        manager.observation = observe(it)
        if trigger(manager):
            fired.append(it)
        due = trigger.next_check(it, iters_per_epoch)
        assert due is None or due > it
    return fired


def _roundtrip(state: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _expected_interval(period: Fraction, iters_per_epoch: int, stop: int) -> list[int]:
    """Oracle: every boundary k * period (in iterations) fires at the iteration reaching it."""
    found = set()
    k = 1
    while k * period * iters_per_epoch <= stop:
        found.add(math.ceil(k * period * iters_per_epoch))
        k += 1
    return sorted(found)


# --- IntervalTrigger -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("period", "unit", "iters_per_epoch", "expected"),
    [
        (1, "iteration", 7, list(range(1, 13))),
        (3, "iteration", 7, [3, 6, 9, 12]),
        (1, "epoch", 4, [4, 8, 12]),
        (2, "epoch", 3, [6, 12]),
        (0.5, "epoch", 5, [3, 5, 8, 10]),  # boundaries 2.5, 5, 7.5, 10
        (1 / 3, "epoch", 4, [2, 3, 4, 6, 7, 8, 10, 11, 12]),
        (1.5, "epoch", 4, [6, 12]),
        (0.25, "epoch", 10, [3, 5, 8, 10, 13]),
        (0.1, "epoch", 5, list(range(1, 13))),  # two boundaries per iteration: fires once
    ],
)
def test_interval_trigger_fires_at_the_iteration_crossing_each_boundary(
    period: float, unit: str, iters_per_epoch: int, expected: list[int]
) -> None:
    stop = max(expected[-1], 12)
    fired = fire_every_step(IntervalTrigger(period, unit), iters_per_epoch, stop)
    assert fired == [i for i in expected if i <= stop]


def test_interval_trigger_never_fires_before_training() -> None:
    trigger = IntervalTrigger(1, "iteration")
    assert not trigger(FakeManager(5, iteration=0))
    assert not trigger.may_fire(0, 5)


PERIODS = [(Fraction(p), "iteration") for p in (1, 2, 3, 7)] + [
    (Fraction(p), "epoch")
    for p in ("0.1", "0.25", "1/3", "0.5", "0.7", "2/3", "1", "1.5", "2", "2.5", "5/7")
]


@pytest.mark.parametrize(("period", "unit"), PERIODS)
@pytest.mark.parametrize("iters_per_epoch", [1, 2, 3, 4, 5, 7, 10, 13])
def test_interval_next_check_agrees_with_calling_every_step(
    period: Fraction, unit: str, iters_per_epoch: int
) -> None:
    stop = 60
    value = int(period) if unit == "iteration" else float(period)
    trigger = IntervalTrigger(value, unit)
    every = fire_every_step(trigger, iters_per_epoch, stop)
    assert every == _expected_interval(period, 1 if unit == "iteration" else iters_per_epoch, stop)
    assert fire_by_next_check(trigger, iters_per_epoch, stop) == every
    assert [i for i in range(1, stop + 1) if trigger.may_fire(i, iters_per_epoch)] == every
    # Resuming mid-way (a fresh trigger, any start) gives the rest of the same sequence.
    for start in (5, 17, 33):
        rest = [i for i in every if i > start]
        resumed = IntervalTrigger(value, unit)
        resumed.load_state_dict(_roundtrip(trigger.state_dict()))
        assert fire_by_next_check(resumed, iters_per_epoch, stop, start=start) == rest


def test_interval_trigger_describes_itself_and_its_training_length() -> None:
    trigger = IntervalTrigger(0.5, "epoch")
    assert trigger.get_training_length() == (0.5, "epoch")
    assert repr(trigger) == "IntervalTrigger(0.5, 'epoch')"


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((1, "epochs"), ConfigurationError, "did you mean 'epoch'"),
        ((1, "minute"), ConfigurationError, "'epoch' or 'iteration', got 'minute'"),
        (("epoch", 1), TriggerTypeError, r"unit must be the string.*\(period, unit\)"),
        (("1", "epoch"), TriggerTypeError, "period must be a positive int or float, got str"),
        ((True, "epoch"), TriggerTypeError, "got bool"),
        ((0, "epoch"), ConfigurationError, "> 0, got 0"),
        ((-2, "iteration"), ConfigurationError, "> 0"),
        ((math.inf, "epoch"), ConfigurationError, "finite"),
        ((2.5, "iteration"), ConfigurationError, "whole number.*unit='epoch'"),
    ],
)
def test_interval_trigger_rejects_bad_arguments(
    args: tuple[Any, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        IntervalTrigger(*args)


def test_epoch_trigger_needs_a_positive_epoch_length() -> None:
    with pytest.raises(ConfigurationError, match="iters_per_epoch is 0"):
        IntervalTrigger(1, "epoch")(FakeManager(0, iteration=3))


def test_trigger_type_error_is_both_a_type_and_a_value_error() -> None:
    with pytest.raises(TypeError):
        IntervalTrigger("1", "epoch")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        IntervalTrigger("1", "epoch")  # type: ignore[arg-type]


# --- ManualScheduleTrigger -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("points", "unit", "iters_per_epoch", "expected"),
    [
        ([0.5, 1, 1.2, 3], "epoch", 5, [3, 5, 6, 15]),
        (2, "epoch", 3, [6]),
        ([0.1, 0.15], "epoch", 4, [1]),  # both points reach iteration 1: fires once
        ([5, 2, 5], "iteration", 9, [2, 5]),
        ([], "iteration", 9, []),
    ],
)
def test_manual_schedule_trigger_fires_once_per_point(
    points: Any, unit: str, iters_per_epoch: int, expected: list[int]
) -> None:
    trigger = ManualScheduleTrigger(points, unit)
    assert fire_every_step(trigger, iters_per_epoch, 30) == expected
    assert fire_by_next_check(trigger, iters_per_epoch, 30) == expected
    assert trigger.next_check(30, iters_per_epoch) == NEVER
    assert [i for i in range(1, 31) if trigger.may_fire(i, iters_per_epoch)] == expected
    resumed = ManualScheduleTrigger(points, unit)
    resumed.load_state_dict(_roundtrip(trigger.state_dict()))
    assert fire_by_next_check(resumed, iters_per_epoch, 30, start=4) == [
        i for i in expected if i > 4
    ]


def test_manual_schedule_trigger_rejects_bad_points() -> None:
    with pytest.raises(TriggerTypeError, match="number or a list of numbers, got str"):
        ManualScheduleTrigger("10", "epoch")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="point must be a finite number > 0"):
        ManualScheduleTrigger([1, 0], "epoch")
    with pytest.raises(ConfigurationError, match="whole number"):
        ManualScheduleTrigger([1.5], "iteration")


# --- OnceTrigger ---------------------------------------------------------------------------


def test_once_trigger_fires_on_the_first_call_only() -> None:
    trigger = OnceTrigger()
    assert trigger.next_check(0, 5) == 1
    assert trigger.may_fire(1, 5)
    assert fire_by_next_check(trigger, 5, 20) == [1]
    assert trigger.finished
    assert trigger.next_check(20, 5) == NEVER
    assert not trigger.may_fire(21, 5)
    assert fire_every_step(OnceTrigger(), 5, 20) == [1]


@pytest.mark.parametrize(("call_on_resume", "expected"), [(False, []), (True, [51])])
def test_once_trigger_after_resume(call_on_resume: bool, expected: list[int]) -> None:
    first = OnceTrigger(call_on_resume)
    assert fire_by_next_check(first, 5, 50) == [1]
    state = _roundtrip(first.state_dict())
    resumed = OnceTrigger(call_on_resume)
    resumed.load_state_dict(state)
    assert fire_by_next_check(resumed, 5, 80, start=50) == expected
    # The same object re-armed by loading behaves the same way.
    first.load_state_dict(state)
    assert fire_every_step(first, 5, 80, start=50) == expected


def test_once_trigger_not_yet_fired_fires_after_resume() -> None:
    resumed = OnceTrigger()
    resumed.load_state_dict(_roundtrip(OnceTrigger().state_dict()))
    assert fire_by_next_check(resumed, 5, 40, start=30) == [31]


# --- Value triggers ------------------------------------------------------------------------

VAL_LOSSES = [3.0, 2.0, 2.5, 1.0, 1.0, 0.5, 0.7]


def _epoch_end_values(values: list[float], key: str, length: int) -> Observations:
    """Like an evaluator: ``key`` is present only at epoch ends; 'main/loss' every step."""

    def observe(iteration: int) -> dict[str, Any]:
        observation: dict[str, Any] = {"main/loss": torch.tensor(float(iteration))}
        if iteration % length == 0 and iteration // length <= len(values):
            observation[key] = torch.tensor(values[iteration // length - 1])
        return observation

    return observe


@pytest.mark.parametrize(
    ("make", "values", "expected_epochs"),
    [
        (lambda: MinValueTrigger("val/loss"), VAL_LOSSES, [1, 2, 4, 6]),
        (lambda: MaxValueTrigger("val/loss"), VAL_LOSSES, [1]),
        (lambda: MaxValueTrigger("val/loss"), [1.0, 3.0, 2.0, 4.0], [1, 2, 4]),
        (
            lambda: BestValueTrigger("val/loss", lambda best, new: abs(new) < abs(best)),
            [-5.0, 4.0, -4.5, 1.0],
            [1, 2, 4],
        ),
    ],
)
def test_best_value_triggers_with_scripted_observations(
    make: Callable[[], BestValueTrigger], values: list[float], expected_epochs: list[int]
) -> None:
    length = 3
    observe = _epoch_end_values(values, "val/loss", length)
    stop = length * len(values)
    expected = [e * length for e in expected_epochs]
    assert fire_every_step(make(), length, stop, observe) == expected
    assert fire_by_next_check(make(), length, stop, observe) == expected


def test_best_value_trigger_state_round_trip_resumes_the_same_sequence() -> None:
    length = 3
    observe = _epoch_end_values(VAL_LOSSES, "val/loss", length)
    stop = length * len(VAL_LOSSES)
    full = fire_by_next_check(MinValueTrigger("val/loss"), length, stop, observe)
    first = MinValueTrigger("val/loss")
    before = fire_by_next_check(first, length, 9, observe)
    state = _roundtrip(first.state_dict())
    assert state["_best_value"] == 2.0
    resumed = MinValueTrigger("val/loss")
    resumed.load_state_dict(state)
    assert resumed.best_value == 2.0
    assert before + fire_by_next_check(resumed, length, stop, observe, start=9) == full
    # Without the state, the resumed trigger would fire again at the first check.
    assert fire_by_next_check(MinValueTrigger("val/loss"), length, stop, observe, 9)[0] == 12


def test_best_value_trigger_warns_at_checks_without_the_key() -> None:
    trigger = MinValueTrigger("val/loss", trigger=(2, "iteration"))
    manager = FakeManager(4, iteration=2, observation={"main/loss": 1.0})
    with pytest.warns(MissingObservationWarning, match=r"MinValueTrigger monitors 'val/loss'"):
        assert not trigger(manager)
    assert trigger.best_value is None
    manager.iteration, manager.observation = 4, {"val/loss": 1.0}
    assert trigger(manager)
    # It must see every iteration's value (interval mean), so the manager calls it each step.
    assert trigger.next_check(4, 4) is None
    assert trigger.may_fire(6, 4) and not trigger.may_fire(5, 4)


def test_value_triggers_reject_bad_arguments() -> None:
    with pytest.raises(TriggerTypeError, match=r"key must be the str name.*got int 3"):
        MinValueTrigger(3)  # type: ignore[arg-type]
    with pytest.raises(TriggerTypeError, match="compare must be a callable"):
        BestValueTrigger("val/loss", "less")  # type: ignore[arg-type]
    trigger = MinValueTrigger("text", trigger=(1, "iteration"))
    with pytest.raises(ConfigurationError, match=r"'text'.*not a scalar number"):
        trigger(FakeManager(2, iteration=1, observation={"text": "hello"}))


# --- EarlyStoppingTrigger ------------------------------------------------------------------


def test_early_stopping_stops_after_patience_checks_without_improvement() -> None:
    # Best at epoch 2, not beaten at 3 and 4 (stop), beaten at 5, not at 6 and 7 (stop).
    values = [5.0, 4.0, 4.5, 4.2, 3.0, 3.1, 3.2]
    observe = _epoch_end_values(values, "val/loss", 2)

    def make() -> EarlyStoppingTrigger:
        return EarlyStoppingTrigger(monitor="val/loss", patience=2)

    assert fire_every_step(make(), 2, 14, observe) == [8, 14]
    assert fire_by_next_check(make(), 2, 14, observe) == [8, 14]
    trigger = make()
    assert fire_by_next_check(trigger, 2, 7, observe) == []
    state = _roundtrip(trigger.state_dict())
    assert (state["best"], state["count"]) == (4.0, 1)
    resumed = make()
    resumed.load_state_dict(state)
    assert fire_by_next_check(resumed, 2, 8, observe, start=7) == [8]


def test_early_stopping_max_trigger_bounds_training() -> None:
    observe = _epoch_end_values([float(-i) for i in range(1, 20)], "val/loss", 4)
    trigger = EarlyStoppingTrigger(monitor="val/loss", max_trigger=(3, "epoch"))
    assert fire_by_next_check(trigger, 4, 12, observe) == [12]
    assert trigger.get_training_length() == (3, "epoch")
    # It averages the monitored value over each interval, so it is called every iteration.
    combined = EarlyStoppingTrigger(check_trigger=(5, "iteration"), max_trigger=(7, "iteration"))
    assert [combined.next_check(i, 100) for i in (0, 5, 7, 10)] == [None] * 4
    assert combined.may_fire(7, 100) and combined.may_fire(5, 100)
    assert not combined.may_fire(6, 100)


def test_early_stopping_auto_mode_maximises_accuracy() -> None:
    values = [0.5, 0.6, 0.55, 0.58]
    observe = _epoch_end_values(values, "val/accuracy", 1)
    trigger = EarlyStoppingTrigger(monitor="val/accuracy", patience=2)
    assert trigger.mode == "max"
    assert fire_every_step(trigger, 1, 4, observe) == [4]


def test_early_stopping_warns_when_the_monitor_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trigger = EarlyStoppingTrigger(monitor="val/loss", verbose=True, patience=0)
    with pytest.warns(MissingObservationWarning, match=r"'val/loss'.*main/loss"):
        assert not trigger(FakeManager(1, iteration=1, observation={"main/loss": 1.0}))
    assert trigger(FakeManager(1, iteration=2, observation={"val/loss": 1.0}))
    assert "early stopping" in capsys.readouterr().out


def test_early_stopping_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match="mode must be 'auto', 'min' or 'max'"):
        EarlyStoppingTrigger(mode="lowest")
    with pytest.raises(ConfigurationError, match="patience must be >= 0"):
        EarlyStoppingTrigger(patience=-1)
    with pytest.raises(TriggerTypeError, match="patience must be an int"):
        EarlyStoppingTrigger(patience=2.5)  # type: ignore[arg-type]
    with pytest.raises(TriggerTypeError, match="monitor must be the str"):
        EarlyStoppingTrigger(monitor=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="no training length"):
        EarlyStoppingTrigger(max_trigger=lambda manager: False).get_training_length()


# --- FunctionTrigger, TimeTrigger ----------------------------------------------------------


def test_function_trigger_asks_the_function_at_inner_trigger_iterations() -> None:
    calls: list[int] = []

    def decide(threshold: int, *, log: list[int]) -> bool:
        log.append(threshold)
        return len(log) % 2 == 0

    trigger = FunctionTrigger(decide, [7], {"log": calls}, trigger=(3, "iteration"))
    assert fire_by_next_check(trigger, 5, 12) == [6, 12]
    assert calls == [7, 7, 7, 7]  # asked only at 3, 6, 9, 12
    assert trigger.next_check(12, 5) == 15
    assert trigger.may_fire(15, 5) and not trigger.may_fire(14, 5)
    assert _roundtrip(trigger.state_dict()) == {"interval_trigger": {}}
    with pytest.raises(TriggerTypeError, match="fn must be callable"):
        FunctionTrigger(42)  # type: ignore[arg-type]


def test_time_trigger_fires_once_per_elapsed_period_and_skips_missed_ones() -> None:
    trigger = TimeTrigger(10)
    assert trigger.next_check(0, 5) is None
    manager = FakeManager(5)
    fired = []
    for it, elapsed in enumerate([3.0, 9.9, 10.0, 15.0, 35.0, 36.0, 40.0], start=1):
        manager.iteration, manager.elapsed_time = it, elapsed
        if trigger(manager):
            fired.append(elapsed)
    assert fired == [10.0, 35.0, 40.0]
    resumed = TimeTrigger(10)
    resumed.load_state_dict(_roundtrip(trigger.state_dict()))
    manager.elapsed_time = 49.0
    assert not resumed(manager)
    manager.elapsed_time = 50.0
    assert resumed(manager)
    with pytest.raises(ConfigurationError, match="> 0, got 0"):
        TimeTrigger(0)
    with pytest.raises(TriggerTypeError, match="number of seconds, got str"):
        TimeTrigger("10")  # type: ignore[arg-type]


# --- get_trigger and the base class --------------------------------------------------------


def test_get_trigger_accepts_each_trigger_like() -> None:
    interval = IntervalTrigger(2, "epoch")
    assert get_trigger(interval) is interval
    from_tuple = get_trigger((2, "epoch"))
    assert isinstance(from_tuple, IntervalTrigger)
    assert from_tuple.get_training_length() == (2, "epoch")
    assert isinstance(get_trigger([5, "iteration"]), IntervalTrigger)  # type: ignore[arg-type]

    never = get_trigger(None)
    assert fire_every_step(never, 3, 50) == []
    assert never.next_check(0, 3) == NEVER
    assert not never.may_fire(3, 3)

    wrapped = get_trigger(lambda manager: manager.iteration % 4 == 0)
    assert wrapped.next_check(0, 3) is None
    assert fire_by_next_check(wrapped, 3, 12) == [4, 8, 12]


def test_get_trigger_forwards_state_of_foreign_trigger_objects() -> None:
    class Counting:
        def __init__(self) -> None:
            self.calls = 0

        def __call__(self, manager: Any) -> bool:
            self.calls += 1
            return False

        def state_dict(self) -> dict[str, Any]:
            return {"calls": self.calls}

        def load_state_dict(self, state: Mapping[str, Any]) -> None:
            self.calls = state["calls"]

    source = Counting()
    wrapped = get_trigger(source)
    fire_every_step(wrapped, 2, 5)
    target = Counting()
    get_trigger(target).load_state_dict(_roundtrip(wrapped.state_dict()))
    assert target.calls == 5


@pytest.mark.parametrize("bad", ["epoch", (1, "epoch", 2), 3, {"period": 1}])
def test_get_trigger_rejects_other_values_naming_what_is_accepted(bad: Any) -> None:
    with pytest.raises(TriggerTypeError, match=r"cannot make a trigger from .*\(period, unit\)"):
        get_trigger(bad)


def test_trigger_subclass_defaults_are_the_safe_ones() -> None:
    class EveryOther(Trigger):
        def __call__(self, manager: Any) -> bool:
            return bool(manager.iteration % 2 == 0)

    trigger = EveryOther()
    assert trigger.next_check(4, 10) is None
    assert trigger.may_fire(3, 10)
    assert trigger.state_dict() == {}
    assert fire_by_next_check(trigger, 10, 6) == [2, 4, 6]
    with pytest.raises(NotImplementedError, match="Trigger must implement __call__"):
        Trigger()(FakeManager(1))


def test_next_due_reads_the_next_check_contract_once_for_everyone() -> None:
    from ppe_core.training.triggers import NEVER, next_due

    class Answer:
        def __init__(self, due: int | None) -> None:
            self.due = due

        def next_check(self, iteration: int, iters_per_epoch: int) -> int | None:
            return self.due

    assert next_due(IntervalTrigger(3, "iteration"), 4, 10) == 6
    assert next_due(IntervalTrigger(1, "epoch"), 4, 10) == 10
    assert next_due(lambda manager: True, 4, 10) == 5  # no next_check: every iteration
    assert next_due(Answer(None), 4, 10) == 5  # unpredictable: every iteration
    assert next_due(Answer(4), 4, 10) == 5  # a breach of the contract: safe
    assert next_due(Answer(NEVER), 4, 10) == NEVER
    assert next_due(Answer(NEVER + 5), 4, 10) == NEVER  # capped


class _Counting(IntervalTrigger):
    """An IntervalTrigger that records the iterations it is consulted at in ``calls``."""

    def __init__(self, period: float, unit: str, calls: list[int]) -> None:
        super().__init__(period, unit)
        self.calls = calls

    def __call__(self, manager: Any) -> bool:
        self.calls.append(manager.iteration)
        return super().__call__(manager)


@dataclass
class _View:
    iteration: int = 0
    iters_per_epoch: int = 4


def test_due_check_consults_its_trigger_only_when_due() -> None:
    from ppe_core.training.triggers._due import DueCheck

    calls: list[int] = []
    check = DueCheck(_Counting(3, "iteration", calls))
    view = _View()
    fired = []
    for iteration in range(1, 10):
        view.iteration = iteration
        if check(view):  # type: ignore[arg-type]
            fired.append(iteration)
    assert fired == [3, 6, 9]
    assert calls == [3, 6, 9]
    view.iteration = 2  # the count went back (a loaded state): the schedule is recomputed
    assert not check(view)  # type: ignore[arg-type]
    view.iteration = 3
    assert check(view)  # type: ignore[arg-type]


def test_due_check_does_not_consult_a_trigger_that_fires_every_iteration() -> None:
    """``(1, 'iteration')`` (a per-iteration LogReport) fires after every iteration by the
    Trigger contract the manager's fast path uses: the check answers True after every
    iteration without calling it (and False before the first, as its schedule says); a reset
    count and a trigger that only later says it fires every iteration behave as before."""
    from ppe_core.training.triggers._due import DueCheck

    calls: list[int] = []
    view = _View()
    check = DueCheck(_Counting(1, "iteration", calls))
    answers = []
    for iteration in range(0, 6):
        view.iteration = iteration
        answers.append(check(view))  # type: ignore[arg-type]
    assert answers == [False, True, True, True, True, True]
    assert calls == []
    view.iteration = 3  # a loaded state: rescheduled, still every iteration
    assert check(view)  # type: ignore[arg-type]
    assert calls == []

    class Later(_Counting):
        every = False

        @property
        def fires_every_iteration(self) -> bool:  # type: ignore[override]
            return self.every

    calls.clear()
    later = Later(1, "iteration", calls)
    check = DueCheck(later)
    for iteration in (1, 2):
        view.iteration = iteration
        assert check(view)  # type: ignore[arg-type]
    assert calls == [1, 2]  # consulted while it does not say so
    later.every = True
    check.reset()  # the schedule is asked again (as after a load), and now says so
    view.iteration = 3
    assert check(view)  # type: ignore[arg-type]
    assert calls == [1, 2]
