"""Tests for ExtensionsManager: scheduling, lifecycle, errors, naming and state dicts."""

# torch leaves Tensor.backward unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import io
import types
from collections.abc import Mapping
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ppe_core
from ppe_core.errors import ConfigurationError
from ppe_core.reporting import report
from ppe_core.training._protocols import ManagerView
from ppe_core.training.extension import (
    PRIORITY_EDITOR,
    PRIORITY_READER,
    PRIORITY_SNAPSHOT,
    PRIORITY_WRITER,
    Extension,
    ExtensionEntry,
    ExtensionNameError,
    make_extension,
)
from ppe_core.training.manager import (
    ExtensionErrorHandlerWarning,
    ExtensionsManager,
    IgnoredArgumentWarning,
    ManagerStateError,
    MissingExtensionStateWarning,
    ModelStateUnavailableError,
    StateDictKeyError,
)
from ppe_core.training.triggers import (
    FunctionTrigger,
    IntervalTrigger,
    ManualScheduleTrigger,
    OnceTrigger,
)

X = torch.linspace(-1, 1, 16).reshape(8, 2)
T = X.sum(dim=1, keepdim=True) * 0.5


class RecordingWriter:
    """A minimal real writer that records its lifecycle."""

    def __init__(self) -> None:
        self.out_dir: str | None = None
        self.finalized = 0

    def initialize(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def finalize(self) -> None:
        self.finalized += 1


class Recorder(Extension):
    """Records the iterations it ran at, plus its lifecycle calls."""

    def __init__(self, log: list[tuple[str, int]] | None = None, label: str = "") -> None:
        self.iterations: list[int] = []
        self.initialized = 0
        self.finalized = 0
        self.errors: list[BaseException] = []
        self.log = log
        self.label = label

    def __call__(self, manager: ManagerView) -> None:
        self.iterations.append(manager.iteration)
        if self.log is not None:
            self.log.append((self.label, manager.iteration))

    def initialize(self, manager: ManagerView) -> None:
        self.initialized += 1

    def finalize(self, manager: ManagerView) -> None:
        self.finalized += 1

    def on_error(self, manager: ManagerView, exc: BaseException, tb: Any) -> None:
        assert tb is not None
        self.errors.append(exc)

    def state_dict(self) -> dict[str, Any]:
        return {"iterations": list(self.iterations)}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        self.iterations = list(to_load["iterations"])


def make(
    max_epochs: int = 100, iters_per_epoch: int = 4, seed: int = 0, **kwargs: Any
) -> tuple[ExtensionsManager, torch.nn.Linear, torch.optim.Optimizer, RecordingWriter]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = RecordingWriter()
    manager = ExtensionsManager(
        model, optimizer, max_epochs, iters_per_epoch=iters_per_epoch, writer=writer, **kwargs
    )
    return manager, model, optimizer, writer


def train(manager: ExtensionsManager, model: torch.nn.Module, iterations: int) -> None:
    for _ in range(iterations):
        with manager.run_iteration(step_optimizers=["main"]):
            loss = F.mse_loss(model(X), T)
            report({"loss": loss}, model)
            loss.backward()


def fired(trigger: Any, iterations: int, iters_per_epoch: int = 4) -> list[int]:
    manager, model, _, _ = make(iters_per_epoch=iters_per_epoch)
    recorder = Recorder()
    manager.extend(recorder, trigger=trigger)
    train(manager, model, iterations)
    return recorder.iterations


# ------------------------------------------------------------------------- triggers


@pytest.mark.parametrize(
    ("trigger", "iterations", "iters_per_epoch", "expected"),
    [
        ((3, "iteration"), 10, 4, [3, 6, 9]),
        ((1, "epoch"), 12, 4, [4, 8, 12]),
        ((2, "epoch"), 13, 3, [6, 12]),
        ((0.5, "epoch"), 10, 5, [3, 5, 8, 10]),  # epoch length not divisible by 2
        (ManualScheduleTrigger([2, 7], "iteration"), 10, 4, [2, 7]),
        (ManualScheduleTrigger([1, 2.5], "epoch"), 12, 4, [4, 10]),
        (lambda m: m.iteration % 4 == 1, 10, 4, [1, 5, 9]),
        (FunctionTrigger(lambda: True, trigger=(5, "iteration")), 12, 4, [5, 10]),
        (OnceTrigger(), 5, 4, [1]),
    ],
)
def test_extensions_fire_at_exact_iterations(
    trigger: Any, iterations: int, iters_per_epoch: int, expected: list[int]
) -> None:
    assert fired(trigger, iterations, iters_per_epoch) == expected


def test_extension_default_trigger_is_every_iteration() -> None:
    manager, model, _, _ = make()
    recorder = Recorder()
    manager.extend(recorder)
    train(manager, model, 3)
    assert recorder.iterations == [1, 2, 3]


def test_callable_trigger_is_called_every_iteration() -> None:
    calls: list[int] = []

    def every_third(manager: ManagerView) -> bool:
        calls.append(manager.iteration)
        return manager.iteration % 3 == 0

    assert fired(every_third, 7) == [3, 6]
    assert calls == [1, 2, 3, 4, 5, 6, 7]


calls_to_trigger: list[int] = []


class CountingTrigger(IntervalTrigger):
    """An interval trigger that records every time the manager consults it."""

    def __call__(self, manager: ManagerView) -> bool:
        calls_to_trigger.append(manager.iteration)
        return super().__call__(manager)


def test_triggers_are_not_called_when_nothing_is_due() -> None:
    calls_to_trigger.clear()
    manager, model, _, _ = make(iters_per_epoch=5, stop_trigger=CountingTrigger(20, "iteration"))
    manager.extend(Recorder(), name="a", trigger=CountingTrigger(5, "iteration"))
    manager.extend(Recorder(), name="b", trigger=CountingTrigger(2, "epoch"))
    train(manager, model, 19)
    # Only the due iterations reached a trigger: "a" at 5, 10, 15 and "b" at 10.
    assert calls_to_trigger == [5, 10, 10, 15]


def test_adding_an_extension_invalidates_the_schedule() -> None:
    manager, model, _, _ = make()
    first = Recorder()
    manager.extend(first, trigger=(10, "iteration"))
    train(manager, model, 3)
    late = Recorder()
    manager.extend(late, trigger=(2, "iteration"))
    assert late.initialized == 1  # started managers initialize late extensions at once
    train(manager, model, 3)
    assert late.iterations == [4, 6]
    assert first.iterations == []


# ------------------------------------------------------------------------- ordering


def test_priority_order_with_ties_in_registration_order() -> None:
    log: list[tuple[str, int]] = []
    manager, model, _, _ = make()
    manager.extend(Recorder(log, "reader1"), name="reader1")
    manager.extend(Recorder(log, "writer"), name="writer", priority=PRIORITY_WRITER)
    manager.extend(Recorder(log, "reader2"), name="reader2", priority=PRIORITY_READER)
    manager.extend(Recorder(log, "editor"), name="editor", priority=PRIORITY_EDITOR)
    train(manager, model, 1)
    assert [label for label, _ in log] == ["writer", "editor", "reader1", "reader2"]
    assert [name for name, _ in manager.extensions] == ["writer", "editor", "reader1", "reader2"]


class LastRecorder(Recorder):
    runs_last = True


def test_runs_last_extension_runs_after_all_triggers_of_the_iteration() -> None:
    log: list[tuple[str, int]] = []
    manager, model, _, _ = make()
    manager.extend(LastRecorder(log, "last"), priority=PRIORITY_SNAPSHOT, name="last")
    manager.extend(Recorder(log, "lowest"), priority=PRIORITY_SNAPSHOT - 100, name="lowest")
    train(manager, model, 1)
    assert log == [("lowest", 1), ("last", 1)]
    # Invocation order (PPE's PRIORITY_SNAPSHOT value) is unchanged: only the run is deferred.
    assert [name for name, _ in manager.extensions] == ["last", "lowest"]


def test_priority_snapshot_alone_does_not_defer_an_extension() -> None:
    log: list[tuple[str, int]] = []
    manager, model, _, _ = make()
    manager.extend(Recorder(log, "snapshot"), priority=PRIORITY_SNAPSHOT, name="snapshot")
    manager.extend(Recorder(log, "lowest"), priority=PRIORITY_SNAPSHOT - 100, name="lowest")
    train(manager, model, 1)
    assert log == [("snapshot", 1), ("lowest", 1)]


def test_make_extension_runs_last_and_snapshot_sets_it() -> None:
    log: list[tuple[str, int]] = []

    @make_extension(trigger=(1, "iteration"), runs_last=True)
    def last(manager: ManagerView) -> None:
        log.append(("last", manager.iteration))

    manager, model, _, _ = make()
    manager.extend(last)
    manager.extend(Recorder(log, "reader"), name="reader")
    train(manager, model, 1)
    assert log == [("reader", 1), ("last", 1)]
    assert ExtensionEntry(last).runs_last is True
    assert ExtensionEntry(Recorder()).runs_last is False
    assert ExtensionEntry(ppe_core.training.extensions.snapshot()).runs_last is True


# ------------------------------------------------------------------------- lifecycle


def test_call_before_training_and_single_initialize_finalize() -> None:
    manager, model, _, writer = make(max_epochs=2, iters_per_epoch=3)
    before = Recorder()
    seen_before: list[bool] = []
    manager.extend(before, trigger=(1, "epoch"), call_before_training=True)
    manager.extend(lambda m: seen_before.append(m.is_before_training), call_before_training=True)
    steps = 0
    while not manager.stop_trigger:
        train(manager, model, 1)
        steps += 1
    assert steps == 6
    assert before.iterations == [0, 3, 6]
    assert seen_before[0] is True and not any(seen_before[1:])
    assert (before.initialized, before.finalized) == (1, 1)
    assert writer.finalized == 1
    manager.finalize()  # idempotent
    assert (before.finalized, writer.finalized) == (1, 1)
    with pytest.raises(ManagerStateError, match="finalized"):
        train(manager, model, 1)


def stopped(manager: ExtensionsManager) -> bool:
    return manager.stop_trigger


def test_stop_trigger_epoch_and_epoch_detail() -> None:
    manager, model, _, _ = make(max_epochs=2, iters_per_epoch=3)
    assert (manager.epoch, manager.epoch_detail, manager.is_before_training) == (0, 0.0, True)
    train(manager, model, 4)
    assert (manager.iteration, manager.epoch) == (4, 1)
    assert manager.epoch_detail == pytest.approx(4 / 3)
    assert stopped(manager) is False
    train(manager, model, 2)
    assert stopped(manager) is True
    assert stopped(manager) is True  # repeated reads agree
    assert (manager.epoch, manager.epoch_detail) == (2, 2.0)


def test_custom_stop_trigger_and_elapsed_time() -> None:
    manager, model, _, _ = make(stop_trigger=(5, "iteration"))
    assert manager.elapsed_time == 0.0
    count = 0
    while not manager.stop_trigger:
        train(manager, model, 1)
        count += 1
    assert count == 5
    assert manager.elapsed_time > 0.0


def test_on_error_runs_for_every_extension_and_original_error_propagates() -> None:
    manager, model, _, writer = make()
    recorders = [Recorder(), Recorder()]
    failure = RuntimeError("extension failed")

    def failing(manager: ManagerView) -> None:
        raise failure

    manager.extend(recorders[0], name="first", priority=PRIORITY_WRITER)
    manager.extend(failing, trigger=(2, "iteration"))
    manager.extend(recorders[1], name="last")
    with pytest.raises(RuntimeError) as info:
        train(manager, model, 5)
    assert info.value is failure
    for recorder in recorders:
        assert recorder.errors == [failure]
        assert recorder.finalized == 0  # as in PPE: the manager stays usable after an error
    assert writer.finalized == 0
    assert manager.iteration == 2
    manager.finalize()
    assert [r.finalized for r in recorders] == [1, 1] and writer.finalized == 1


def test_error_in_user_code_reaches_on_error_and_leaves_the_count() -> None:
    manager, model, _, writer = make()
    recorder = Recorder()
    manager.extend(recorder)
    train(manager, model, 1)
    failure = ValueError("bad batch")
    with pytest.raises(ValueError) as info, manager.run_iteration():
        raise failure
    assert info.value is failure
    assert recorder.errors == [failure]
    assert (recorder.finalized, writer.finalized) == (0, 0)
    assert manager.iteration == 1
    report({"outside": 1.0})  # the manager's reporter is no longer current
    assert "outside" not in manager.observation
    # A loop that catches the error continues with the same manager, as in PPE.
    train(manager, model, 2)
    assert recorder.iterations == [1, 2, 3]


def test_interrupt_inside_an_iteration_finalizes() -> None:
    manager, model, _, writer = make()
    recorder = Recorder()
    manager.extend(recorder)
    with pytest.raises(KeyboardInterrupt), manager.run_iteration():
        raise KeyboardInterrupt
    assert len(recorder.errors) == 1 and isinstance(recorder.errors[0], KeyboardInterrupt)
    assert (recorder.finalized, writer.finalized) == (1, 1)
    with pytest.raises(ManagerStateError, match="finalized"):
        train(manager, model, 1)


def test_failing_error_handler_warns_without_masking() -> None:
    manager, model, _, writer = make()

    @make_extension(on_error=lambda m, exc, tb: 1 / 0)
    def fragile(manager: ManagerView) -> None:
        raise KeyError("original")

    manager.extend(fragile)
    recorder = Recorder()
    manager.extend(recorder)
    with (
        pytest.warns(ExtensionErrorHandlerWarning, match="on_error of 'fragile'.*ZeroDivision"),
        pytest.raises(KeyError, match="original"),
    ):
        train(manager, model, 1)
    assert recorder.errors and recorder.finalized == 0
    assert writer.finalized == 0


# ------------------------------------------------------------------------- model state


def test_needs_model_state_function_extension_may_read_models() -> None:
    manager, model, _, _ = make()
    seen: list[torch.nn.Module] = []

    @make_extension(
        trigger=FunctionTrigger(lambda: True, trigger=(2, "iteration")), needs_model_state=True
    )
    def reader(m: ManagerView) -> None:
        seen.append(m.models["main"])

    manager.extend(reader)
    assert manager.needs_model_state() is False  # next iteration is 1
    assert manager.needs_model_state(2) is True
    assert manager.needs_model_state(3) is False
    train(manager, model, 4)
    assert seen == [model, model]
    assert manager.needs_model_state() is False and manager.needs_model_state(6) is True


def test_models_unavailable_to_undeclared_extensions() -> None:
    manager, model, _, _ = make()
    manager.extend(lambda m: m.models, name="undeclared")
    with pytest.raises(ModelStateUnavailableError, match="needs_model_state"):
        train(manager, model, 1)


# ------------------------------------------------------------------------- naming


def test_duplicate_names_get_ordinals_as_in_ppe() -> None:
    manager, _, _, _ = make()
    first, second, third = Recorder(), Recorder(), Recorder()
    manager.extend(first)
    manager.extend(second)
    manager.extend(third)
    # PPE builds the new name from extend()'s name argument, None here.
    assert [first.name, second.name, third.name] == ["Recorder", "None_1", "None_2"]
    assert manager.get_extension("None_1") is second

    mine, again = Recorder(), Recorder()
    manager.extend(mine, name="mine")
    manager.extend(again, name="mine")  # PPE renames an explicit duplicate too
    assert (mine.name, again.name) == ("mine", "mine_1")
    assert manager.get_extension("mine_1") is again
    entry = ExtensionEntry(Recorder(), name="mine")
    manager.extend(entry)
    assert entry.name == "None_3"


def test_get_extension_unknown_name_and_reserved_name() -> None:
    manager, _, _, _ = make()
    manager.extend(Recorder())
    with pytest.raises(ExtensionNameError, match=r"'nope'.*Recorder"):
        manager.get_extension("nope")
    with pytest.raises(ExtensionNameError, match="reserved"):
        manager.extend(Recorder(), name="training")


def test_make_extension_options_are_used_by_the_manager() -> None:
    manager, model, _, _ = make()
    log: list[tuple[str, int]] = []

    @make_extension(trigger=(2, "iteration"), default_name="Every2", priority=PRIORITY_WRITER)
    def every2(m: ManagerView) -> None:
        log.append(("every2", m.iteration))

    manager.extend(Recorder(log, "reader"))
    manager.extend(every2)
    train(manager, model, 2)
    assert log == [("reader", 1), ("every2", 2), ("reader", 2)]
    assert manager.get_extension("Every2").default_name == "Every2"


def test_extend_warns_about_ignored_keywords() -> None:
    manager, _, _, _ = make()
    with pytest.warns(IgnoredArgumentWarning, match="invoke_before_training"):
        manager.extend(Recorder(), invoke_before_training=True)


# ------------------------------------------------------------------------- reporting


def test_reports_land_in_observation_with_model_prefix() -> None:
    torch.manual_seed(0)
    hidden, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    generator = torch.nn.Sequential(hidden, head)
    optimizer = torch.optim.SGD(generator.parameters(), lr=0.1)
    manager = ExtensionsManager(
        {"gen": generator}, {"gen": optimizer}, 1, iters_per_epoch=2, writer=RecordingWriter()
    )
    seen: list[dict[str, Any]] = []
    manager.extend(lambda m: seen.append(dict(m.observation)))
    with manager.run_iteration(step_optimizers=["gen"]):
        loss = F.mse_loss(generator(X), T)
        report({"loss": loss}, generator)
        report({"w": head.weight.norm()}, head)
        report({"plain": 1.5})
        loss.backward()
    assert set(manager.observation) == {"gen/loss", "gen/1/w", "plain"}
    assert not manager.observation["gen/loss"].requires_grad
    assert seen == [manager.observation]


def test_step_optimizers_steps_and_zeroes() -> None:
    manager, model, _, _ = make()
    before = model.weight.detach().clone()
    with manager.run_iteration():
        F.mse_loss(model(X), T).backward()
    assert torch.equal(model.weight, before)  # nothing named: no step
    assert model.weight.grad is not None
    train(manager, model, 1)  # zeroes the stale gradient, then steps
    assert not torch.equal(model.weight, before)
    with pytest.raises(ConfigurationError, match="unknown optimizers"):
        manager.run_iteration(step_optimizers=["other"])


def test_run_iteration_context_is_reused_and_nesting_is_refused() -> None:
    manager, _, _, _ = make()
    assert manager.run_iteration() is manager.run_iteration()
    assert manager.run_iteration(step_optimizers=["main"]) is manager.run_iteration(
        step_optimizers=["main"]
    )
    with (
        pytest.raises(ManagerStateError, match="nested"),
        manager.run_iteration(),
        manager.run_iteration(),
    ):
        pass


def test_fast_path_api_matches_the_context_manager() -> None:
    manager, model, _, _ = make()
    recorder = Recorder()
    manager.extend(recorder, trigger=(2, "iteration"))
    for _ in range(4):
        manager.begin_iteration(("main",))
        F.mse_loss(model(X), T).backward()
        manager.end_iteration(("main",))
    assert recorder.iterations == [2, 4]
    assert manager.iteration == 4


def test_enable_profile_records_extension_calls() -> None:
    manager, model, _, _ = make(enable_profile=True)
    recorder = Recorder()
    manager.extend(recorder, name="profiled")
    with torch.profiler.profile() as prof:
        train(manager, model, 1)
    names = {event.name for event in prof.events()}
    assert "ppe.training.ExtensionsManager.run_extensions:profiled" in names  # PPE's name
    assert recorder.iterations == [1]


def test_models_are_validated_and_mappings_read_only() -> None:
    with pytest.raises(ConfigurationError, match=r"torch\.nn\.Module"):
        ExtensionsManager({"main": object()}, {}, 1, iters_per_epoch=1, writer=RecordingWriter())  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="iters_per_epoch"):
        make(iters_per_epoch=0)
    manager, model, optimizer, writer = make()
    assert manager.models["main"] is model and manager.raw_models["main"] is model
    assert manager.optimizers["main"] is optimizer
    assert isinstance(manager.models, types.MappingProxyType)
    assert manager.out == writer.out_dir == "result"


