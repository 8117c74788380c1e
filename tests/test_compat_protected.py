"""Subclasses written against PPE 0.9's protected members run on ppe-core as on PPE.

Training libraries built on PPE subclass ``Evaluator``, ``Trainer`` and ``Handler`` and use
their underscore members: the step hooks (``_complete_step``, ``_process_metrics``,
``_gather_summaries``), the evaluation queues and progress bar (``_idxs``, ``_inputs``,
``_observed``, ``_summary``, ``_pbar``, ``_update``, ``_eval_len``, the module function
``_progress_bar``), ``Handler._runtime_iterator`` and ``Handler._setup``. Each subclass below
is written once, as such a library writes it, with ``LIB`` standing for the imported package;
each test runs it with ``pytorch_pfn_extras`` and with ``ppe_core`` (only the import changed)
on the same tiny model and compares what the run observes. docs/migration.md lists every
member ("Protected members of Trainer, Evaluator and Handler").
"""

from __future__ import annotations

import importlib
import math
import re
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("pytorch_pfn_extras")

SUBCLASSES = '''
import queue

import torch
from LIB import reporting
from LIB.handler import Handler, Logic
from LIB.training import Trainer
from LIB.training._evaluator import Evaluator, _progress_bar


class MacroEvaluator(Evaluator):
    """A library's evaluator: its own loop, PPE's queues, a macro metric over the whole set."""

    def __init__(self, handler, models, *, progress_bar=False, metrics=None, macro_metrics=None):
        super().__init__(handler, models, progress_bar=progress_bar, metrics=metrics)
        self._macro_metrics = list(macro_metrics or [])
        self._ins_list = None
        self._outs_list = None

    def _complete_step(self, idx, outs, *, is_deferred=False):
        c_idx = self._idxs.get()
        if c_idx != idx:
            raise RuntimeError(f"expected {c_idx}, completed {idx}")
        x = self._inputs.get()
        observed = self._observed.get()
        self._ins_list.append(x["t"].detach().cpu())
        self._outs_list.append(outs["y"].detach().cpu())
        with self._reporter.scope(observed):
            outs = self._process_metrics(x, outs)
            if idx + 1 == self._eval_len:
                macro_ins = {"t": torch.cat(self._ins_list)}
                macro_outs = {"y": torch.cat(self._outs_list)}
                for metric in self._macro_metrics:
                    outs.update(metric(macro_ins, macro_outs))
            self.handler.eval_post_step(self, idx, x, outs)
        self._summary.add(observed)
        self._update(idx)
        if self._idxs.qsize() == 0:
            self._pbar.__exit__(None, None, None)

    def run(self, loader, *, eval_len=None):
        self._ins_list, self._outs_list = [], []
        self._idxs = queue.Queue()
        self._inputs = queue.Queue()
        self._observed = queue.Queue()
        if eval_len is None:
            eval_len = len(loader)
        self._eval_len = eval_len
        self._summary = reporting.DictSummary()
        observation = {}
        self.handler.eval_loop_begin(self)
        self._pbar = _progress_bar("validation", self._progress_bar, eval_len)
        self._update = self._pbar.__enter__()
        loader_iter = iter(loader)
        with torch.no_grad():
            for idx in range(eval_len):
                try:
                    x = next(loader_iter)
                except StopIteration:
                    break
                self._idxs.put(idx)
                self._inputs.put(x)
                self._observed.put(observation)
                with self._reporter.scope(observation):
                    self.handler.eval_step(self, idx, x, self._complete_step)
        self.handler.eval_loop_end(self)
        reporting.report({f"macro/{k}": v for k, v in self._summary.compute_mean().items()})
        self._ins_list = self._outs_list = None


class MetricEvaluator(Evaluator):
    """Adds a metric to the outputs before the handler reports them."""

    def _process_metrics(self, ins, outs):
        outs = super()._process_metrics(ins, outs)
        outs["mae"] = (outs["y"] - ins["t"]).abs().mean()
        return outs


class CountingEvaluator(Evaluator):
    """Records every completed step, then completes it as the base class does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.completed = []

    def _complete_step(self, idx, outs, *, is_deferred=False):
        self.completed.append((idx, self._eval_len, float(outs["loss"])))
        super()._complete_step(idx, outs, is_deferred=is_deferred)


class ExtraSummaryEvaluator(Evaluator):
    """Combines the run's summary with another one, as PPE's DistributedEvaluator does."""

    def _gather_summaries(self):
        extra = reporting.DictSummary()
        extra.add({"val/extra": 2.0})
        self._summary = sum([self._summary, extra], reporting.DictSummary())


class LoggingTrainer(Trainer):
    """Logs every step's loss, and the epoch length the manager was set up with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_log = []
        self.setups = []

    def _setup_manager(self, iters_per_epoch):
        manager = super()._setup_manager(iters_per_epoch)
        self.setups.append((iters_per_epoch, sorted(self._models), self._train_len))
        return manager

    def _complete_step(self, idx, outs):
        super()._complete_step(idx, outs)
        self.step_log.append((self.manager.iteration, idx, float(outs["loss"])))


class HalfLossLogic(Logic):
    """Overrides PPE's forward and backward hooks: it backpropagates half the loss."""

    def _forward(self, model, batch):
        outs = super()._forward(model, batch)
        outs["half"] = outs["loss"] * 0.5
        return outs

    def _backward(self, outputs):
        outputs["half"].backward()


class ItemHandler(Handler):
    """A library's handler: drives the runtimes itself and reports host numbers."""

    def eval_setup(self, evaluator, loader):
        for model in evaluator.models.values():
            model.eval()
        self._setup(evaluator.models, loader)

    def train_post_step(self, trainer, batch_idx, batch, outputs):
        for _, sm, rt in self._runtime_iterator(trainer.models):
            rt.train_post_step(trainer, sm, batch_idx, batch, outputs)
        for name, out in outputs.items():
            if isinstance(out, torch.Tensor) and out.dim() == 0:
                reporting.report({f"train/{name}": out.item()})

    def eval_post_step(self, evaluator, batch_idx, batch, outputs):
        for _, sm, rt in self._runtime_iterator(evaluator.models):
            rt.eval_post_step(evaluator, sm, batch_idx, batch, outputs)
        for name, out in outputs.items():
            if isinstance(out, torch.Tensor) and out.dim() == 0:
                reporting.report({f"val/{name}": out.item()})
'''

