"""Behaviour next to pytorch-pfn-extras 0.9 where ppe-core used to differ (issue 21).

Each scenario runs the same PPE-style code with PPE and with ppe-core and compares what a
user sees.
"""

from __future__ import annotations

import io
import json
import os
import threading
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._snapshot import load_snapshot

import ppe_core
from ppe_core.errors import ConfigurationError
from ppe_core.runtime import get_runtime


@pytest.fixture(scope="module")
def pfn() -> types.ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pytorch_pfn_extras
        import pytorch_pfn_extras.training.extensions
    return pytorch_pfn_extras


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)) for _ in range(6)]


def _observed_statistics(lib: types.ModuleType) -> list[dict[str, float]]:
    """Trains 2 epochs of 3 iterations with ParameterStatistics; the rows a reader sees."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    rows: list[dict[str, float]] = []

    @lib.training.make_extension(trigger=(1, "iteration"), priority=-1000)
    def record(manager: Any) -> None:
        rows.append({k: float(v) for k, v in manager.observation.items() if "/" in k})

    manager = lib.training.ExtensionsManager(
        model, optimizer, 2, iters_per_epoch=3, out_dir="unused"
    )
    manager.extend(lib.training.extensions.ParameterStatistics(model))
    manager.extend(record)
    for x, y in _batches():
        with manager.run_iteration():
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return rows


def test_parameter_statistics_report_the_epochs_mean_like_ppe(pfn: types.ModuleType) -> None:
    expected = _observed_statistics(pfn)
    got = _observed_statistics(ppe_core)
    assert [bool(r) for r in got] == [bool(r) for r in expected] == [0, 0, 1, 0, 0, 1]
    assert len(expected[2]) == 40  # 4 parameters x (data, grad) x 5 statistics
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.keys() == theirs.keys()
        for key in theirs:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), key


def _manager(lib: types.ModuleType, max_epochs: int) -> tuple[Any, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return lib.training.ExtensionsManager(model, optimizer, max_epochs, iters_per_epoch=3), model


@pytest.mark.parametrize("source", ["pytorch_pfn_extras", "ppe_core"])
def test_a_manager_of_zero_epochs_loads_a_state_like_ppe(
    pfn: types.ModuleType, source: str
) -> None:
    trained, trained_model = _manager(pfn if source == "pytorch_pfn_extras" else ppe_core, 1)
    for x, y in _batches()[:3]:
        with trained.run_iteration():
            torch.nn.functional.mse_loss(trained_model(x), y).backward()
            trained.optimizers["main"].step()
    state = trained.state_dict()
    pfn_loader, _ = _manager(pfn, 0)  # PPE accepts 0: a manager built only to load a state
    loader, model = _manager(ppe_core, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPE warns about the version of ppe-core states
        pfn_loader.load_state_dict(state)
    loader.load_state_dict(state)
    assert loader.iteration == pfn_loader.iteration == 3
    torch.testing.assert_close(model.state_dict(), trained_model.state_dict(), rtol=0, atol=0)
    assert loader.stop_trigger  # nothing more to train (PPE divides by zero here)
    assert loader.training_length == (0, "epoch")
    with pytest.raises(ConfigurationError, match="max_epochs must be >= 0, got -1"):
        _manager(ppe_core, -1)


class _CountingSampler(torch.utils.data.SequentialSampler):  # type: ignore[type-arg]
    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_logic_train_epoch_begin_sets_the_samplers_epoch_like_ppe(pfn: types.ModuleType) -> None:
    for lib in (pfn, ppe_core):
        sampler = torch.utils.data.DistributedSampler(range(8), num_replicas=2, rank=0)
        loader = torch.utils.data.DataLoader(range(8), sampler=sampler)
        model = torch.nn.Linear(1, 1)
        lib.handler.Logic().train_epoch_begin({"main": model}, 3, loader)
        assert sampler.epoch == 3, lib.__name__


class _Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), y)}


class _OwnEpochBegin(ppe_core.handler.Logic):
    def train_epoch_begin(self, models: Any, epoch: int, loader: Any) -> None:
        models["main"].train()  # does not call super(): the handler sets the epoch


@pytest.mark.parametrize("logic", [None, _OwnEpochBegin])
def test_trainer_sets_the_samplers_epoch_once_per_epoch(logic: Any) -> None:
    data = [{"x": torch.randn(3), "y": torch.randn(2)} for _ in range(4)]
    sampler = _CountingSampler(data)
    loader = torch.utils.data.DataLoader(data, sampler=sampler, batch_size=2)  # type: ignore[arg-type]
    model = ppe_core.to(_Regressor(), "cpu")
    trainer = ppe_core.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        3,
        logic=None if logic is None else logic(),
    )
    trainer.run(loader)
    assert sampler.epochs == [0, 1, 2]


class _LockedRuntime(ppe_core.runtime.PyTorchRuntime):
    """A runtime that cannot be pickled (it holds a lock)."""

    def __init__(self, device_spec: Any, options: Any = None) -> None:
        super().__init__(device_spec, options)
        self.lock = threading.Lock()


class _RefusingRuntime(ppe_core.runtime.PyTorchRuntime):
    def __getstate__(self) -> Any:
        raise NotImplementedError("this runtime cannot be pickled")


@pytest.mark.parametrize("runtime_class", [_LockedRuntime, _RefusingRuntime])
def test_torch_save_of_a_module_on_an_unpicklable_runtime_saves_it_like_ppe(
    pfn: types.ModuleType, runtime_class: Any
) -> None:
    torch.manual_seed(0)
    model = ppe_core.to(torch.nn.Linear(3, 2), "cpu", runtime_class=runtime_class)
    assert isinstance(get_runtime(model), runtime_class)
    buffer = io.BytesIO()
    torch.save(model, buffer)  # PPE saves such a module; the runtime tag does not travel
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded.state_dict(), model.state_dict(), rtol=0, atol=0)
    assert get_runtime(loaded) is None and get_runtime(model) is not None
    ppe_core.to(loaded, "cpu")  # the copy is moved again to get a runtime
    assert get_runtime(loaded) is not None


def _path_savefun(obj: Any, path: Any) -> None:
    """A savefun written for a writer that passes the final path; it touches what it wrote."""
    torch.save(obj, path)
    os.utime(path)


def _file_savefun(obj: Any, file_obj: Any) -> None:
    """A savefun that uses the real file PPE's writers pass (its name), touching it."""
    torch.save(obj, file_obj)
    file_obj.flush()
    os.utime(file_obj.name)


