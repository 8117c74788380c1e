"""Snapshots of PPE's example extension sets go from ppe-core to PPE 0.9 and back.

Both libraries must give every extension the same name (function extensions, lambdas,
duplicates), since a snapshot keeps extension states by name, and ppe-core must write PPE's
``ppe_version`` so PPE loads its snapshots without a version warning. Each resume is compared
bit for bit with uninterrupted runs in both libraries.
"""

# torch leaves Tensor.backward unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import io
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ppe_extensions._snapshot import load_snapshot

import ppe_core

EPOCHS = 3
ITERS = 4


def _ppe() -> types.ModuleType:
    import pytorch_pfn_extras

    return pytorch_pfn_extras


LIBS = {"ppe": _ppe, "ppe_core": lambda: ppe_core}
# (library that saves, library that resumes)
DIRECTIONS = [("ppe_core", "ppe"), ("ppe", "ppe_core")]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(3, 4)
        self.fc2 = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=1)


def _data(n: int = ITERS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(5, 3, generator=g), torch.randint(0, 2, (5,), generator=g)) for _ in range(n)
    ]


def _loader() -> torch.utils.data.DataLoader[Any]:
    x = torch.cat([x for x, _ in _data()])
    t = torch.cat([t for _, t in _data()])
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, t), batch_size=5)


def _mnist_extensions(
    lib: types.ModuleType, model: Net, optimizer: Any, **snapshot: Any
) -> list[Any]:
    """The extension set of PPE's example/mnist.py, plus function extensions and duplicates."""
    E = lib.training.extensions

    def evaluate(x: torch.Tensor, t: torch.Tensor) -> None:
        out = model(x)
        lib.reporting.report({"val/loss": F.nll_loss(out, t).item()})
        lib.reporting.report({"val/acc": (out.argmax(1) == t).float().mean().item()})

    @lib.training.extension.make_extension(trigger=(1, "epoch"))
    def halve_lr(manager: Any) -> None:
        for group in optimizer.param_groups:
            group["lr"] *= 0.5

    @lib.training.extension.make_extension(trigger=(1, "epoch"), default_name="custom")
    def noop(manager: Any) -> None:
        pass

    def plain(manager: Any) -> None:
        pass

    return [
        E.LogReport(),
        E.ProgressBar(out=io.StringIO()),
        E.observe_lr(optimizer=optimizer),
        E.ParameterStatistics(model, prefix="model"),
        E.VariableStatisticsPlot(model),
        E.Evaluator(_loader(), model, eval_func=evaluate, progress_bar=True),
        E.PlotReport(["train/loss", "val/loss"], "epoch", filename="loss.png"),
        E.PrintReport(["epoch", "iteration", "train/loss", "lr", "val/loss", "val/acc"]),
        E.snapshot(**snapshot),
        lambda manager: None,
        halve_lr,
        noop,
        plain,
        lambda manager: None,  # a second wrapped callable: the same default name
        E.LogReport(filename="log2"),  # two of the same class
        E.observe_value("it", lambda manager: manager.iteration),
    ]


def _manual(lib: types.ModuleType, out: Path, **snapshot: Any) -> tuple[Any, Net]:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    manager = lib.training.ExtensionsManager(
        model,
        optimizer,
        EPOCHS,
        iters_per_epoch=ITERS,
        out_dir=str(out),
        extensions=_mnist_extensions(lib, model, optimizer, **snapshot),
    )
    return manager, model


def _train_manual(lib: types.ModuleType, manager: Any, model: Net, stop_at: int | None) -> None:
    while not manager.stop_trigger and (stop_at is None or manager.iteration < stop_at):
        for x, t in _data():
            with manager.run_iteration():
                manager.optimizers["main"].zero_grad()
                loss = F.nll_loss(model(x), t)
                lib.reporting.report({"train/loss": loss.item()})
                loss.backward()
                manager.optimizers["main"].step()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(actual: dict[str, torch.Tensor], *references: dict[str, torch.Tensor]) -> None:
    for reference in references:
        assert actual.keys() == reference.keys()
        for key, value in reference.items():
            assert torch.equal(actual[key], value), key


def test_default_extension_names_match_ppe(tmp_path: Path) -> None:
    names = {}
    for lib_name, lib in LIBS.items():
        manager, _ = _manual(lib(), tmp_path / lib_name)
        names[lib_name] = sorted(manager.state_dict()["extensions"])
    assert names["ppe_core"] == names["ppe"]
    assert {"_WrappedExtension", "None_1", "None_2", "halve_lr", "custom"} <= set(names["ppe"])


def test_a_callable_s_own_name_attribute_is_not_its_extension_name() -> None:
    class Named:
        name = "mine"  # the callable's own attribute, not an extension name

        def __call__(self, manager: Any) -> None:
            pass

    names = []
    for lib in LIBS.values():
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        manager = lib().training.ExtensionsManager(model, optimizer, 1, iters_per_epoch=1)
        manager.extend(Named())
        names.append(sorted(manager.state_dict()["extensions"]))
    assert names[0] == names[1] == ["_WrappedExtension"]


