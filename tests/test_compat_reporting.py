"""PPE 0.9 compatibility of ``ppe.reporting``: the same code run with PPE and with ppe-core.

Each scenario is PPE usage written once against a ``reporting`` module and run with both
``pytorch_pfn_extras.reporting`` and ``ppe_core.reporting``; results must have the same types
and values.
"""

from __future__ import annotations

import io
import types
from collections.abc import Callable
from typing import Any

import numpy
import pytest
import torch

import ppe_core as ppe
from ppe_core.reporting import to_floats


def _ppe_reporting() -> types.ModuleType:
    import pytorch_pfn_extras

    return pytorch_pfn_extras.reporting


def _same(ours: Any, theirs: Any) -> None:
    """Asserts equal types (recursively) and values (exactly, or within float32 rounding)."""
    assert type(ours) is type(theirs), (ours, theirs)
    if isinstance(theirs, dict):
        # ppe-core adds its unmerged accumulators to a Summary state; PPE ignores that entry.
        assert [key for key in ours if key != "_ppe_core_exact"] == list(theirs)
        for key in theirs:
            _same(ours[key], theirs[key])
    elif isinstance(theirs, (tuple, list)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _same(a, b)
    elif isinstance(theirs, torch.Tensor):
        assert (ours.dtype, ours.shape, ours.device) == (theirs.dtype, theirs.shape, theirs.device)
        # PPE sums half precision in half precision; ours sums in float32 (closer to exact).
        rtol = 1e-2 if theirs.dtype in (torch.float16, torch.bfloat16) else 1e-3
        torch.testing.assert_close(ours, theirs, rtol=rtol, atol=1e-6)
    elif isinstance(theirs, (float, numpy.floating, numpy.ndarray)):
        numpy.testing.assert_allclose(ours, theirs, rtol=1e-6)
    else:
        assert ours == theirs


def _both(scenario: Callable[[Any], Any]) -> None:
    _same(scenario(ppe.reporting), scenario(_ppe_reporting()))


def _summary_of(reporting: Any, values: list[Any], weights: list[Any] | None = None) -> Any:
    summary = reporting.Summary()
    for i, value in enumerate(values):
        if weights is None:
            summary.add(value)
        else:
            summary.add(value, weights[i])
    return summary


SEQUENCES: dict[str, tuple[list[Any], list[Any] | None]] = {
    "ints": ([1, 2, 6], None),
    "floats": ([1.5, 2.0, 3.5, -1.0], None),
    "numpy float32": ([numpy.float32(1.5), numpy.float32(2.5)], None),
    "numpy 0-d int32 arrays": ([numpy.array(1, numpy.int32), numpy.array(-2, numpy.int32)], None),
    "float tensors": ([torch.tensor(1.0), torch.tensor(-2.0), torch.tensor(4.0)], None),
    "half tensors": ([torch.tensor(v, dtype=torch.float16) for v in (1.0, 2.0, 4.0)], None),
    "int tensors": ([torch.tensor(3), torch.tensor(4)], None),
    "tensors with grad": ([torch.tensor(1.5, requires_grad=True), torch.tensor(2.0)], None),
    "mixed floats and tensors": ([1.0, torch.tensor(2.0), 5.0], None),
    "float weights": ([1.0, 2.0, 3.0], [0.5, 2, 1.5]),
    "numpy and tensor weights": (
        [1.0, 2.0, 3.0],
        [0.5, numpy.array(0.4), torch.tensor(0.3)],
    ),
    "tensor values, int weights": ([torch.tensor(1.0), torch.tensor(3.0)], [3, 1]),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_summary_results_have_ppe_types_and_values(name: str) -> None:
    values, weights = SEQUENCES[name]

    def scenario(reporting: Any) -> Any:
        summary = _summary_of(reporting, values, weights)
        return summary.compute_mean(), summary.make_statistics(), summary.state_dict()

    ours, theirs = scenario(ppe.reporting), scenario(_ppe_reporting())
    if name == "numpy and tensor weights":
        # PPE truncates a fractional total weight to an int in its state (1.2 -> 1); we keep it.
        assert (ours[2]["_n"], theirs[2]["_n"]) == (pytest.approx(1.2), 1)
        ours, theirs = ours[:2], theirs[:2]
    _same(ours, theirs)


def test_summary_of_many_tensors_matches_ppe_past_the_buffer_size() -> None:
    values = [torch.tensor(float(i % 13) + 50.0) for i in range(700)]
    _both(lambda reporting: _summary_of(reporting, values).make_statistics())


def test_deferred_values_are_called_when_the_summary_is_read() -> None:
    def scenario(reporting: Any) -> Any:
        calls: list[int] = []

        def deferred(value: float) -> Callable[[], float]:
            def read() -> float:
                calls.append(1)
                return value

            return read

        reporter = reporting.Reporter()
        observation: dict[str, Any] = {}
        with reporter.scope(observation):
            reporting.report({"lazy": deferred(2.0), "now": 1.0})
        summary = reporting.DictSummary()
        summary.add(observation)
        summary.add({"lazy": (deferred(5.0), 3)})
        before = len(calls)
        return before, summary.compute_mean(), len(calls), summary.state_dict()

    _both(scenario)
    before, means, after, _ = scenario(ppe.reporting)
    assert (before, after) == (0, 2)
    assert means["lazy"] == pytest.approx((2.0 + 5.0 * 3) / 4)


def test_summaries_add_up_like_ppe() -> None:
    def scenario(reporting: Any) -> Any:
        a = _summary_of(reporting, [torch.tensor(1.0), torch.tensor(2.0)])
        b = _summary_of(reporting, [torch.tensor(10.0)], [torch.tensor(2.0)])
        c = _summary_of(reporting, [4.0, 6.0])
        both = a + b
        # The operands are unchanged; the sum holds all the values.
        return a.compute_mean(), both.make_statistics(), (both + c).compute_mean(), c + c

    ours = scenario(ppe.reporting)
    theirs = scenario(_ppe_reporting())
    _same(ours[:3], theirs[:3])
    _same(ours[3].make_statistics(), theirs[3].make_statistics())


def test_dict_summaries_add_up_like_ppe() -> None:
    def scenario(reporting: Any) -> Any:
        a = reporting.DictSummary()
        b = reporting.DictSummary()
        a.add({"loss": torch.tensor(1.0), "acc": 0.5})
        a.add({"loss": torch.tensor(3.0)})
        b.add({"loss": (torch.tensor(5.0), 2), "lr": numpy.float32(0.1)})
        total = a + b
        total.add({"acc": 1.0})
        return total.compute_mean(), total.make_statistics(), a

    ours, theirs = scenario(ppe.reporting), scenario(_ppe_reporting())
    _same(ours[:2], theirs[:2])
    # PPE's sum shares the entries only one side has, so adding to the sum changed ``a`` too;
    # ours copies them and leaves the operands alone.
    assert to_floats(ours[2].compute_mean()) == {"loss": 2.0, "acc": 0.5}
    assert theirs[2].compute_mean()["acc"] == 0.75


def test_dict_summary_entries_like_ppe() -> None:
    def scenario(reporting: Any) -> Any:
        summary = reporting.DictSummary()
        summary.add({"numpy": numpy.array(3, "f"), "int": 1, "float": 4.0, "t": torch.tensor(1)})
        summary.add({"numpy": numpy.array(1, "f"), "int": 5, "vector": torch.ones(3)})
        summary.add({"w": (2.0, numpy.array(0.5)), "t": torch.tensor(2)})
        return summary.compute_mean(), summary.make_statistics()

    _both(scenario)


@pytest.mark.parametrize("bad_weight", [numpy.array([0.5]), torch.ones(1)])
def test_dict_summary_non_scalar_weight_is_a_value_error(bad_weight: Any) -> None:
    for reporting in (ppe.reporting, _ppe_reporting()):
        with pytest.raises(ValueError):
            reporting.DictSummary().add({"a": (4.0, bad_weight)})


def _torch_roundtrip(state: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("writer", ["ppe", "ppe_core"])
def test_summary_state_written_by_either_loads_in_the_other(writer: str) -> None:
    """A snapshot's DictSummary state moves between PPE and ppe-core with the same result."""
    source, target = (
        (_ppe_reporting(), ppe.reporting) if writer == "ppe" else (ppe.reporting, _ppe_reporting())
    )
    first = [{"loss": torch.tensor(float(i)), "acc": i / 4, "n": i} for i in range(5)]
    rest = [{"loss": torch.tensor(7.0), "acc": 0.25, "n": 3}]
    written = source.DictSummary()
    for entry in first:
        written.add(entry)
    state = _torch_roundtrip(written.state_dict())
    loaded = target.DictSummary()
    loaded.load_state_dict(state)
    reference = _ppe_reporting().DictSummary()
    reference.load_state_dict(state)
    for summary in (loaded, reference):
        for entry in rest:
            summary.add(entry)
    _same(loaded.make_statistics(), reference.make_statistics())
    _same(loaded.state_dict(), reference.state_dict())


def test_scalar_helpers_match_ppe() -> None:
    from pytorch_pfn_extras import _scalar

    pairs: list[tuple[Any, Any]] = [
        (7, 2),
        (7.0, 2),
        (torch.tensor(7, dtype=torch.int64), 2),
        (torch.tensor(7.0, dtype=torch.float16), 3),
        (3, torch.tensor(4.0)),
        (numpy.float32(1.5), 2),
    ]
    for name in ("divide_scalar", "multiply_scalar", "subtract_scalar"):
        ours, theirs = getattr(ppe.reporting, name), getattr(_scalar, name)
        for a, b in pairs:
            _same(ours(a, b), theirs(a, b))


def test_reporter_usage_like_ppe() -> None:
    def scenario(reporting: Any) -> Any:
        reporter = reporting.Reporter()
        model = torch.nn.Sequential(torch.nn.Linear(1, 1))
        reporter.add_observer("main", model)
        reporter.add_observers("main/", model.named_children())
        observer = object()
        reporter.add_observer("o", observer)
        reporter.report({"x": 1}, observer)  # outside any scope: into reporter.observation
        observation: dict[str, Any] = {}
        inner: dict[str, Any] = {}
        with reporter.scope(observation):
            current = reporting.get_current_reporter() is reporter
            reporting.report({"loss": torch.tensor(2.0, requires_grad=True)}, model)
            reporting.report({"y": 3}, model[0])
            with reporting.report_scope(inner):
                reporting.report({"z": 4})
        with reporter:
            reporting.report({"w": 5})
        grad = observation["main/loss"].requires_grad
        return current, grad, reporter.observation, observation, inner

    _both(scenario)


def test_reporter_errors_have_ppe_types() -> None:
    for reporting in (ppe.reporting, _ppe_reporting()):
        reporter = reporting.Reporter()
        with reporter, pytest.raises(KeyError):
            reporting.report({"x": 1}, object())
        with pytest.raises(IndexError):
            reporting.get_current_reporter()
        reporting.report({"x": 1})  # no current reporter: silently ignored


def test_ppe_reporting_names_exist() -> None:
    public = {name for name in dir(_ppe_reporting()) if not name.startswith("_")}
    typing_helpers = {
        "Any", "Callable", "Dict", "Generator", "List", "Mapping", "Optional", "Sequence",
        "Tuple", "Type", "Union", "overload", "collections", "contextlib", "numpy", "threading",
        "torch", "types", "warnings",
    }  # fmt: skip
    assert public - typing_helpers <= set(dir(ppe.reporting))
