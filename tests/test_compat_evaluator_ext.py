"""PPE's extension-style evaluators and metrics, used as PPE code uses them.

Each scenario is written once against a ``ppe`` module and, where PPE is installed (the dev
extra), run with both ``pytorch_pfn_extras`` and ``ppe_core`` to compare what they report.
"""

from __future__ import annotations

import collections
import importlib
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ppe_core as ppe
from ppe_core.errors import IgnoredArgumentWarning


def _reference() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPE warns about optional packages at import
        return importlib.import_module("pytorch_pfn_extras")


class Net(torch.nn.Module):
    """Reports its own loss through the reporter, with itself as the observer."""

    def __init__(self, lib: ModuleType) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 2)
        self._lib = lib

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        loss = F.cross_entropy(y, t)
        self._lib.reporting.report({"loss": loss}, self)
        return y


def _data(n: int = 24, batch_size: int = 6) -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    t = (x[:, 0] > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, t), batch_size=batch_size)


def _manual_loop(lib: ModuleType, **evaluator_kwargs: Any) -> list[dict[str, float]]:
    """PPE's manual pattern: ExtensionsManager + extensions.Evaluator + run_iteration."""
    model = Net(lib)
    aux = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train, val = _data(), _data(12, 4)
    manager = lib.training.ExtensionsManager(
        {"main": model}, {"main": optimizer}, 2, iters_per_epoch=len(train)
    )

    def eval_func(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        y = model(x, t)
        lib.reporting.report({"val/loss": F.cross_entropy(y, t).item()})
        lib.reporting.report({"scale": aux.weight.abs().sum()}, aux)
        return y

    manager.extend(
        lib.training.extensions.Evaluator(
            val, {"main": model, "aux": aux}, eval_func=eval_func, **evaluator_kwargs
        )
    )
    seen: list[dict[str, float]] = []
    while not manager.stop_trigger:
        for x, t in train:
            with manager.run_iteration():
                optimizer.zero_grad()
                F.cross_entropy(model(x, t), t).backward()
                optimizer.step()
            if manager.iteration % len(train) == 0:
                seen.append({k: float(v) for k, v in manager.observation.items()})
    return seen


def test_manual_manager_loop_reports_what_ppe_reports() -> None:
    ours = _manual_loop(ppe)
    theirs = _manual_loop(_reference())
    assert [sorted(o) for o in ours] == [sorted(o) for o in theirs]
    # Named after the extension ('validation'), then the target name; plain reports as-is.
    assert {"val/loss", "validation/main/loss", "validation/aux/scale", "main/loss"} <= set(ours[0])
    for mine, reference in zip(ours, theirs, strict=True):
        for key, value in reference.items():
            assert mine[key] == pytest.approx(value, rel=1e-5), key
    assert ours[0]["val/loss"] != ours[1]["val/loss"]  # evaluated after each epoch's training


def test_evaluator_defaults_match_ppe() -> None:
    ext = ppe.training.extensions
    ref = _reference().training.extensions
    for cls, ref_cls in (
        (ext.Evaluator, ref.Evaluator),
        (ext.IgniteEvaluator, ref.IgniteEvaluator),
    ):
        assert cls.default_name == ref_cls.default_name == "validation"
        assert cls.trigger == ref_cls.trigger == (1, "epoch")
        assert cls.priority == ref_cls.priority == ppe.training.PRIORITY_WRITER
    assert ext.DistributedEvaluator.__mro__[1] is ext.Evaluator
    evaluator = ext.Evaluator(_data(), torch.nn.Linear(4, 2))
    assert evaluator.name is None and evaluator.eval_hook is None
    assert list(evaluator.get_all_iterators()) == list(evaluator.get_all_targets()) == ["main"]


def test_called_directly_returns_and_reports_the_means() -> None:
    model = Net(ppe)
    evaluator = ppe.training.extensions.Evaluator(_data(), model)
    reporter = ppe.reporting.Reporter()
    with reporter:
        result = evaluator()
    assert reporter.observation == result
    x, t = _data(24, 24).dataset.tensors  # type: ignore[attr-defined]
    with torch.no_grad():
        batches = [F.cross_entropy(model.fc(x[i : i + 6]), t[i : i + 6]) for i in range(0, 24, 6)]
    assert list(result) == ["main/loss"]
    assert float(result["main/loss"]) == pytest.approx(torch.stack(batches).mean().item())
    evaluator.name = "eval"  # the registered name prefixes the observers
    assert list(evaluator()) == ["eval/main/loss"]


def test_tuple_dict_and_single_batches_are_passed_as_ppe_passes_them() -> None:
    calls: dict[str, list[Any]] = collections.defaultdict(list)

    class Point(tuple):  # a namedtuple-like batch is passed whole
        _fields = ("x", "y")

    def record(kind: str) -> Any:
        def eval_func(*args: Any, **kwargs: Any) -> None:
            calls[kind].append((args, kwargs))

        return eval_func

    loaders: dict[str, list[Any]] = {
        "tuple": [(1, 2)],
        "list": [[1, 2]],
        "dict": [{"x": 1, "y": 2}],
        "tensor": [torch.ones(1)],
        "named": [Point((1, 2))],
    }
    for kind, loader in loaders.items():
        ppe.training.extensions.Evaluator(loader, {}, eval_func=record(kind)).evaluate()
    assert calls["tuple"] == calls["list"] == [((1, 2), {})]
    assert calls["dict"] == [((), {"x": 1, "y": 2})]
    assert calls["tensor"][0][0][0] is loaders["tensor"][0]
    assert calls["named"][0][0] == (loaders["named"][0],)


def test_metrics_get_ppe_arguments_and_dict_results_are_reported() -> None:
    seen: list[tuple[int, bool]] = []

    def ppe_style(batch: Any, out: torch.Tensor, last_iteration: bool) -> None:
        seen.append((len(batch[0]), last_iteration))
        ppe.reporting.report({"custom": out.sum()})

    def returns_dict(batch: Any, out: torch.Tensor) -> dict[str, Any]:
        return {"mean_output": out.mean()}

    model = torch.nn.Linear(4, 2)
    evaluator = ppe.training.extensions.Evaluator(
        _data(10, 4), model, eval_func=lambda x, t: model(x), metrics=[ppe_style]
    )
    evaluator.add_metric(returns_dict)
    result = evaluator()
    assert seen == [(4, False), (4, False), (2, True)]
    assert sorted(result) == ["custom", "mean_output"]


def test_ppe_metric_receives_the_same_arguments_in_ppe_and_ppe_core() -> None:
    def run(lib: ModuleType) -> tuple[list[bool], dict[str, float]]:
        flags: list[bool] = []

        def metric(batch: Any, out: torch.Tensor, last: bool) -> None:
            flags.append(last)
            lib.reporting.report({"n": float(len(out))})

        model = torch.nn.Linear(4, 2)
        evaluator = lib.training.extensions.Evaluator(
            _data(10, 4), model, eval_func=lambda x, t: model(x), metrics=[metric]
        )
        with lib.reporting.Reporter():
            result = evaluator()
        return flags, dict(result)

    assert run(ppe) == run(_reference())


def test_evaluation_runs_in_eval_mode_without_grad_and_restores_modes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Dropout(0.5))
    frozen = torch.nn.Linear(2, 2).eval()
    states: list[tuple[bool, bool, bool]] = []

    def eval_func(x: torch.Tensor, t: torch.Tensor) -> None:
        states.append((model.training, frozen.training, torch.is_grad_enabled()))

    hooked: list[Any] = []
    evaluator = ppe.training.extensions.Evaluator(
        _data(8, 4),
        {"main": model, "frozen": frozen},
        eval_hook=hooked.append,
        eval_func=eval_func,
    )
    evaluator()
    assert states == [(False, False, False)] * 2
    assert hooked == [evaluator]
    assert model.training and not frozen.training


