"""``ppe.nn`` helpers (``ensure``/``Ensure``, ``ExtendedSequential``, the lazy layers) and
``ppe.dataloaders``, each run side by side with PPE 0.9 on the same inputs and seeds."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import pytorch_pfn_extras as ppe_ref
import torch

import ppe_core as ppe
from ppe_core.errors import (
    ConfigurationError,
    LazyStateError,
    ResetParametersWarning,
    TensorCheckError,
)


def _outcome(check: Callable[[], object]) -> str:
    """``"ok"`` or the builtin class a PPE user would catch (``ValueError``...)."""
    try:
        check()
    except (ValueError, RuntimeError, TypeError) as exc:
        return next(b for b in (ValueError, RuntimeError, TypeError) if isinstance(exc, b)).__name__
    return "ok"


# ensure / Ensure ---------------------------------------------------------------------------
ENSURE_CASES: list[tuple[tuple[int, ...], torch.dtype, dict[str, Any]]] = [
    ((2, 3), torch.float32, {"shape": (2, 3)}),
    ((3, 2), torch.float32, {"shape": (2, 3)}),
    ((2, 3, 1), torch.float32, {"shape": (2, 3)}),
    ((5, 3), torch.float32, {"shape": (None, 3)}),
    ((5, 4), torch.float32, {"shape": (None, 3)}),
    ((3,), torch.float32, {"shape": (None, 3)}),
    ((5, 1), torch.float32, {"shape": (None, 3)}),
    ((4, 3), torch.float32, {"shape": (1, 3), "broadcastable": True}),
    ((4, 3), torch.float32, {"shape": (1, 3)}),
    ((3, 4), torch.float32, {"shape": (2, 3, 4), "broadcastable": True}),
    ((2, 4), torch.float32, {"shape": (2, 3), "broadcastable": True}),
    ((2,), torch.float32, {"dtype": torch.float32}),
    ((2,), torch.float64, {"dtype": torch.float32}),
    ((2,), torch.int32, {"dtype": torch.float32, "can_cast": True}),
    ((2,), torch.float64, {"dtype": torch.int32, "can_cast": True}),
    ((2, 3), torch.int64, {"shape": (2, 3), "dtype": torch.int64}),
    ((2, 3), torch.int64, {"shape": (2, 3), "dtype": torch.int8}),
    ((2, 4), torch.int64, {"shape": (2, 3), "dtype": torch.int64}),
    ((2,), torch.float32, {}),
    ((), torch.float32, {"shape": ()}),
    ((3,), torch.float32, {"shape": ()}),
    ((3,), torch.float32, {"shape": (), "broadcastable": True}),
    ((2, 3), torch.float32, {"shape": [2, 3]}),
]


@pytest.mark.parametrize(("size", "dtype", "kwargs"), ENSURE_CASES)
def test_ensure_accepts_and_rejects_what_ppe_does(
    size: tuple[int, ...], dtype: torch.dtype, kwargs: dict[str, Any]
) -> None:
    tensor = torch.zeros(size, dtype=dtype)
    expected = _outcome(lambda: ppe_ref.nn.ensure(tensor, **kwargs))
    assert _outcome(lambda: ppe.nn.ensure(tensor, **kwargs)) == expected
    assert _outcome(lambda: ppe.nn.Ensure(**kwargs)(tensor)) == expected
    if expected == "ok":
        assert ppe.nn.Ensure(**kwargs)(tensor) is tensor
        assert ppe.nn.ensure(tensor, **kwargs) is None


def test_ensure_errors_name_both_sides_and_are_project_errors() -> None:
    with pytest.raises(TensorCheckError, match=r"shape \[2, 3\], got \[3, 2\]"):
        ppe.nn.ensure(torch.zeros(3, 2), (2, 3))
    with pytest.raises(TensorCheckError, match=r"torch\.float32, got torch\.float64"):
        ppe.nn.ensure(torch.zeros(2, dtype=torch.float64), dtype=torch.float32)
    with pytest.raises(ConfigurationError, match="shape=, dtype= or both"):
        ppe.nn.Ensure()
    with pytest.raises(TypeError):
        ppe.nn.Ensure((2, 3))  # type: ignore[misc]  # keyword-only, as in PPE


def test_ensure_inside_a_model_keeps_outputs_and_state_dict_keys() -> None:
    def build(lib: ModuleType) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            lib.nn.Ensure(shape=(None, 4), dtype=torch.float32),
            torch.nn.Linear(4, 2),
            lib.nn.Ensure(shape=(None, 2)),
        )

    ours, theirs = build(ppe), build(ppe_ref)
    x = torch.randn(3, 4)
    assert torch.equal(ours(x), theirs(x))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with pytest.raises(ValueError):
        ours(torch.randn(3, 5))


def test_ensure_compiles_with_torchscript_like_ppe() -> None:
    # PPE wrote Ensure so that models holding it can be scripted; scripts that do keep working.
    x = torch.ones(2, 3)
    for lib in (ppe_ref, ppe):
        with pytest.warns(DeprecationWarning, match="torch.jit.script"):
            scripted = torch.jit.script(lib.nn.Ensure(shape=(None, 3), dtype=torch.float32))
        assert torch.equal(scripted(x), x)
        with pytest.raises(torch.jit.Error):
            scripted(torch.ones(2, 4))
        with pytest.raises(torch.jit.Error):
            scripted(x.double())


# ExtendedSequential ----------------------------------------------------------------------
def _block(lib: ModuleType) -> torch.nn.Module:
    return lib.nn.ExtendedSequential(
        torch.nn.Linear(3, 4),
        torch.nn.ReLU(),
        torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)]),
        torch.nn.ModuleDict({"out": torch.nn.Conv1d(4, 2, 1)}),
    )


@pytest.mark.parametrize("mode", ["init", "copy", "share"])
def test_repeat_gives_ppe_weights_and_sharing(mode: str) -> None:
    repeated = {}
    for name, lib in (("ours", ppe), ("ppe", ppe_ref)):
        torch.manual_seed(0)
        block = _block(lib)
        repeated[name] = (block, block.repeat(3, mode=mode))
    (_, ours), (ref_block, theirs) = repeated["ours"], repeated["ppe"]
    assert type(ours) is ppe.nn.ExtendedSequential
    assert len(ours) == len(theirs) == 3
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert list(ours_state) == list(theirs_state)
    for key, value in theirs_state.items():
        assert torch.equal(ours_state[key], value), key
    # init re-draws each copy, copy keeps the original values, share shares the tensors.
    first = {k: v for k, v in ours_state.items() if k.startswith("0.0.")}
    second = {k.replace("1.", "0.", 1): v for k, v in ours_state.items() if k.startswith("1.0.")}
    assert torch.equal(first["0.0.weight"], second["0.0.weight"]) is (mode != "init")
    shared = ours[0][0].weight is ours[1][0].weight
    assert shared is (mode == "share") is (theirs[0][0].weight is theirs[1][0].weight)
    assert torch.equal(ours[0][0].weight, ref_block[0].weight) is (mode != "init")


def test_repeat_bad_mode_and_empty_repeat_like_ppe() -> None:
    ours, theirs = _block(ppe), _block(ppe_ref)
    with pytest.raises(ValueError):
        theirs.repeat(2, mode="deep")
    with pytest.raises(ConfigurationError, match="'init', 'copy', 'share'"):
        ours.repeat(2, mode="deep")
    for n in (0, -1):
        assert len(ours.repeat(n, mode="deep")) == len(theirs.repeat(n, mode="deep")) == 0


class _NoReset(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_repeat_init_warns_about_a_module_it_cannot_reset_like_ppe() -> None:
    with pytest.warns(UserWarning, match="Cannot reset"):
        ppe_ref.nn.ExtendedSequential(_NoReset()).repeat(2)
    with pytest.warns(ResetParametersWarning, match="_NoReset.*reset_parameters") as record:
        repeated = ppe.nn.ExtendedSequential(_NoReset()).repeat(2)
    assert len(record) == 2 and issubclass(record[0].category, UserWarning)
    assert torch.equal(repeated[0][0].scale, repeated[1][0].scale)
    ppe.nn.ExtendedSequential(torch.nn.ReLU()).repeat(2)  # nothing to reset: no warning


# Lazy layers -----------------------------------------------------------------------------
LAZY_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], tuple[int, ...]]] = [
    ("LazyLinear", (None, 3), {}, (5, 4)),
    ("LazyLinear", (7, 3), {"bias": False}, (5, 4)),
    ("LazyConv1d", (None, 4, 3), {}, (2, 3, 9)),
    ("LazyConv2d", (None, 4, 3), {"padding": 1}, (2, 3, 6, 6)),
    ("LazyConv2d", (None, 4, 3), {"groups": 2}, (2, 6, 5, 5)),
    ("LazyConv3d", (None, 2, 2), {}, (2, 3, 4, 4, 4)),
    ("LazyBatchNorm1d", (None,), {}, (6, 3)),
    ("LazyBatchNorm1d", (3,), {}, (6, 3)),
    ("LazyBatchNorm1d", (None,), {"track_running_stats": False}, (6, 3)),
    # PPE sizes batch norm from the last dimension: equal to the channels here.
    ("LazyBatchNorm2d", (None,), {}, (4, 5, 3, 5)),
    ("LazyBatchNorm3d", (None,), {}, (4, 2, 3, 3, 2)),
]
LAZY_IDS = [f"{name}-{i}" for i, (name, *_) in enumerate(LAZY_CASES)]


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in state.items()}


@pytest.mark.parametrize(("name", "args", "kwargs", "size"), LAZY_CASES, ids=LAZY_IDS)
def test_lazy_layer_trains_bit_identically_to_ppe(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], size: tuple[int, ...]
) -> None:
    layers, losses = {}, {}
    for tag, lib in (("ours", ppe), ("ppe", ppe_ref)):
        torch.manual_seed(0)
        layer = getattr(lib.nn, name)(*args, **kwargs)
        before = _shapes(layer.state_dict())
        inputs = [torch.randn(size) for _ in range(3)]
        layer(inputs[0])  # the dummy forward that materializes the layer
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        history = []
        for x in inputs:
            optimizer.zero_grad()
            loss = layer(x).square().mean()
            loss.backward()
            optimizer.step()
            history.append(loss.item())
        layers[tag], losses[tag] = (layer, before), history
    (ours, ours_before), (theirs, theirs_before) = layers["ours"], layers["ppe"]
    assert ours_before == theirs_before  # same keys and shapes before the first forward
    assert losses["ours"] == losses["ppe"]
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert list(ours_state) == list(theirs_state)
    for key, value in theirs_state.items():
        assert torch.equal(ours_state[key], value), key
    assert isinstance(ours, getattr(torch.nn, name[4:]))


def _used(lib: ModuleType, name: str, args: tuple[Any, ...], size: tuple[int, ...]) -> Any:
    torch.manual_seed(0)
    layer = getattr(lib.nn, name)(*args)
    layer(torch.randn(size))
    return layer


@pytest.mark.parametrize(
    ("name", "args", "size"),
    [
        ("LazyLinear", (None, 3), (5, 4)),
        ("LazyConv2d", (None, 4, 3), (2, 3, 6, 6)),
        ("LazyBatchNorm1d", (None,), (6, 3)),
    ],
)
def test_lazy_states_load_across_libraries(
    name: str, args: tuple[Any, ...], size: tuple[int, ...]
) -> None:
    x = torch.randn(size)
    for source, target in ((ppe_ref, ppe), (ppe, ppe_ref)):
        # A state saved before the first forward loads into an unused layer, which stays lazy.
        unused = getattr(target.nn, name)(*args)
        unused.load_state_dict(getattr(source.nn, name)(*args).state_dict())
        assert list(unused.state_dict()) == list(getattr(source.nn, name)(*args).state_dict())
        # A trained state (through torch.save, as snapshots do) materializes an unused layer.
        buffer = io.BytesIO()
        trained = _used(source, name, args, size)
        torch.save(trained.state_dict(), buffer)
        buffer.seek(0)
        fresh = getattr(target.nn, name)(*args)
        fresh.load_state_dict(torch.load(buffer))
        trained.eval(), fresh.eval()
        assert torch.equal(fresh(x), trained(x))


def test_lazy_state_of_an_unused_layer_into_a_used_one_raises_like_ppe() -> None:
    for lib, error in ((ppe_ref, RuntimeError), (ppe, LazyStateError)):
        for name, args, size in (
            ("LazyLinear", (None, 3), (2, 4)),
            ("LazyBatchNorm1d", (None,), (4, 3)),
        ):
            used = _used(lib, name, args, size)
            for strict in (True, False):
                with pytest.raises(error):
                    used.load_state_dict(getattr(lib.nn, name)(*args).state_dict(), strict=strict)
    with pytest.raises(LazyStateError, match=r"saved before the first forward.*new module"):
        _used(ppe, "LazyLinear", (None, 3), (2, 4)).load_state_dict(
            ppe.nn.LazyLinear(None, 3).state_dict()
        )


def test_lazy_batch_norm_without_affine_raises_like_ppe() -> None:
    with pytest.raises(ValueError):
        ppe_ref.nn.LazyBatchNorm2d(None, affine=False)
    with pytest.raises(ConfigurationError, match=r"affine=True.*torch\.nn\.BatchNorm2d"):
        ppe.nn.LazyBatchNorm2d(None, affine=False)


def test_lazy_layers_where_ppe_fails() -> None:
    # Nested unused layers: PPE's state_dict raises KeyError('weight'); ppe-core omits the key.
    with pytest.raises(KeyError):
        torch.nn.Sequential(ppe_ref.nn.LazyLinear(None, 3)).state_dict()
    model = torch.nn.Sequential(ppe.nn.LazyLinear(None, 3), ppe.nn.LazyBatchNorm1d(None))
    assert list(model.state_dict()) == [
        "0.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]
    clone = copy.deepcopy(model)
    model(torch.randn(4, 5))
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone[0].weight, model[0].weight)
    # Batch norm sizes itself from the channel dimension (PPE: the last one, which fails here).
    with pytest.raises(RuntimeError):
        ppe_ref.nn.LazyBatchNorm2d(None)(torch.randn(2, 3, 4, 5))
    norm = ppe.nn.LazyBatchNorm2d(None)
    assert norm(torch.randn(2, 3, 4, 5)).shape == (2, 3, 4, 5)
    assert norm.num_features == 3 and tuple(norm.running_mean.shape) == (3,)
    # An optimizer built before the first forward trains the materialized weight (PPE replaces
    # the parameter object, so its optimizer never sees the trained one).
    layer = ppe.nn.LazyLinear(None, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(torch.ones(1, 3)).sum().backward()
    before = layer.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(layer.weight, before)


def test_lazy_layer_follows_module_dtype_before_the_first_forward() -> None:
    layer = ppe.nn.LazyConv1d(None, 2, 1).double()
    assert layer(torch.ones(1, 3, 4, dtype=torch.float64)).dtype == torch.float64
    assert layer.weight.dtype == torch.float64 and layer.in_channels == 3


# ppe.dataloaders ---------------------------------------------------------------------------
def test_dataloaders_names_are_ppe_s() -> None:
    assert ppe.dataloaders.DataLoader is ppe_ref.dataloaders.DataLoader
    assert ppe.dataloaders.dataloader.DataLoader is torch.utils.data.DataLoader
    from ppe_core.dataloaders.utils import CollateAsDict

    assert CollateAsDict is ppe.dataloaders.utils.CollateAsDict


def _pairs(n: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 4, generator=generator), torch.randint(0, 3, (n,), generator=generator)
    )


@pytest.mark.parametrize(
    "names", [("x", "t"), ("x",), ("x", "t", "extra")], ids=["equal", "fewer", "more"]
)
def test_collate_as_dict_batches_like_ppe(names: tuple[str, ...]) -> None:
    batches = {}
    for tag, lib in (("ours", ppe), ("ppe", ppe_ref)):
        loader = lib.dataloaders.DataLoader(
            _pairs(10), batch_size=4, collate_fn=lib.dataloaders.utils.CollateAsDict(names)
        )
        batches[tag] = list(loader)
    assert len(batches["ours"]) == len(batches["ppe"]) == 3
    for ours, theirs in zip(batches["ours"], batches["ppe"], strict=True):
        assert list(ours) == list(theirs)
        assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_collate_as_dict_with_a_custom_collate_fn_like_ppe() -> None:
    def swap(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        x, t = torch.utils.data.default_collate(samples)
        return [t, x * 2]

    samples = [_pairs(3)[i] for i in range(3)]
    ours = ppe.dataloaders.utils.CollateAsDict(["t", "x"], collate_fn=swap)(samples)
    theirs = ppe_ref.dataloaders.utils.CollateAsDict(["t", "x"], collate_fn=swap)(samples)
    assert list(ours) == list(theirs) == ["t", "x"]
    assert torch.equal(ours["x"], theirs["x"]) and torch.equal(ours["t"], theirs["t"])
    assert ours.keys() == theirs.keys()


# A PPE script using these helpers, with only the import changed ----------------------------
class _Net(torch.nn.Module):
    def __init__(self, lib: ModuleType) -> None:
        super().__init__()
        self.lib = lib
        self.body = lib.nn.ExtendedSequential(
            lib.nn.LazyLinear(None, 8), lib.nn.LazyBatchNorm1d(None), torch.nn.ReLU()
        ).repeat(2)
        self.head = lib.nn.LazyLinear(None, 3)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        self.lib.nn.ensure(x, shape=(None, 4), dtype=torch.float32)
        logits = self.head(self.body(x))
        self.lib.nn.ensure(logits, shape=(x.shape[0], 3))
        return {"loss": torch.nn.functional.cross_entropy(logits, t)}


def _train_script(lib: ModuleType) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    loader = lib.dataloaders.DataLoader(
        _pairs(24),
        batch_size=6,
        shuffle=True,
        collate_fn=lib.dataloaders.utils.CollateAsDict(["x", "t"]),
    )
    model = _Net(lib)
    model(**next(iter(loader)))  # materialize the lazy layers before building the optimizer
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = lib.training.ExtensionsManager(model, optimizer, 2, iters_per_epoch=len(loader))
    losses = []
    while not manager.stop_trigger:
        for batch in loader:
            with manager.run_iteration():
                optimizer.zero_grad()
                loss = model(**batch)["loss"]
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    return losses, model.state_dict()


def test_script_with_ensure_collate_and_lazy_layers_matches_ppe() -> None:
    ours_losses, ours_state = _train_script(ppe)
    theirs_losses, theirs_state = _train_script(ppe_ref)
    assert len(ours_losses) == 8
    assert ours_losses == theirs_losses
    assert list(ours_state) == list(theirs_state)
    for key, value in theirs_state.items():
        assert torch.equal(ours_state[key], value), key