def test_transform_model_applies_to_models_and_state() -> None:
    inner = torch.nn.Linear(2, 1)
    wrapper = torch.nn.Sequential(inner)

    def transform(name: str, module: torch.nn.Module) -> torch.nn.Module:
        return module.get_submodule("0")

    manager = ExtensionsManager(
        wrapper,
        torch.optim.SGD(wrapper.parameters(), lr=0.1),
        1,
        iters_per_epoch=1,
        writer=RecordingWriter(),
        transform_model=transform,
    )
    assert manager.models["main"] is inner and manager.raw_models["main"] is wrapper
    assert set(manager.state_dict()["models"]["main"]) == {"weight", "bias"}
    untransformed = manager.state_dict(transform_models=lambda n, m: m)
    assert set(untransformed["models"]["main"]) == {"0.weight", "0.bias"}


# ------------------------------------------------------------------------- state dict


def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


def _with_extensions(
    manager: ExtensionsManager,
) -> tuple[Recorder, Recorder, Recorder]:
    every3, manual, once = Recorder(), Recorder(), Recorder()
    manager.extend(every3, name="every3", trigger=(3, "iteration"))
    manager.extend(manual, name="manual", trigger=ManualScheduleTrigger([4, 9], "iteration"))
    manager.extend(once, name="once", trigger=OnceTrigger())
    return every3, manual, once


