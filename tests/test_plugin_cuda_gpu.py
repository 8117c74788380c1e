"""ppe_cuda on a real GPU: moves, autocast (bf16, fp16 with the grad scaler), non-blocking
copies, channels-last, compile, memory reporting, prefetching, the conformance kit.

Every test is marked ``gpu`` and skipped with a reason when CUDA is not available.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_cuda import CUDARuntime, CUDAUnavailableError, PrefetchLoader
from ppe_testing import RuntimeConformance
from torch.utils.data import DataLoader, TensorDataset

import ppe_core as ppe
from ppe_core.runtime import get_runtime

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(y.float(), t)}


class DictDataset(TensorDataset):
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x, t = super().__getitem__(index)
        return {"x": x, "t": t}


def make_loader(n: int = 256, pin_memory: bool = False) -> DataLoader[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    t = ((x[:, 0] + x[:, 1] * x[:, 2]) > 0).long()
    return DataLoader(DictDataset(x, t), batch_size=32, pin_memory=pin_memory)


def train(
    options: dict[str, Any], epochs: int = 4, loader: Any = None, **kwargs: Any
) -> tuple[torch.nn.Module, list[float], Any]:
    torch.manual_seed(0)
    model = ppe.to(Model(), "cuda", options=options)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    log = ppe.training.extensions.LogReport(trigger=(1, "epoch"), filename=None)
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        epochs,
        device="cuda",
        extensions=[log, *kwargs.pop("extensions", [])],
        runtime_options=options,
        **kwargs,
    )
    trainer.run(loader if loader is not None else make_loader())
    return model, [float(e["train/loss"]) for e in log.log], trainer


@pytest.fixture
def restore_backends() -> Any:
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32
    yield
    cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = saved


def test_moves_modules_and_nested_batches_to_the_gpu() -> None:
    model = ppe.to(torch.nn.Linear(2, 2), "cuda:0")
    assert model.weight.device.type == "cuda"
    runtime = get_runtime(model)
    assert isinstance(runtime, CUDARuntime)
    out = runtime.convert_batch({"x": torch.ones(2), "l": [torch.ones(1), (torch.ones(1),)]})
    assert out["x"].is_cuda and out["l"][0].is_cuda and out["l"][1][0].is_cuda


def test_a_missing_device_index_is_explained() -> None:
    with pytest.raises(CUDAUnavailableError, match="does not exist"):
        ppe.to(torch.nn.Linear(2, 2), f"cuda:{torch.cuda.device_count()}")


def test_bf16_autocast_trains_close_to_fp32() -> None:
    _, fp32, _ = train({})
    model, bf16, _ = train({"autocast": torch.bfloat16})
    runtime = get_runtime(model)
    assert isinstance(runtime, CUDARuntime) and runtime.grad_scaler is None
    assert runtime.autocast == {"device_type": "cuda", "dtype": torch.bfloat16}
    assert bf16 == pytest.approx(fp32, abs=0.02)
    assert bf16[-1] < 0.8 * bf16[0]


def test_fp16_autocast_with_the_runtime_scaler_trains_and_snapshots_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    options = {"autocast": True}
    model = ppe.to(Model(), "cuda", options=options)
    runtime = get_runtime(model)
    assert isinstance(runtime, CUDARuntime) and runtime.grad_scaler is not None
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    log = ppe.training.extensions.LogReport(trigger=(1, "epoch"), filename=None)
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        3,
        device="cuda",
        options={"grad_scaler": runtime.grad_scaler},  # the Logic scales with it
        extensions=[log, ppe.training.extensions.snapshot(filename="snap")],
        out_dir=str(tmp_path),
    )
    trainer.run(make_loader())
    losses = [float(e["train/loss"]) for e in log.log]
    assert losses[-1] < 0.8 * losses[0]
    scale = runtime.grad_scaler.get_scale()
    assert trainer.handler.state_dict()["grad_scaler"]["scale"] == scale
    saved = torch.load(tmp_path / "snap", weights_only=False)
    assert saved["_ppe_core"]["handler"]["grad_scaler"]["scale"] == scale


def test_non_blocking_copies_from_pinned_memory_train_like_blocking_ones() -> None:
    blocking, _, _ = train({}, epochs=1)
    async_, _, _ = train({"non_blocking": True}, epochs=1, loader=make_loader(pin_memory=True))
    for a, b in zip(blocking.parameters(), async_.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_prefetch_loader_yields_device_batches_and_trains_identically() -> None:
    loader = make_loader(pin_memory=True)
    prefetched = PrefetchLoader(loader, "cuda")
    batches = list(prefetched)
    assert len(batches) == len(loader) == len(prefetched)
    for got, want in zip(batches, loader, strict=True):
        assert got["x"].is_cuda
        torch.testing.assert_close(got["x"].cpu(), want["x"])
    plain, _, _ = train({}, epochs=2)
    fast, _, _ = train({}, epochs=2, loader=PrefetchLoader(make_loader(pin_memory=True)))
    for a, b in zip(plain.parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_channels_last_on_the_gpu() -> None:
    conv = ppe.to(torch.nn.Conv2d(3, 4, 3), "cuda", options={"channels_last": True})
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    runtime = get_runtime(conv)
    assert runtime is not None
    x = runtime.convert_batch([torch.ones(2, 3, 8, 8)])[0]
    assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last)


def test_cudnn_and_tf32_switches(restore_backends: None) -> None:
    CUDARuntime("cuda", {"cudnn_benchmark": True, "tf32": True})
    assert torch.backends.cudnn.benchmark and torch.backends.cuda.matmul.allow_tf32


def test_memory_is_reported_without_sync_per_step() -> None:
    log = ppe.training.extensions.LogReport(trigger=(1, "iteration"), filename=None)
    train({"report_memory": 4}, epochs=1, extensions=[log])
    entries = log.log
    reported = [i for i, e in enumerate(entries) if "cuda/max_memory_allocated" in e]
    assert reported == [0, 4]  # 8 steps: the epoch's first and every 4th
    entry = entries[0]
    assert entry["cuda/max_memory_allocated"] >= entry["cuda/memory_allocated"] > 0
    assert entry["cuda/max_memory_reserved"] >= entry["cuda/max_memory_allocated"]


@pytest.mark.slow
def test_compile_on_the_gpu_keeps_state_dict_keys(tmp_path: Path) -> None:
    model, losses, _ = train({"compile": True}, epochs=2)
    assert sorted(model.state_dict()) == sorted(Model().state_dict())
    assert losses[-1] < losses[0]
    plain = Model()
    plain.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})


def test_rng_state_round_trips() -> None:
    runtime = CUDARuntime("cuda")
    state = runtime.rng_state()
    first = torch.rand(3, device="cuda")
    runtime.set_rng_state(state)
    torch.testing.assert_close(torch.rand(3, device="cuda"), first)


class TestCUDARuntimeConformance(RuntimeConformance):
    device = "cuda"
    runtime_class = CUDARuntime


class TestCUDARuntimeNonBlockingConformance(RuntimeConformance):
    device = "cuda:0"
    runtime_class = CUDARuntime
    options = {"non_blocking": True, "channels_last": True}  # noqa: RUF012
    skip_checks = frozenset({"snapshot_resume"})
