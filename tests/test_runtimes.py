"""Runtimes: batch conversion, tagging, the generic runtime and the first-party plugins."""

from __future__ import annotations

import collections
import subprocess
import sys
from typing import Any, NamedTuple

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import ConfigurationError
from ppe_core.runtime import BaseRuntime, PyTorchRuntime, get_runtime, iter_runtime_modules

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Pair(NamedTuple):
    a: torch.Tensor
    b: list[torch.Tensor]


def test_convert_batch_moves_nested_structures_and_keeps_types() -> None:
    runtime = PyTorchRuntime("meta")
    batch = {
        "x": torch.ones(2),
        "pair": Pair(torch.zeros(1), [torch.ones(3), "label"]),
        "ordered": collections.OrderedDict(t=torch.ones(1)),
        "tuple": (torch.ones(1), 3),
        "text": "unchanged",
    }
    out = runtime.convert_batch(batch)
    assert out["x"].device.type == "meta"
    assert isinstance(out["pair"], Pair)
    assert out["pair"].a.device.type == "meta" and out["pair"].b[0].device.type == "meta"
    assert out["pair"].b[1] == "label"
    assert isinstance(out["ordered"], collections.OrderedDict)
    assert isinstance(out["tuple"], tuple) and out["tuple"][1] == 3
    assert out["text"] == "unchanged"
    assert batch["x"].device.type == "cpu"  # the input is not modified


def test_base_runtime_rejects_unknown_options_and_lists_accepted() -> None:
    class Opt(PyTorchRuntime):
        accepted_options = frozenset({"fast"})

    Opt("cpu", {"fast": True})
    with pytest.raises(ConfigurationError, match=r"'slow'.*accepted options: fast"):
        Opt("cpu", {"slow": True})


def test_base_runtime_requires_data_movement_methods() -> None:
    runtime = BaseRuntime("cpu")
    with pytest.raises(NotImplementedError, match="move_module"):
        runtime.move_module(torch.nn.Linear(1, 1))
    with pytest.raises(NotImplementedError, match="move_tensor"):
        runtime.convert_batch({"x": torch.ones(1)})
    assert runtime.convert_batch({"n": 3}) == {"n": 3}  # nothing to move: no call
    with runtime.trace("step", None):
        pass


def test_undeclared_options_reach_the_runtime_as_in_ppe() -> None:
    class Loose(PyTorchRuntime):  # declares no accepted_options of its own
        pass

    assert Loose("cpu", {"anything": 1}).options == {"anything": 1}
    assert BaseRuntime("cpu", {"x": 2}).options == {"x": 2}
    with pytest.raises(ConfigurationError, match="accepted options: autocast, grad_scaler"):
        PyTorchRuntime("cpu", {"pin_memory": True})


def test_to_moves_tensors_without_tagging() -> None:
    t = ppe.to(torch.ones(2), "meta")
    assert t.device.type == "meta"
    with pytest.raises(TypeError, match=r"torch\.nn\.Module or torch\.Tensor"):
        ppe.to([torch.ones(1)], "cpu")  # type: ignore[call-overload]


def test_to_with_explicit_runtime_class_and_options() -> None:
    class Mine(PyTorchRuntime):
        accepted_options = frozenset({"tag"})

    model = ppe.to(torch.nn.Linear(2, 2), "cpu", runtime_class=Mine, options={"tag": 1})
    runtime = get_runtime(model)
    assert isinstance(runtime, Mine) and runtime.options == {"tag": 1}


def test_iter_runtime_modules_yields_top_most_tag_per_branch() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert list(iter_runtime_modules(model)) == []
    ppe.to(model, "cpu")
    (top,) = list(iter_runtime_modules(model))
    assert top[0] == "" and top[1] is model
    ppe.to(model[1], "meta")  # a branch moved elsewhere gets its own runtime
    found = [(name, type(rt).__name__) for name, _, rt in iter_runtime_modules(model)]
    assert found == [("", "CPURuntime"), ("1", "PyTorchRuntime")]


def test_cpu_runtime_is_registered_and_checks_its_device() -> None:
    from ppe_cpu import CPURuntime

    assert ppe.runtime.runtime_registry.get_runtime_class_for_device_spec("cpu") is CPURuntime
    with pytest.raises(ValueError, match="'cpu' devices"):
        CPURuntime("meta")
    model = ppe.to(torch.nn.Linear(2, 2), "cpu")
    assert isinstance(get_runtime(model), CPURuntime)


def test_cuda_plugin_registers_without_touching_the_driver() -> None:
    code = (
        "import torch, ppe_core as ppe\n"
        "cls = ppe.runtime.runtime_registry.get_runtime_class_for_device_spec('cuda:0')\n"
        "print(cls.__name__, torch.cuda.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["CUDARuntime", "False"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_runtime_without_cuda_explains_why_and_what_to_do() -> None:
    from ppe_cuda import CUDAUnavailableError

    with pytest.raises(CUDAUnavailableError, match=r"device='cpu'") as info:
        ppe.to(torch.nn.Linear(2, 2), "cuda")
    assert "cuda" in str(info.value)


@pytest.mark.gpu
@cuda
def test_cuda_runtime_moves_modules_and_batches() -> None:
    model = ppe.to(torch.nn.Linear(2, 2), "cuda:0")
    assert model.weight.device.type == "cuda"
    runtime: Any = get_runtime(model)
    batch = runtime.convert_batch({"x": torch.ones(2)})
    assert batch["x"].device.type == "cuda"


@pytest.mark.gpu
@cuda
def test_cuda_runtime_rejects_a_missing_device_index() -> None:
    from ppe_cuda import CUDAUnavailableError

    with pytest.raises(CUDAUnavailableError, match="does not exist"):
        ppe.to(torch.nn.Linear(2, 2), f"cuda:{torch.cuda.device_count()}")


def test_to_auto_uses_the_default_device_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = ppe.to(torch.nn.Linear(2, 2), "auto")
    assert type(get_runtime(model)).__name__ == "CPURuntime"