def test_state_dict_layout() -> None:
    manager, model, _, _ = make()
    _with_extensions(manager)
    train(manager, model, 2)
    state = manager.state_dict()
    assert set(state) == {
        "_start_iteration",
        "_start_execution",
        "models",
        "optimizers",
        "state_objects",
        "extensions",
        "ppe_version",
        "_ppe_core",  # ppe-core's own entry, which PPE ignores: its version, the epoch length, ...
    }
    assert state["_ppe_core"].pop("elapsed_time")["seconds"] > 0.0  # goes on after a resume
    assert state["_ppe_core"] == {
        "version": ppe_core.__version__,
        "manager": {"iters_per_epoch": 4},
    }
    assert state["ppe_version"] == "0.9.0" and state["state_objects"] == {}  # PPE's format
    assert state["_start_iteration"] == 2
    assert set(state["models"]) == set(state["optimizers"]) == {"main"}
    assert set(state["extensions"]) == {"every3", "manual", "once"}
    assert set(state["extensions"]["once"]) == {"extension", "trigger"}


def test_resume_through_weights_only_load_matches_uninterrupted_run() -> None:
    reference, ref_model, _, _ = make()
    ref_extensions = _with_extensions(reference)
    train(reference, ref_model, 10)

    first, first_model, _, _ = make()
    _with_extensions(first)
    train(first, first_model, 5)
    state = _round_trip(first.state_dict())

    resumed, resumed_model, _, _ = make(seed=1)  # different initial weights
    extensions = _with_extensions(resumed)
    resumed.load_state_dict(state)  # before start_extensions
    assert all(ext.initialized == 0 for ext in extensions)
    assert resumed.iteration == 5  # reading the count starts the extensions
    # As in PPE, an extension whose trigger is finished (the fired OnceTrigger) is not initialized.
    assert [ext.initialized for ext in extensions] == [1, 1, 0]
    train(resumed, resumed_model, 5)

    for got, expected in zip(extensions, ref_extensions, strict=True):
        assert got.iterations == expected.iterations
    assert [ext.iterations for ext in extensions] == [[3, 6, 9], [4, 9], [1]]
    torch.testing.assert_close(resumed_model.state_dict(), ref_model.state_dict())


