"""Tests for ppe_core.reporting: reporters, scopes, observers and summaries."""

from __future__ import annotations

import io
import math
import statistics
import threading
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import ConfigurationError, PPEError
from ppe_core.reporting import (
    DictSummary,
    EmptySummaryError,
    NoCurrentReporterError,
    Reporter,
    Summary,
    UnknownObserverError,
    get_current_reporter,
    report,
    report_scope,
    to_floats,
)


def _roundtrip(state: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _wstats(values: list[float], weights: list[float]) -> tuple[float, float]:
    total = sum(weights)
    mean = sum(w * v for v, w in zip(values, weights, strict=True)) / total
    var = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / total
    return mean, math.sqrt(var)


# --- Reporter ------------------------------------------------------------------------------


def test_report_with_observer_prefixes_its_name() -> None:
    reporter = Reporter()
    model = torch.nn.Linear(2, 2)
    reporter.add_observer("main", model)
    observation: dict[str, Any] = {}
    with reporter.scope(observation):
        report({"loss": 1.5, "acc": 0.25}, model)
        report({"plain": 3})
    assert observation == {"main/loss": 1.5, "main/acc": 0.25, "plain": 3}


@pytest.mark.parametrize("prefix", ["main", "main/"])
def test_add_observers_joins_prefix_and_name_with_one_slash(prefix: str) -> None:
    reporter = Reporter()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    reporter.add_observers(prefix, model.named_modules())
    observation: dict[str, Any] = {}
    with reporter.scope(observation):
        report({"x": 1}, model)
        report({"y": 2}, model[0])
    assert observation == {"main/x": 1, "main/0/y": 2}


def test_add_observers_with_empty_prefix_uses_bare_names() -> None:
    reporter = Reporter()
    a = object()
    reporter.add_observers("", [("enc", a)])
    with reporter.scope({}) as observation:
        reporter.report({"v": 1}, a)
    assert observation == {"enc/v": 1}


def test_unregistered_observer_raises_a_key_error_naming_the_fix() -> None:
    reporter = Reporter()
    with pytest.raises(UnknownObserverError, match="add_observer") as info:
        reporter.report({"x": 1}, object())
    assert isinstance(info.value, KeyError)


def test_report_outside_any_reporter_is_a_silent_no_op() -> None:
    reporter = Reporter()
    report({"x": 1.0})  # no current reporter: nothing happens, nothing raises
    assert reporter.observation == {}
    with pytest.raises(NoCurrentReporterError, match="with reporter"):
        get_current_reporter()


def test_nested_scopes_route_reports_and_restore_on_exit() -> None:
    reporter = Reporter()
    outer: dict[str, Any] = {}
    inner: dict[str, Any] = {}
    with reporter.scope(outer):
        report({"a": 1})
        with reporter.scope(inner):
            report({"b": 2})
            assert get_current_reporter() is reporter
        report({"c": 3})
    assert outer == {"a": 1, "c": 3}
    assert inner == {"b": 2}
    with pytest.raises(NoCurrentReporterError):
        get_current_reporter()


def test_scope_is_restored_when_the_block_raises() -> None:
    reporter = Reporter()
    base = reporter.observation
    with pytest.raises(RuntimeError, match="boom"), reporter.scope({}):
        raise RuntimeError("boom")
    assert reporter.observation is base
    with pytest.raises(NoCurrentReporterError):
        get_current_reporter()


def test_entering_reporters_stacks_them() -> None:
    first, second = Reporter(), Reporter()
    with first:
        assert get_current_reporter() is first
        with second as entered:
            assert entered is second
            assert get_current_reporter() is second
        assert get_current_reporter() is first


def test_report_scope_uses_the_current_reporter_without_pushing_it() -> None:
    reporter = Reporter()
    observation: dict[str, Any] = {}
    with reporter, report_scope(observation):
        report({"x": 1})
        assert get_current_reporter() is reporter
    assert observation == {"x": 1}
    with pytest.raises(NoCurrentReporterError) as info:
        report_scope({})
    assert isinstance(info.value, IndexError) and isinstance(info.value, PPEError)


def test_reported_tensor_is_kept_on_device_detached_and_uncopied() -> None:
    reporter = Reporter()
    weight = torch.ones(3, requires_grad=True)
    loss = (weight * 2).sum()
    with reporter.scope({}) as observation:
        report({"loss": loss})
    stored = observation["loss"]
    assert type(stored) is torch.Tensor
    assert not stored.requires_grad
    assert stored.data_ptr() == loss.data_ptr()  # same storage: no copy, no sync


def test_current_reporter_is_per_thread() -> None:
    reporter = Reporter()
    seen: list[bool] = []

    def other_thread() -> None:
        report({"from_thread": 1})  # the main thread's reporter is not current here
        try:
            get_current_reporter()
        except NoCurrentReporterError:
            seen.append(True)

    with reporter.scope({}) as observation:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen == [True]
    assert observation == {}


# --- Summary -------------------------------------------------------------------------------


def test_summary_of_floats_matches_population_statistics() -> None:
    values = [1.0, 2.0, 4.0, 8.0, 3.5]
    summary = Summary()
    for v in values:
        summary.add(v)
    assert summary.compute_mean() == pytest.approx(statistics.fmean(values))
    mean, std = summary.make_statistics()
    assert mean == pytest.approx(statistics.fmean(values))
    assert std == pytest.approx(statistics.pstdev(values))


def test_summary_weights_floats() -> None:
    summary = Summary()
    summary.add(1.0, weight=3)
    summary.add(5.0, weight=1)
    assert summary.make_statistics() == pytest.approx(_wstats([1.0, 5.0], [3, 1]))


def test_summary_of_many_tensors_returns_tensors_matching_floats() -> None:
    values = [math.sin(i) * 3 + 100 for i in range(1000)]  # crosses the fold size several times
    summary = Summary()
    for v in values:
        summary.add(torch.tensor(v))
    mean, std = summary.make_statistics()
    # PPE's types: tensors in the values' dtype, zero-dimensional.
    assert isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor)
    assert mean.dtype == std.dtype == torch.float32 and mean.ndim == 0
    assert mean == pytest.approx(statistics.fmean(values), rel=1e-6)
    # Offset data: a naive float32 sum of squares would lose most of these digits.
    assert std == pytest.approx(statistics.pstdev(values), rel=1e-4)