def test_progress_bar_prints_ppe_lines_without_cursor_control_off_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    evaluator = ppe.training.extensions.Evaluator(
        _data(8, 4), {}, eval_func=lambda x, t: None, progress_bar=True
    )
    evaluator.name = "val_set"
    evaluator.evaluate()
    out = capsys.readouterr().out
    assert "val_set [" + "." * 50 + "]  0.00%" in out
    assert "val_set [" + "#" * 25 + "." * 25 + "] 50.00%" in out
    assert "val_set [" + "#" * 50 + "] 100.00%" in out
    assert "      2 iterations" in out
    assert "iters/sec. Estimated time to finish:" in out
    assert "\033" not in out


def test_progress_bar_redraws_in_place_on_a_terminal() -> None:
    class Terminal(list[str]):
        def write(self, text: str) -> None:
            self.append(text)

        def isatty(self) -> bool:
            return True

        def flush(self) -> None:
            pass

    from ppe_core.training.extensions import util

    class Bar(util.ProgressBar):  # PPE's base for custom text bars
        def get_lines(self) -> list[str]:
            return ["one\n", "two\n"]

    out = Terminal()
    bar = Bar(out=out)  # type: ignore[arg-type]
    bar.update()
    bar.close()
    assert out == ["\033[J", "one\n", "two\n", "\033[2A", "\033[J"]