def test_loading_state_without_an_extension_warns() -> None:
    source, model, _, _ = make()
    train(source, model, 2)
    target, _, _, _ = make()
    extra = Recorder()
    target.extend(extra, name="Extra")
    with pytest.warns(MissingExtensionStateWarning, match="Extra"):
        target.load_state_dict(_round_trip(source.state_dict()))
    assert target.iteration == 2
    assert extra.iterations == []


def test_loading_state_without_a_model_raises_clearly() -> None:
    manager, _, _, _ = make()
    state = manager.state_dict()
    del state["models"]["main"]
    with pytest.raises(StateDictKeyError, match="'models' lacks \\['main'\\]"):
        manager.load_state_dict(state)


# ------------------------------------------------------------------------- public parts


def test_manual_loop_stop_reason_and_end_iteration_answer() -> None:
    manager, model, _, writer = make(max_epochs=1, iters_per_epoch=3)
    answers = []
    while not manager.stop_trigger:
        manager.begin_iteration(("main",))
        F.mse_loss(model(X), T).backward()
        answers.append(manager.end_iteration(("main",)))
    assert answers == [False, False, True]
    reason = manager.stop_reason
    assert reason is not None
    assert (reason.kind, reason.iteration, reason.epoch_detail) == ("max_epochs", 3, 1.0)
    assert writer.finalized == 1  # the stop finalized the manager