def test_summary_mixes_floats_tensors_and_weights() -> None:
    values = [float(i % 7) for i in range(600)]
    weights = [1.0 + (i % 3) for i in range(600)]
    summary = Summary()
    for i, (v, w) in enumerate(zip(values, weights, strict=True)):
        if i % 3 == 0:
            summary.add(v, w)
        elif i % 3 == 1:
            summary.add(torch.tensor(v), torch.tensor(w))
        else:
            summary.add(torch.tensor([v], dtype=torch.float64), w)
    assert summary.make_statistics() == pytest.approx(_wstats(values, weights), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_summary_accumulates_low_precision_and_integer_tensors_in_float(
    dtype: torch.dtype,
) -> None:
    summary = Summary()
    for i in range(300):
        summary.add(torch.tensor(i % 2, dtype=dtype))
    mean = summary.compute_mean()
    assert isinstance(mean, torch.Tensor)
    assert mean.dtype == (dtype if dtype.is_floating_point else torch.float32)  # as in PPE
    assert float(mean) == pytest.approx(0.5)


def test_summary_add_does_not_copy_tensors_to_the_host() -> None:
    # Meta tensors have no data: any host conversion would raise. Adding (and folding, past
    # the fold size) must work; only computing the mean may touch the data.
    summary = Summary()
    dict_summary = DictSummary()
    value = torch.zeros((), device="meta")
    for _ in range(700):
        summary.add(value)
        summary.add(value, torch.ones((), device="meta"))
        dict_summary.add({"loss": value, "w": (value, 2.0)})
    # The means are computed on the device too: still no host copy, so meta tensors come back.
    assert summary.compute_mean().device.type == "meta"
    means = dict_summary.compute_mean()
    assert {k: v.device.type for k, v in means.items()} == {"loss": "meta", "w": "meta"}
    with pytest.raises(NotImplementedError, match="meta"):
        to_floats(means)  # the host copy happens here, and only here
    with pytest.raises(NotImplementedError, match="meta"):
        dict_summary.state_dict()


def test_summary_keeps_no_autograd_graph() -> None:
    weight = torch.ones((), requires_grad=True)
    summary = Summary()
    for i in range(300):
        summary.add(weight * i)
    assert summary.compute_mean() == pytest.approx(149.5)


def test_summary_rejects_non_scalar_tensors() -> None:
    with pytest.raises(ConfigurationError, match=r"shape \(3,\).*mean\(\)"):
        Summary().add(torch.ones(3))


def test_empty_summary_raises_zero_division() -> None:
    with pytest.raises(EmptySummaryError, match="empty") as info:
        Summary().compute_mean()
    assert isinstance(info.value, ZeroDivisionError)


def test_summary_state_dict_round_trips_with_weights_only_load() -> None:
    values = [float(i * i % 11) for i in range(400)]
    full = Summary()
    first = Summary()
    for v in values[:250]:
        full.add(torch.tensor(v))
        first.add(torch.tensor(v))
    state = _roundtrip(first.state_dict())
    # PPE's keys, plus the unmerged accumulators PPE readers ignore.
    assert set(state) == {"_x", "_x2", "_n", "_ppe_core_exact"}
    assert type(state["_x"]) is float and type(state["_x2"]) is float
    assert type(state["_n"]) is int  # PPE's type for a count
    resumed = Summary()
    resumed.load_state_dict(state)
    for v in values[250:]:
        full.add(torch.tensor(v))
        resumed.add(v)
    expected = tuple(float(v) for v in full.make_statistics())
    assert tuple(float(v) for v in resumed.make_statistics()) == pytest.approx(expected, rel=1e-6)
    assert float(resumed.compute_mean()) == pytest.approx(statistics.fmean(values), rel=1e-6)


def test_summary_loads_ppe_style_state_with_tensors_and_int_count() -> None:
    summary = Summary()
    summary.load_state_dict({"_x": torch.tensor(6.0), "_x2": torch.tensor(14.0), "_n": 3})
    assert summary.make_statistics() == pytest.approx((2.0, math.sqrt(14 / 3 - 4)))


# --- DictSummary ---------------------------------------------------------------------------


def test_dict_summary_means_stats_and_skipped_entries() -> None:
    summary = DictSummary()
    summary.add({"a": 1.0, "b": torch.tensor(10.0), "text": "skip", "image": torch.ones(2, 2)})
    summary.add({"a": 3.0, "b": torch.tensor(20.0), "w": (torch.tensor(4.0), 3)})
    summary.add({"w": (0.0, 1.0)})
    means = summary.compute_mean()
    assert to_floats(means) == pytest.approx({"a": 2.0, "b": 15.0, "w": 3.0})
    assert type(means["a"]) is float
    assert isinstance(means["b"], torch.Tensor) and isinstance(means["w"], torch.Tensor)
    assert all(type(v) is float for v in to_floats(means).values())
    stats = summary.make_statistics()
    assert stats == pytest.approx(
        {"a": 2.0, "a.std": 1.0, "b": 15.0, "b.std": 5.0, "w": 3.0, "w.std": math.sqrt(3.0)}
    )


def test_dict_summary_rejects_malformed_weighted_entries() -> None:
    with pytest.raises(ConfigurationError, match=r"'x'.*\(value, weight\)"):
        DictSummary().add({"x": (1.0, torch.ones(2))})
    with pytest.raises(ConfigurationError, match="'y'"):
        DictSummary().add({"y": (1.0, 2.0, 3.0)})


def test_dict_summary_state_dict_round_trips_with_weights_only_load() -> None:
    summary = DictSummary()
    for i in range(300):
        summary.add({"loss": torch.tensor(float(i)), "acc": i / 300})
    expected = summary.make_statistics()
    state = _roundtrip(summary.state_dict())
    restored = DictSummary()
    restored.add({"stale": 1.0})  # replaced by the loaded entries
    restored.load_state_dict(state)
    assert to_floats(restored.make_statistics()) == pytest.approx(to_floats(expected))


def test_summary_state_round_trip_continues_bit_identically() -> None:
    """A resumed summary sums exactly like the uninterrupted one (bit-exact resume of logs)."""
    torch.manual_seed(0)
    values = [torch.rand(()) * 3 for _ in range(700)]
    uninterrupted = ppe.reporting.DictSummary()
    resumed = ppe.reporting.DictSummary()
    for v in values[:333]:
        uninterrupted.add({"loss": v, "acc": float(v) / 2})
        resumed.add({"loss": v, "acc": float(v) / 2})
    state = uninterrupted.state_dict()  # the snapshot the uninterrupted run also takes
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    resumed = ppe.reporting.DictSummary()
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for v in values[333:]:
        uninterrupted.add({"loss": v, "acc": float(v) / 2})
        resumed.add({"loss": v, "acc": float(v) / 2})
    a, b = uninterrupted.make_statistics(), resumed.make_statistics()
    assert a.keys() == b.keys()
    for key in a:
        assert float(a[key]) == float(b[key]), key


# --- Deferred reduction through a real Trainer ------------------------------------------------

_SYNCS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__format__")


class _SyncCounter(torch.Tensor):
    """A tensor that counts calls which copy its value to the host (a device sync on a GPU)."""

    calls: list[str] = []  # noqa: RUF012 - class-level log shared by every instance

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _SYNCS:
            cls.calls.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


class _CountingModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.calls_per_step: list[int] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls_per_step.append(len(_SyncCounter.calls))
        loss = torch.nn.functional.cross_entropy(self.fc(x), t)
        report({"train/counted": loss.detach().as_subclass(_SyncCounter)})
        return {"loss": loss.as_subclass(_SyncCounter)}


def test_reported_tensors_are_not_synced_per_step_only_when_the_log_fires() -> None:
    _SyncCounter.calls = []
    torch.manual_seed(0)
    model = _CountingModel()
    ppe.to(model, "cpu")
    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(3, 4, generator=g), "t": torch.tensor([0, 1, 0])} for _ in range(20)]
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        3,
        extensions=[ppe.training.extensions.LogReport(trigger=(1, "epoch"))],
    )
    trainer.run(data)
    log = trainer.manager.get_extension("LogReport").log  # type: ignore[attr-defined]
    assert [entry["epoch"] for entry in log] == [1, 2, 3]
    assert all(isinstance(entry["train/counted"], float) for entry in log)
    steps = model.calls_per_step
    assert len(steps) == 60
    # Within an epoch nothing is copied to the host; copies happen only at the epoch ends,
    # a bounded number per logged epoch (not one per step).
    for epoch in range(3):
        within = steps[epoch * 20 : epoch * 20 + 20]
        assert within[0] == within[-1], f"host copies during epoch {epoch + 1}: {within}"
    assert 1 <= len(_SyncCounter.calls) <= 6 * 3, _SyncCounter.calls