def test_loader_without_len_and_empty_loader() -> None:
    def batches() -> Any:
        yield from [(torch.ones(2), 1.0), (torch.ones(2), 3.0)]

    class NoLen:
        def __iter__(self) -> Any:
            return batches()

    flags: list[bool] = []
    evaluator = ppe.training.extensions.Evaluator(
        NoLen(),
        {},
        eval_func=lambda x, v: ppe.reporting.report({"v": v}),
        metrics=[lambda b, o, last: flags.append(last)],
        progress_bar=True,
    )
    assert evaluator() == {"v": 2.0}
    assert flags == [False, True]
    empty = ppe.training.extensions.Evaluator([], {}, eval_func=lambda *a: None)
    assert empty() == {}


def test_unknown_keyword_arguments_are_ignored_with_a_warning() -> None:
    with pytest.warns(IgnoredArgumentWarning, match=r"\['device'\]"):
        evaluator = ppe.training.extensions.Evaluator(_data(), torch.nn.Linear(4, 2), device="cpu")
    assert not evaluator._progress_bar


def test_missing_target_is_a_key_error_naming_the_fix() -> None:
    evaluator = ppe.training.extensions.Evaluator(_data(), {"other": torch.nn.Linear(4, 2)})
    with pytest.raises(KeyError, match="no eval_func and no target named 'main'"):
        evaluator()


def test_bad_arguments_are_rejected_early() -> None:
    with pytest.raises(TypeError, match=r"target must be a torch\.nn\.Module"):
        ppe.training.extensions.Evaluator(_data(), "model")
    with pytest.raises(TypeError, match="wrap a single metric in a list"):
        ppe.training.extensions.Evaluator(_data(), {}, metrics=lambda b, o, last: None)


# ----------------------------------------------------------------------- distributed


@pytest.fixture
def gloo_world(tmp_path: Path) -> Any:
    """A single-process gloo group (world size 1), torn down after the test."""
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_distributed_evaluator_needs_an_initialised_process_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        ppe.training.extensions.DistributedEvaluator(_data(), torch.nn.Linear(4, 2))


@pytest.mark.usefixtures("gloo_world")
def test_distributed_evaluator_in_a_one_process_group_matches_evaluator() -> None:
    model = Net(ppe)
    plain = ppe.training.extensions.Evaluator(_data(), model)()
    distributed = ppe.training.extensions.DistributedEvaluator(_data(), model, progress_bar=False)()
    assert distributed.keys() == plain.keys() == {"main/loss"}
    assert float(distributed["main/loss"]) == pytest.approx(float(plain["main/loss"]))


@pytest.mark.usefixtures("gloo_world")
def test_distributed_evaluator_weights_ranks_by_their_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Simulate a second rank that evaluated 3 batches with loss 4.0 each.
    other = ppe.reporting.DictSummary()
    for _ in range(3):
        other.add({"main/loss": 4.0})
    real = ppe.training.extensions.evaluator._dist_gather

    def gather(obj: Any) -> list[Any]:
        return [*real(obj), other]

    monkeypatch.setattr(ppe.training.extensions.evaluator, "_dist_gather", gather)
    model = torch.nn.Linear(4, 2)

    def eval_func(x: torch.Tensor, t: torch.Tensor) -> None:
        ppe.reporting.report({"loss": 0.0}, model)

    result = ppe.training.extensions.DistributedEvaluator(_data(), model, eval_func=eval_func)()
    assert float(result["main/loss"]) == pytest.approx(3 * 4.0 / 7)  # 4 batches here, 3 there


def test_distributed_evaluator_shows_the_bar_on_rank_zero_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for rank, shown in ((0, True), (1, False)):
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        evaluator = ppe.training.extensions.DistributedEvaluator(
            _data(), torch.nn.Linear(4, 2), progress_bar=True
        )
        assert evaluator._progress_bar is shown


# ----------------------------------------------------------------------- ignite


def _ignite_run(lib: ModuleType) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit, at ignite's import
        from ignite.engine import Engine
        from ignite.metrics import MeanSquaredError

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    count = [0.0]

    def step(engine: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        lib.reporting.report({"x": count[0]}, model)
        count[0] += 1.0
        with torch.no_grad():
            return model(batch[0]), batch[1]

    engine = Engine(step)
    MeanSquaredError().attach(engine, "mse")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 2, generator=g), torch.randn(10, 2, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=3)
    evaluator = lib.training.extensions.IgniteEvaluator(engine, loader, model)
    with lib.reporting.Reporter():
        return {k: float(v) for k, v in evaluator().items()}


@pytest.mark.filterwarnings("ignore::UserWarning:ignite")
def test_ignite_evaluator_reports_process_values_and_ignite_metrics_like_ppe() -> None:
    ours = _ignite_run(ppe)
    assert ours["main/x"] == 1.5  # 0, 1, 2, 3 over four batches
    assert ours == pytest.approx(_ignite_run(_reference()))
    assert set(ours) == {"main/x", "val/mse"}