def _path_writer(lib: types.ModuleType, out_dir: Path) -> Any:
    class PathWriter(lib.writing.Writer):  # type: ignore[name-defined,misc]
        """A PPE-style custom writer: calls savefun with the final path, then touches it."""

        def __call__(
            self, filename: str, out_dir: str, target: Any, *, savefun: Any = None, **kw: Any
        ) -> None:
            path = os.path.join(out_dir, filename)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            (savefun or torch.save)(target, path)
            os.utime(path)

    return PathWriter(out_dir=str(out_dir))


@pytest.mark.parametrize("case", ["custom writer", "path savefun", "file savefun"])
def test_custom_savefun_and_writer_are_called_like_ppe(
    pfn: types.ModuleType, tmp_path: Path, case: str
) -> None:
    results = {}
    for lib in (pfn, ppe_core):
        out = tmp_path / lib.__name__
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        writer = None if case == "file savefun" else _path_writer(lib, out)
        savefun = {"custom writer": None, "path savefun": _path_savefun}.get(case, _file_savefun)
        manager = lib.training.ExtensionsManager(
            model, optimizer, 3, iters_per_epoch=2, out_dir=str(out), writer=writer
        )
        manager.extend(lib.training.extensions.snapshot(savefun=savefun, n_retains=1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PPE's deprecation warnings
            for x, y in _batches():
                with manager.run_iteration():
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    optimizer.step()
        results[lib.__name__] = (sorted(p.name for p in out.iterdir()), model)
    names, model = results["ppe_core"]
    # Stale snapshots are removed; the newest has its manifest (PPE keeps all three when its
    # cleanup hook does not run, i.e. with a custom writer).
    assert names == [".snapshot_iter_6.manifest.json", "snapshot_iter_6"]
    assert "snapshot_iter_6" in results["pytorch_pfn_extras"][0]
    state = load_snapshot(str(tmp_path / "ppe_core" / "snapshot_iter_6"))  # verified
    resumed, resumed_model = _manager(pfn, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPE warns about the version of ppe-core states
        resumed.load_state_dict(state)  # PPE resumes from it
    assert resumed.iteration == 6
    torch.testing.assert_close(resumed_model.state_dict(), model.state_dict(), rtol=0, atol=0)


def _traced_names(lib: types.ModuleType, tmp_path: Path, fail_at: int | None = None) -> list[str]:
    """The tracer's event names (in recording order) of a create_trainer run with a trace."""
    torch.manual_seed(0)
    model = _Regressor()
    lib.to(model, "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [{"x": torch.randn(3), "y": torch.randn(2)} for _ in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=2)  # type: ignore[arg-type]

    @lib.training.make_extension(trigger=(1, "iteration"))
    def fail(manager: Any) -> None:
        if manager.iteration == fail_at:
            raise RuntimeError("extension failed")

    trainer = lib.engine.create_trainer(
        model,
        optimizer,
        2,
        evaluator=lib.engine.create_evaluator(model),
        extensions=[lib.training.extensions.LogReport(), fail],
        enable_trace=True,
        out_dir=str(tmp_path / lib.__name__),
    )
    tracer = lib.profiler.get_tracer()
    tracer.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPE's deprecation warnings
        if fail_at is None:
            trainer.run(loader, loader)
        else:
            with pytest.raises(RuntimeError, match="extension failed"):
                trainer.run(loader, loader)
    events = tracer.state_dict()["_event_list"]  # a JSON list, in both libraries
    names = [e["name"] for e in (json.loads(events) if isinstance(events, str) else events)]
    tracer.clear()
    # PPE's train-step section is named after its package; ppe-core's after ppe's path.
    return [n.replace("pytorch_pfn_extras.", "ppe.") for n in names]


def test_enable_trace_records_the_sections_ppe_records(
    pfn: types.ModuleType, tmp_path: Path
) -> None:
    expected = _traced_names(pfn, tmp_path)
    got = _traced_names(ppe_core, tmp_path)
    assert len(expected) == 50  # 8 steps x 5 sections, 8 LogReport calls, 2 Evaluator calls
    assert got == expected  # the same sections, nested the same way (recorded as they end)


def test_enable_trace_sections_are_closed_when_training_fails(tmp_path: Path) -> None:
    names = _traced_names(ppe_core, tmp_path, fail_at=3)
    # The failing step's sections end too (with the error), so a trace shows where it failed.
    assert names.count("ppe.training.Trainer:iteration") == 3
    assert names.count("ppe.training.Trainer:run_iteration") == 3
