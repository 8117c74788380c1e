"""Throughput: iterations and samples per second, FLOPs counted once, MFU where a peak is known."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._throughput import batch_size_of

import ppe_core as ppe
from ppe_core.errors import ConfigurationError

E = ppe.training.extensions


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(32, 3)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


def loader(samples: int = 70, batch: int = 16) -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(samples, 8, generator=g), torch.randint(0, 3, (samples,), generator=g)
    data = [{"x": x[i], "t": t[i]} for i in range(samples)]
    return torch.utils.data.DataLoader(data, batch_size=batch)  # type: ignore[arg-type]


def train(
    throughput: E.Throughput, epochs: int = 2, out: Path | None = None, **kwargs: Any
) -> tuple[Any, E.LogReport]:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    log = E.LogReport(filename=None)
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.01),
        epochs,
        extensions=[throughput, log],
        out_dir=str(out) if out else "result",
        **kwargs,
    )
    trainer.run(loader())
    return trainer, log


def test_rates_per_entry_count_every_sample_of_uneven_batches(tmp_path: Path) -> None:
    throughput = E.Throughput()
    _, log = train(throughput, out=tmp_path)
    assert throughput.samples == 2 * 70  # 4 batches of 16 and one of 6 per epoch
    for entry in log.log:
        iters, samples = entry["throughput/iters_per_sec"], entry["throughput/samples_per_sec"]
        assert iters > 0
        assert samples / iters == pytest.approx(70 / 5)  # samples per iteration, exactly
    assert not any(k.endswith(("mfu", "flops_per_sample")) for k in log.log[-1])


def test_flops_are_counted_once_on_the_first_step_and_equal_flop_counter_mode(
    tmp_path: Path,
) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    throughput = E.Throughput(flops=True)
    trainer, log = train(throughput, out=tmp_path)
    # The same step by hand on a copy: forward, backward and the optimizer step.
    model = copy.deepcopy(trainer.models["main"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    batch = next(iter(loader()))
    with FlopCounterMode(display=False) as counter:
        optimizer.zero_grad()
        model(**batch)["loss"].backward()
        optimizer.step()
    expected = counter.get_total_flops() / 16
    # Linear layers, forward (2*m*k*n each) plus the gradients of both weights and of the
    # hidden activations: a known number, not only "whatever the counter said".
    by_hand = (2 * 8 * 32 + 2 * 32 * 3) + (2 * 8 * 32 + 2 * 32 * 3) + 2 * 32 * 3
    assert expected == by_hand
    assert throughput.flops_per_sample == expected
    entry = log.log[-1]
    assert entry["throughput/flops_per_sample"] == expected
    assert entry["throughput/tflops_per_sec"] == pytest.approx(
        expected * entry["throughput/samples_per_sec"] / 1e12
    )
    assert "throughput/mfu" not in entry  # the CPU runtime knows no peak and does not guess


def test_mfu_is_achieved_over_the_given_peak(tmp_path: Path) -> None:
    _, log = train(E.Throughput(flops=True, peak_flops=1e9), out=tmp_path)
    entry = log.log[-1]
    assert entry["throughput/mfu"] == pytest.approx(entry["throughput/tflops_per_sec"] * 1e12 / 1e9)


def test_a_runtime_that_knows_its_peak_gets_mfu(tmp_path: Path) -> None:
    from ppe_cpu import CPURuntime

    class RatedCPU(CPURuntime):
        def peak_flops(self) -> float | None:
            return 2e9

    with ppe.testing.plugin_host() as host:
        host.runtimes.register("cpu", RatedCPU)
        _, log = train(E.Throughput(flops=True), out=tmp_path)
    entry = log.log[-1]
    assert entry["throughput/mfu"] == pytest.approx(entry["throughput/tflops_per_sec"] * 1e12 / 2e9)


def test_an_autoloaded_resume_measures_from_the_loaded_iteration(tmp_path: Path) -> None:
    # One epoch with a snapshot, then a run to 3 epochs that loads it after Throughput started.
    torch.manual_seed(0)
    for epochs in (1, 3):
        model = ppe.to(Net(), "cpu")
        log = E.LogReport(filename=None)
        throughput = E.Throughput()
        trainer = ppe.engine.create_trainer(
            model,
            torch.optim.AdamW(model.parameters(), lr=0.01),
            epochs,
            extensions=[throughput, log],
            out_dir=str(tmp_path),
        )
        trainer.extend(E.snapshot(autoload=True, filename="snap_{.iteration}"))
        trainer.run(loader())
    assert [entry["epoch"] for entry in log.log] == [1, 2, 3]  # epoch 1's from the snapshot
    for entry in log.log[1:]:
        ratio = entry["throughput/samples_per_sec"] / entry["throughput/iters_per_sec"]
        assert ratio == pytest.approx(70 / 5)  # counted from the loaded iteration, not from 0
    assert throughput.samples == 2 * 70


def test_a_loop_without_a_trainer_uses_the_batch_size_given() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    log = E.LogReport(filename=None, trigger=(2, "iteration"))
    manager = ppe.training.ExtensionsManager(
        model,
        optimizer,
        1,
        iters_per_epoch=6,
        extensions=[E.Throughput(trigger=(2, "iteration"), batch_size=32), log],
    )
    while not manager.stop_trigger:
        with manager.run_iteration(step_optimizers=["main"]):
            loss = model(torch.randn(32, 4)).pow(2).mean()
            loss.backward()
            ppe.reporting.report({"loss": loss})
    assert len(log.log) == 3
    for entry in log.log:
        assert entry["throughput/samples_per_sec"] == pytest.approx(
            32 * entry["throughput/iters_per_sec"]
        )


def test_a_batch_without_tensors_says_to_give_the_batch_size(tmp_path: Path) -> None:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(1, 1)

        def forward(self, x: list[float]) -> dict[str, torch.Tensor]:
            return {"loss": self.fc(torch.tensor([x])).sum()}

    net = ppe.to(Model(), "cpu")
    trainer = ppe.engine.create_trainer(
        net, torch.optim.SGD(net.parameters(), lr=0.1), 1, extensions=[E.Throughput()]
    )
    with pytest.raises(ConfigurationError, match=r"Throughput\(batch_size=<samples"):
        trainer.run([{"x": [1.0]}])


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (torch.zeros(5, 2), 5),
        ({"x": torch.zeros(4, 2), "t": torch.zeros(4)}, 4),
        ([torch.zeros(3), torch.zeros(3)], 3),
        ({"inputs": (torch.zeros(7, 1),), "t": torch.zeros(7)}, 7),
        ({"meta": "name", "x": torch.zeros(2)}, None),  # the first value is not a tensor
        ({"x": torch.tensor(1.0)}, None),  # a scalar has no batch dimension
    ],
)
def test_the_batch_size_is_the_first_tensors_first_dimension(batch: Any, size: int | None) -> None:
    getter = batch_size_of(batch)
    assert (getter(batch) if getter is not None else None) == size


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA L40S", "fp16", 362.05),
        ("NVIDIA L4", "fp32", 30.3),
        ("Tesla V100-PCIE-32GB", "fp16", 112.0),
        ("Tesla T4", "fp16", 65.0),
        ("Tesla T4", "bf16", None),  # no bf16 tensor cores: no guess
        ("NVIDIA A10G", "bf16", None),  # not A10, whose figures differ
        ("NVIDIA GeForce RTX 4090", "bf16", None),
    ],
)
def test_the_cuda_peak_table_matches_device_names_by_model(
    name: str, precision: str, tflops: float | None
) -> None:
    from ppe_cuda._peak import peak_flops_for

    peak = peak_flops_for(name, precision)
    assert (None if peak is None else peak / 1e12) == (
        None if tflops is None else pytest.approx(tflops)
    )


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(ConfigurationError, match="peak_flops must be a positive number"):
        E.Throughput(peak_flops=0)
    with pytest.raises(ConfigurationError, match="batch_size must be a positive number"):
        E.Throughput(batch_size=True)  # type: ignore[arg-type]