def test_ignite_evaluator_without_ignite_names_the_package(hide_module: Any) -> None:
    hide_module("ignite")
    with pytest.raises(ImportError, match="pip install pytorch-ignite"):
        ppe.training.extensions.IgniteEvaluator(object(), [], torch.nn.Linear(2, 2))


# ----------------------------------------------------------------------- metrics


class Classifier(torch.nn.Module):
    """Predicts the right label for the first ``correct`` examples of each batch of 10."""

    def __init__(self, correct: int) -> None:
        super().__init__()
        self.correct = correct

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = t.clone()
        y[self.correct :] += 1
        return {"y": y}


@pytest.mark.parametrize("correct", [0, 3, 10])
def test_accuracy_metric_in_create_evaluator_reports_val_accuracy_like_ppe(correct: int) -> None:
    def run(lib: ModuleType) -> float:
        data = torch.utils.data.DataLoader(
            [{"x": torch.rand(3), "t": torch.randint(0, 5, (1,))} for _ in range(20)],
            batch_size=10,
        )
        model = Classifier(correct)
        lib.to(model, "cpu")
        evaluator = lib.engine.create_evaluator(
            model,
            device="cpu",
            metrics=[lib.training.metrics.AccuracyMetric("t", "y")],
            options={"eval_report_keys": ["accuracy"]},
        )
        observation: dict[str, Any] = {}
        with lib.reporting.Reporter().scope(observation):
            evaluator.run(data)
        return float(observation["val/accuracy"])

    assert run(ppe) == pytest.approx(correct / 10)
    assert run(ppe) == pytest.approx(run(_reference()))


def test_accuracy_metric_called_directly() -> None:
    metric = ppe.training.metrics.AccuracyMetric(label_key="t", output_key="y")
    assert ppe.training.AccuracyMetric is type(metric)
    assert (metric.label_key, metric.output_key) == ("t", "y")
    batch = {"t": torch.tensor([1, 2, 3, 4])}
    # Predictions beyond the labels (a padded last batch) are ignored, as in PPE.
    result = metric(batch, {"y": torch.tensor([1, 0, 3, 4, 9, 9])})
    assert float(result["accuracy"]) == 0.75
    reference = _reference().training.metrics.AccuracyMetric("t", "y")
    assert reference(batch, {"y": torch.tensor([1, 0, 3, 4, 9, 9])}) == {"accuracy": 0.75}
    with pytest.raises(KeyError, match="no 'y' in the outputs"):
        metric(batch, {"pred": torch.tensor([1])})


# ----------------------------------------------------------------------- namespace


def test_snapshot_mode_is_in_the_extensions_namespace() -> None:
    from ppe_extensions import _snapshot

    mode = ppe.training.extensions.SnapshotMode
    assert mode is _snapshot.SnapshotMode
    assert "SnapshotMode" in dir(ppe.training.extensions)
    # PPE's modes, in PPE's order, then ppe-core's own DCP mode (torch.distributed.checkpoint).
    ppe_modes = [m.name for m in _reference().training.extensions.SnapshotMode]
    assert [m.name for m in mode] == [*ppe_modes, "DCP"]


def test_ppe_submodule_paths_import() -> None:
    from ppe_core.training.extensions.accumulate import AverageAccumulate
    from ppe_core.training.extensions.evaluator import DistributedEvaluator, Evaluator
    from ppe_core.training.extensions.log_report import LogReport
    from ppe_core.training.extensions.print_report import PrintReport
    from ppe_core.training.extensions.snapshot_writers import SimpleWriter

    ext = ppe.training.extensions
    assert (Evaluator, DistributedEvaluator) == (ext.Evaluator, ext.DistributedEvaluator)
    assert (LogReport, PrintReport, AverageAccumulate) == (
        ext.LogReport,
        ext.PrintReport,
        ext.AverageAccumulate,
    )
    assert SimpleWriter is ppe.writing.SimpleWriter
    assert callable(ext.snapshot)  # a function, as in PPE, not a submodule

    # Every PPE submodule imports, and what PPE also exposes in the namespace is the same
    # object in both places here.
    ref_ext = _reference().training.extensions
    ppe_submodules = {
        p.stem
        for p in Path(ref_ext.__file__).parent.iterdir()
        if not p.stem.startswith("_") and p.stem != "__pycache__"
    }
    not_provided = {"print_report_notebook", "progress_bar_notebook"}  # docs/migration.md
    for name in sorted(ppe_submodules - not_provided):
        module = getattr(ext, name)
        assert module is importlib.import_module(f"ppe_core.training.extensions.{name}")
        assert name in dir(ext)
        reference = importlib.import_module(f"pytorch_pfn_extras.training.extensions.{name}")
        for attr in module.__all__:
            if getattr(reference, attr, None) is getattr(ref_ext, attr, object()):
                assert getattr(module, attr) is getattr(ext, attr), (name, attr)