def test_reporting_one_tensor_twice_detaches_once_and_never_holds_its_graph() -> None:
    import gc
    import weakref

    reporter = Reporter()
    w = torch.ones(3, requires_grad=True)
    loss = (w * 2).sum()
    observation: dict[str, Any] = {}
    with reporter.scope(observation):
        report({"train/loss": loss})  # in forward
        first = observation["train/loss"]
        report({"train/loss": loss})  # the trainer reports the same output
        assert observation["train/loss"] is first  # the same detached view, not a new one
        assert not first.requires_grad and first.data_ptr() == loss.data_ptr()
        other = (w * 3).sum()
        report({"other": other}, None)
        assert observation["other"] is not first and observation["other"].item() == 9.0
    source = weakref.ref(loss)
    del loss, other
    gc.collect()
    # The graph hangs off the source tensor (detached views hold none): it is gone too.
    assert source() is None


@pytest.mark.parametrize(
    "values",
    [
        [{"loss": torch.tensor(0.1)}],  # one CPU tensor per key: read directly
        [{"loss": torch.tensor(0.1, dtype=torch.float64), "acc": torch.tensor([0.5])}],
        [{"half": torch.tensor(0.1, dtype=torch.float16)}],
        [{"bf16": torch.tensor(0.3, dtype=torch.bfloat16)}],
        [{"int": torch.tensor(2**24 + 1)}],  # widened to the default dtype, as the mean is
        [{"bool": torch.tensor(True)}],
        [{"loss": torch.tensor(0.1)}, {"loss": torch.tensor(0.4)}],  # two values: the mean
        [{"loss": (torch.tensor(0.1), 3)}],  # a weight
        [{"loss": 0.25, "n": 3}],  # host numbers
        [{"loss": torch.tensor(0.1), "host": 2}],  # mixed
        [{"deferred": lambda: torch.tensor(0.7)}],
        [],
    ],
)
def test_compute_mean_floats_is_to_floats_of_compute_mean(values: list[dict[str, Any]]) -> None:
    fast, reference = DictSummary(), DictSummary()
    for value in values:
        fast.add(value)
        reference.add(value)
    floats = fast.compute_mean_floats()
    expected = to_floats(reference.compute_mean())
    assert floats == expected
    assert [type(v) for v in floats.values()] == [type(v) for v in expected.values()]
    assert list(floats) == list(expected)