def test_ppe_core_state_says_ppe_s_version_and_keeps_its_own(tmp_path: Path) -> None:
    manager, model = _manual(ppe_core, tmp_path)
    _train_manual(ppe_core, manager, model, ITERS)
    state = load_snapshot(str(tmp_path / f"snapshot_iter_{ITERS}"))
    assert state["ppe_version"] == _ppe().__version__ == "0.9.0"
    assert state["_ppe_core"]["version"] == ppe_core.__version__


@pytest.mark.parametrize(("saver", "loader"), DIRECTIONS, ids=["core-to-ppe", "ppe-to-core"])
def test_mnist_manual_manager_snapshot_resumes_in_the_other_library(
    saver: str, loader: str, tmp_path: Path
) -> None:
    references = []
    for lib_name, lib in LIBS.items():
        manager, model = _manual(lib(), tmp_path / f"ref_{lib_name}")
        _train_manual(lib(), manager, model, None)
        references.append(_weights(model))

    first, first_model = _manual(LIBS[saver](), tmp_path / "run")
    _train_manual(LIBS[saver](), first, first_model, ITERS)  # stops after one epoch
    # Any warning fails the test (filterwarnings=error): PPE's version warning included.
    resumed, model = _manual(LIBS[loader](), tmp_path / "run", autoload=True)
    _train_manual(LIBS[loader](), resumed, model, None)
    assert resumed.iteration == EPOCHS * ITERS
    assert resumed.get_extension("LogReport").log[0]["iteration"] == ITERS  # restored log
    _assert_same(_weights(model), *references)


# ------------------------------------------------------------------------- create_trainer


class _Model(Net):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"loss": F.nll_loss(super().forward(x), t)}


def _trainer_data() -> list[dict[str, torch.Tensor]]:
    return [{"x": x, "t": t} for x, t in _data()]


def _trainer(lib: types.ModuleType, out: Path, epochs: int, **snapshot: Any) -> Any:
    torch.manual_seed(0)
    model = lib.to(_Model(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    E = lib.training.extensions
    return lib.engine.create_trainer(
        model,
        optimizer,
        epochs,
        out_dir=str(out),
        extensions=[
            E.LogReport(),
            E.observe_lr(optimizer=optimizer),
            E.snapshot(**snapshot),
            lambda manager: None,
            lambda manager: None,
            E.LogReport(filename="log2"),
        ],
    )


@pytest.mark.parametrize(("saver", "loader"), DIRECTIONS, ids=["core-to-ppe", "ppe-to-core"])
def test_create_trainer_snapshot_resumes_in_the_other_library(
    saver: str, loader: str, tmp_path: Path
) -> None:
    references = []
    for lib_name, lib in LIBS.items():
        reference = _trainer(lib(), tmp_path / f"ref_{lib_name}", EPOCHS)
        reference.run(_trainer_data())
        references.append(_weights(reference.models["main"]))

    _trainer(LIBS[saver](), tmp_path / "run", 1).run(_trainer_data())
    resumed = _trainer(LIBS[loader](), tmp_path / "run", EPOCHS, autoload=True)
    resumed.run(_trainer_data())
    assert resumed.manager.iteration == EPOCHS * ITERS
    assert resumed.manager.get_extension("LogReport").log[0]["iteration"] == ITERS
    _assert_same(_weights(resumed.models["main"]), *references)


# ------------------------------------------------------------------------- Ignite


def _ignite_run(
    lib: types.ModuleType, out: Path, epochs: int, **snapshot: Any
) -> tuple[Any, torch.nn.Module]:
    with warnings.catch_warnings():
        # Importing ignite 0.5 scripts a function with the deprecated torch.jit.script (the
        # warning comes only from the first import, so it cannot be asserted in every test).
        warnings.simplefilter("ignore", DeprecationWarning)
        from ignite.engine import create_supervised_trainer

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)

    def step_loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        loss = F.nll_loss(y, t)
        lib.reporting.report({"train/loss": loss.item()})
        return loss

    engine = create_supervised_trainer(model, optimizer, step_loss)
    E = lib.training.extensions
    extensions: list[Callable[..., Any] | Any] = [
        E.LogReport(),
        E.observe_lr(optimizer=optimizer),
        lambda manager: None,
        lambda manager: None,
        E.LogReport(filename="log2"),
        E.snapshot(**snapshot),
    ]
    manager = lib.training.manager.IgniteExtensionsManager(
        engine, model, optimizer, EPOCHS, out_dir=str(out), extensions=extensions
    )
    engine.run(_data(), max_epochs=epochs)
    return manager, model


@pytest.mark.parametrize(("saver", "loader"), DIRECTIONS, ids=["core-to-ppe", "ppe-to-core"])
def test_ignite_snapshot_resumes_in_the_other_library(
    saver: str, loader: str, tmp_path: Path
) -> None:
    references = [
        _weights(_ignite_run(lib(), tmp_path / f"ref_{name}", EPOCHS)[1])
        for name, lib in LIBS.items()
    ]
    _ignite_run(LIBS[saver](), tmp_path / "run", 1)
    manager, model = _ignite_run(LIBS[loader](), tmp_path / "run", EPOCHS, autoload=True)
    assert manager.iteration == EPOCHS * ITERS
    assert manager.get_extension("LogReport").log[0]["iteration"] == ITERS  # restored log
    _assert_same(_weights(model), *references)