def test_a_user_stop_trigger_is_reported_as_stop_trigger() -> None:
    trigger = ManualScheduleTrigger([5], "iteration")
    manager, model, _, _ = make(stop_trigger=trigger)
    train(manager, model, 5)
    reason = manager.stop_reason
    assert reason is not None
    assert (reason.kind, reason.trigger, reason.iteration) == ("stop_trigger", trigger, 5)


def test_training_length_comes_from_the_stop_trigger() -> None:
    assert make(max_epochs=7)[0].training_length == (7, "epoch")
    stop = IntervalTrigger(30, "iteration")
    assert make(stop_trigger=stop)[0].training_length == (30, "iteration")
    assert make(stop_trigger=lambda m: False)[0].training_length is None


def test_add_state_object_and_resume_state_round_trip() -> None:
    class Counter:
        def __init__(self, value: int) -> None:
            self.value = value

        def state_dict(self) -> dict[str, Any]:
            return {"value": self.value}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.value = state["value"]

    manager, _, _, _ = make()
    manager.add_state_object("counter", Counter(3))
    manager.add_resume_state("mine", Counter(4))
    state = manager.state_dict()
    assert state["state_objects"]["counter"] == {"value": 3}
    assert state["_ppe_core"]["mine"] == {"value": 4}

    other, _, _, _ = make()
    counter, mine, optional = Counter(0), Counter(0), Counter(9)
    other.add_state_object("counter", counter)
    other.add_resume_state("mine", mine)
    other.add_state_object("absent", optional, optional=True)  # a state may lack it
    other.load_state_dict(state)
    assert (counter.value, mine.value, optional.value) == (3, 4, 9)
    with pytest.raises(TypeError, match="state_dict"):
        other.add_state_object("bad", object())  # type: ignore[arg-type]
    for reserved in ("version", "world_size", "ranks"):  # keys ppe-core writes there itself
        with pytest.raises(ConfigurationError, match=f"{reserved!r} is reserved"):
            other.add_resume_state(reserved, Counter(1))