# Log means of reported tensors are float32 sums: ppe-core sums relative to the first value
# (docs/migration.md, Reporting), so they may differ from PPE's in the last bits.
TOLERANCE = {"rel_tol": 1e-5, "abs_tol": 1e-7}
OPTIONS = {"train_report_keys": ["loss"], "eval_report_keys": ["loss"]}


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.fc(x)
        return {"loss": torch.nn.functional.mse_loss(y, t), "y": y}


def _batches(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {"x": torch.randn(4, 3, generator=g), "t": torch.randn(4, 1, generator=g)} for _ in range(n)
    ]


def _mse_over_set(ins: dict[str, torch.Tensor], outs: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"set_mse": ((outs["y"] - ins["t"]) ** 2).mean()}


def _bias(ins: dict[str, torch.Tensor], outs: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"bias": (outs["y"] - ins["t"]).mean()}


def _library(package: str) -> tuple[types.ModuleType, types.ModuleType]:
    """The package and the subclasses written against it (the import line alone differs)."""
    lib = importlib.import_module(package)
    module = types.ModuleType(f"_protected_subclasses_{package}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPE 0.9 warns about its own deprecations on import
        exec(compile(SUBCLASSES.replace("LIB", package), module.__name__, "exec"), module.__dict__)
    return lib, module


def _plain(value: Any) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _assert_close(core: dict[str, Any], ppe: dict[str, Any]) -> None:
    assert sorted(core) == sorted(ppe)
    for key, value in ppe.items():
        assert math.isclose(_plain(core[key]), _plain(value), **TOLERANCE), key


def _evaluate(
    package: str, cls: str, handler_cls: str | None = None, **kwargs: Any
) -> tuple[dict[str, Any], Any]:
    """One standalone evaluation with the subclass ``cls``: what it reported, and itself."""
    lib, subclasses = _library(package)
    model = Regressor()
    lib.to(model, "cpu")
    if handler_cls is None:
        base = lib.engine.create_evaluator(model, device="cpu", options=dict(OPTIONS))
    else:
        handler_class = getattr(subclasses, handler_cls)
        base = lib.engine.create_evaluator(model, device="cpu", handler_class=handler_class)
    evaluator = getattr(subclasses, cls)(base.handler, model, **kwargs)
    loader = _batches(3, seed=1)
    evaluator.handler.eval_setup(evaluator, loader)  # PPE's standalone evaluator needs it
    observation: dict[str, Any] = {}
    with lib.reporting.Reporter().scope(observation):
        evaluator.run(loader)
    return observation, evaluator


def test_library_evaluator_with_its_own_loop_reports_ppes_values() -> None:
    """The library's pattern: ``run`` and ``_complete_step`` replaced, PPE's queues and
    ``_progress_bar`` used, a macro metric computed at the last step from ``_eval_len``."""
    kwargs: dict[str, Any] = {"metrics": [_bias], "macro_metrics": [_mse_over_set]}
    ppe_values, _ = _evaluate("pytorch_pfn_extras", "MacroEvaluator", "ItemHandler", **kwargs)
    core_values, _ = _evaluate("ppe_core", "MacroEvaluator", "ItemHandler", **kwargs)
    assert sorted(ppe_values) == ["macro/val/bias", "macro/val/loss", "macro/val/set_mse"]
    _assert_close(core_values, ppe_values)


def test_evaluator_subclass_overriding_process_metrics_adds_its_metric() -> None:
    ppe_values, _ = _evaluate("pytorch_pfn_extras", "MetricEvaluator")
    core_values, _ = _evaluate("ppe_core", "MetricEvaluator")
    # Only the reported keys: PPE reports the keys named in eval_report_keys.
    assert sorted(ppe_values) == ["val/loss"]
    _assert_close(core_values, ppe_values)
    options = {"eval_report_keys": ["loss", "mae"]}
    results = []
    for package in ("pytorch_pfn_extras", "ppe_core"):
        lib, subclasses = _library(package)
        model = Regressor()
        lib.to(model, "cpu")
        base = lib.engine.create_evaluator(model, device="cpu", options=dict(options))
        evaluator = subclasses.MetricEvaluator(base.handler, model, metrics=[_bias])
        loader = _batches(3, seed=1)
        evaluator.handler.eval_setup(evaluator, loader)
        observation: dict[str, Any] = {}
        with lib.reporting.Reporter().scope(observation):
            evaluator.run(loader)
        results.append(observation)
    assert sorted(results[0]) == ["val/loss", "val/mae"]
    _assert_close(results[1], results[0])


def test_evaluator_subclass_overriding_complete_step_sees_every_step() -> None:
    ppe_values, ppe_evaluator = _evaluate("pytorch_pfn_extras", "CountingEvaluator")
    core_values, core_evaluator = _evaluate("ppe_core", "CountingEvaluator")
    assert [(i, n) for i, n, _ in ppe_evaluator.completed] == [(0, 3), (1, 3), (2, 3)]
    assert [(i, n) for i, n, _ in core_evaluator.completed] == [(0, 3), (1, 3), (2, 3)]
    for (_, _, core_loss), (_, _, ppe_loss) in zip(
        core_evaluator.completed, ppe_evaluator.completed, strict=True
    ):
        assert core_loss == ppe_loss
    _assert_close(core_values, ppe_values)


def test_evaluator_subclass_overriding_gather_summaries_replaces_the_summary() -> None:
    ppe_values, _ = _evaluate("pytorch_pfn_extras", "ExtraSummaryEvaluator")
    core_values, core_evaluator = _evaluate("ppe_core", "ExtraSummaryEvaluator")
    assert sorted(ppe_values) == ["val/extra", "val/loss"]
    _assert_close(core_values, ppe_values)
    assert core_evaluator._summary is core_evaluator.summary


def test_progress_bar_context_of_ppes_evaluator_module(capsys: pytest.CaptureFixture[str]) -> None:
    from ppe_core.training._evaluator import _progress_bar

    with _progress_bar("validation", False, 3) as update:
        update(0)
    assert capsys.readouterr().out == ""
    with _progress_bar("validation", True, 3) as update:
        for i in range(3):
            update(i)
    assert capsys.readouterr().out.startswith("validation: 3/3 batches in ")


def _train(package: str, out: Path, handler_cls: str | None = None) -> tuple[Any, Any]:
    """Two epochs of the LoggingTrainer on the tiny model, validating with the library's
    MacroEvaluator (or, with ``handler_cls``, the default evaluator on that handler)."""
    lib, subclasses = _library(package)
    model = Regressor()
    lib.to(model, "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handler_class = getattr(subclasses, handler_cls) if handler_cls else None
    options = {} if handler_class else dict(OPTIONS)
    kwargs: dict[str, Any] = {"handler_class": handler_class} if handler_class else {}
    evaluator = lib.engine.create_evaluator(model, device="cpu", options=dict(options), **kwargs)
    if not handler_class:  # the library's evaluator, run by the trainer
        evaluator = subclasses.MacroEvaluator(
            evaluator.handler, model, macro_metrics=[_mse_over_set]
        )
    if handler_class:  # with the library's logic too
        kwargs["logic"] = subclasses.HalfLossLogic()
    base = lib.engine.create_trainer(
        model, optimizer, 2, device="cpu", options=dict(options), **kwargs
    )
    log_report = lib.training.extensions.LogReport(filename=None)
    trainer = subclasses.LoggingTrainer(
        base.handler,
        evaluator=evaluator,
        models=model,
        optimizers=optimizer,
        max_epochs=2,
        out_dir=str(out),
        extensions=[log_report] if package == "ppe_core" else None,
    )
    if package != "ppe_core":
        trainer.extend(log_report)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPE's own deprecation warnings
        trainer.run(_batches(4, seed=0), _batches(2, seed=1))
    log = [{k: v for k, v in e.items() if k != "elapsed_time"} for e in log_report.log]
    return trainer, (log, [p.detach().clone() for p in model.parameters()])


def test_trainer_subclass_overriding_complete_step_logs_every_step(tmp_path: Path) -> None:
    ppe_trainer, (ppe_log, ppe_params) = _train("pytorch_pfn_extras", tmp_path / "ppe")
    core_trainer, (core_log, core_params) = _train("ppe_core", tmp_path / "core")
    assert [(it, idx) for it, idx, _ in ppe_trainer.step_log] == [
        (i, i % 4) for i in range(8)
    ]  # during the step, the iteration is the number of steps done before
    assert core_trainer.step_log == ppe_trainer.step_log
    assert core_trainer.setups == ppe_trainer.setups == [(4, ["main"], 4)]
    assert sorted(ppe_log[0]) == ["epoch", "iteration", "macro/val/loss", "train/loss"]
    for core, ppe in zip(core_log, ppe_log, strict=True):
        _assert_close(core, ppe)
    for core, ppe in zip(core_params, ppe_params, strict=True):
        assert torch.equal(core, ppe)


def test_handler_subclass_iterating_runtimes_logs_ppes_values(tmp_path: Path) -> None:
    """``_runtime_iterator`` in the post-steps, PPE's two-argument ``_setup``, and a Logic
    overriding ``_forward`` and ``_backward(outputs)``."""
    _, (ppe_log, ppe_params) = _train("pytorch_pfn_extras", tmp_path / "ppe", "ItemHandler")
    _, (core_log, core_params) = _train("ppe_core", tmp_path / "core", "ItemHandler")
    assert sorted(ppe_log[0]) == ["epoch", "iteration", "train/half", "train/loss", "val/loss"]
    assert core_log == ppe_log  # host numbers: bit for bit
    for core, ppe in zip(core_params, ppe_params, strict=True):
        assert torch.equal(core, ppe)


def test_protected_members_without_an_equivalent_name_their_replacement() -> None:
    import ppe_core as ppe
    from ppe_core.errors import NotProvidedError

    model = Regressor()
    ppe.to(model, "cpu")
    trainer = ppe.engine.create_trainer(model, torch.optim.SGD(model.parameters(), 0.1), 1)
    with pytest.raises(NotProvidedError, match=r"trainer\.extend"):
        _ = trainer._extensions
    assert not hasattr(trainer, "_extensions")  # an AttributeError: feature tests work
    assert trainer._models == {"main": model}
    handler: Any = trainer.handler
    assert [name for name, _, _ in handler._runtime_iterator(trainer.models)] == ["main"]
    assert handler._ppe_modules is handler._modules


@pytest.mark.parametrize(
    ("member", "replacement"),
    [
        ("_extensions", "manager.extensions"),
        ("_state_objects", "state_objects"),
        ("_internal_stop_trigger", "manager.stop_trigger"),
        ("_start_extensions_called", "start_extensions"),
        ("_run_on_error", "on_error"),
        ("_finalize_extensions", "manager.finalize"),
        ("_check_model_available", "manager.models"),
    ],
)
def test_manager_members_of_ppe_without_an_equivalent_name_their_replacement(
    member: str, replacement: str
) -> None:
    import ppe_core as ppe
    from ppe_core.errors import NotProvidedError

    model = Regressor()
    manager = ppe.training.ExtensionsManager(
        model, torch.optim.SGD(model.parameters(), 0.1), 1, iters_per_epoch=2
    )
    with pytest.raises(NotProvidedError, match=re.escape(replacement)):
        getattr(manager, member)
    assert not hasattr(manager, member)  # an AttributeError: feature tests keep working
    with pytest.raises(AttributeError, match="no attribute '_no_such_member'"):
        _ = manager._no_such_member
