"""ppe_cuda without a GPU: importing, listing, option parsing and validation, the errors,
environment lines, the memory reporter and the prefetcher's checks (monkeypatched
availability where the path needs a "visible" device). Real-GPU tests:
tests/test_plugin_cuda_gpu.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch
from ppe_cuda import CUDA_OPTIONS, CUDARuntime, CUDAUnavailableError, MemoryReporter, PrefetchLoader

import ppe_core as ppe
from ppe_core.errors import ConfigurationError, DeviceUnavailableError, RuntimeOptionError
from ppe_core.runtime import BaseRuntime, RuntimeOptionTypeError

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two "visible" CUDA devices as far as availability checks go (nothing is allocated);
    the global cuDNN/TF32 switches are restored afterwards."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32
    yield
    cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = saved


# Without CUDA: import, listing, errors ---------------------------------------------------------
def test_import_listing_and_cli_never_initialise_cuda() -> None:
    code = (
        "import torch, ppe_core as ppe, ppe_cuda\n"
        "from ppe_core.__main__ import main\n"
        "cls = ppe.runtime.runtime_registry.get_runtime_class_for_device_spec('cuda')\n"
        "main(['plugins'])\n"
        "print(cls.__name__, torch.cuda.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "ppe_cuda" in out.stdout
    assert out.stdout.split()[-2:] == ["CUDARuntime", "False"]


@no_cuda
def test_using_the_runtime_without_cuda_says_why_and_what_to_do() -> None:
    with pytest.raises(CUDAUnavailableError) as info:
        ppe.to(torch.nn.Linear(2, 2), "cuda", options={"autocast": torch.bfloat16})
    message = str(info.value)
    assert "device='cpu'" in message and "'cuda'" in message
    if torch.version.cuda is None:
        assert "install a CUDA build of PyTorch" in message
    assert isinstance(info.value, DeviceUnavailableError) and isinstance(info.value, RuntimeError)
    with pytest.raises(CUDAUnavailableError):
        ppe.engine.create_trainer(
            torch.nn.Linear(2, 2),
            torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
            1,
            device="cuda",
        )


def test_without_a_driver_the_message_names_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(CUDAUnavailableError, match="nvidia-smi") as info:
        CUDARuntime("cuda:0")
    assert "run on a machine with a GPU" in str(info.value)


def test_a_missing_device_index_lists_the_visible_ones(fake_cuda: None) -> None:
    with pytest.raises(CUDAUnavailableError, match=r"2 CUDA device\(s\).*0\.\.1"):
        CUDARuntime("cuda:2")


def test_cuda_runtime_refuses_other_device_types() -> None:
    with pytest.raises(ConfigurationError, match="'cuda' devices"):
        CUDARuntime("cpu")


# Validation (runs before the CUDA check, so it works on any machine) ---------------------------
def test_unknown_cuda_option_lists_every_accepted_one() -> None:
    with pytest.raises(RuntimeOptionError, match="'num_threads'") as info:
        CUDARuntime("cuda", {"num_threads": 4})
    for spec in CUDA_OPTIONS:
        assert f"{spec.name} (" in str(info.value)


@pytest.mark.parametrize(
    ("options", "wanted"),
    [
        ({"non_blocking": 1}, "'non_blocking' must be bool, got int"),
        ({"tf32": "high"}, "'tf32' must be bool"),
        ({"cudnn_benchmark": 0}, "'cudnn_benchmark' must be bool"),
        ({"report_memory": 2.5}, "'report_memory' must be bool or int"),
        ({"compile": "max-autotune"}, "'compile' must be bool or dict"),
        ({"autocast": "fp16"}, "'autocast' must be bool, torch.dtype or dict"),
        ({"grad_scaler": 1.0}, "'grad_scaler' must be torch.amp.GradScaler"),
        ({"channels_last": "no"}, "'channels_last' must be bool"),
    ],
)
def test_wrong_types_are_type_errors_naming_the_type(options: dict[str, Any], wanted: str) -> None:
    with pytest.raises(RuntimeOptionTypeError, match=wanted):
        CUDARuntime("cuda", options)


def test_bad_values_are_rejected_before_the_device_check() -> None:
    with pytest.raises(RuntimeOptionError, match="'report_memory' must be >= 1, got 0"):
        CUDARuntime("cuda", {"report_memory": 0})
    with pytest.raises(RuntimeOptionError, match=r"float16, got torch\.float64"):
        CUDARuntime("cuda", {"autocast": torch.float64})


def test_spec_and_accepted_options_agree_and_share_names_with_ppe_cpu() -> None:
    from ppe_cpu import CPU_OPTIONS

    assert CUDARuntime.accepted_options == CUDA_OPTIONS.names
    shared = {"autocast", "grad_scaler", "channels_last", "compile"}
    assert shared <= CUDA_OPTIONS.names and shared <= CPU_OPTIONS.names
    for name in shared:  # the same meaning: the same accepted types
        assert CUDA_OPTIONS.specs[name].types == CPU_OPTIONS.specs[name].types


# Option parsing with a "visible" device ------------------------------------------------------
def test_fp16_autocast_creates_a_grad_scaler_in_the_options(fake_cuda: None) -> None:
    runtime = CUDARuntime("cuda", {"autocast": True})
    assert runtime.autocast == {"device_type": "cuda", "dtype": torch.float16}
    scaler = runtime.options["grad_scaler"]
    assert isinstance(scaler, torch.amp.GradScaler) and scaler is runtime.grad_scaler
    assert scaler._device == "cuda"
    assert runtime.options["autocast"] == runtime.autocast  # the core's dict form


def test_the_created_scaler_lands_in_the_handler_state(fake_cuda: None) -> None:
    runtime = CUDARuntime("cuda", {"autocast": torch.float16})
    handler = ppe.handler.Handler(ppe.handler.Logic(), runtime, {})
    assert set(handler.state_dict()) == {"grad_scaler"}


def test_bf16_autocast_or_a_given_scaler_creates_none(fake_cuda: None) -> None:
    assert CUDARuntime("cuda", {"autocast": torch.bfloat16}).grad_scaler is None
    assert "grad_scaler" not in CUDARuntime("cuda", {"autocast": torch.bfloat16}).options
    mine = torch.amp.GradScaler("cuda", init_scale=8.0)
    runtime = CUDARuntime("cuda", {"autocast": True, "grad_scaler": mine})
    assert runtime.grad_scaler is mine
    assert CUDARuntime("cuda", {"autocast": {"enabled": False}}).autocast is None
    assert CUDARuntime("cuda").grad_scaler is None


def test_cudnn_benchmark_and_tf32_switches_are_set_on_creation(fake_cuda: None) -> None:
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    CUDARuntime("cuda")  # absent: left alone
    assert not torch.backends.cudnn.benchmark and not torch.backends.cuda.matmul.allow_tf32
    CUDARuntime("cuda", {"cudnn_benchmark": True, "tf32": True})
    assert torch.backends.cudnn.benchmark
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    CUDARuntime("cuda", {"tf32": False})
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


class Pair(NamedTuple):
    image: torch.Tensor
    extra: list[torch.Tensor]


def test_batch_options_bind_a_mover_and_keep_nested_types(fake_cuda: None) -> None:
    default = CUDARuntime("cuda")
    assert "convert_batch" not in vars(default)  # the inline conversion of PyTorchRuntime
    runtime = CUDARuntime("cuda:1", {"non_blocking": True, "channels_last": True})
    mover: Any = runtime.move_tensor
    assert (mover.device, mover.non_blocking, mover.channels_last) == (
        torch.device("cuda:1"),
        True,
        True,
    )
    mover.device = torch.device("cpu")  # the same conversion, to a device this machine has
    out = runtime.convert_batch({"p": Pair(torch.ones(2, 3, 4, 4), [torch.ones(2)])})
    assert isinstance(out["p"], Pair)
    assert out["p"].image.is_contiguous(memory_format=torch.channels_last)
    assert out["p"].extra[0].shape == (2,)


def test_cuda_runtime_adds_no_per_step_callbacks() -> None:
    # The Handler calls a runtime's step callbacks only when its class overrides them; the
    # memory reporter hooks the optimizer instead, and only when report_memory is on.
    for name in ("train_pre_step", "train_post_step", "eval_pre_step", "eval_post_step"):
        assert getattr(CUDARuntime, name) is getattr(BaseRuntime, name)


def test_report_memory_interval(fake_cuda: None) -> None:
    assert CUDARuntime("cuda", {"report_memory": True}).memory_every == 100
    assert CUDARuntime("cuda", {"report_memory": 7}).memory_every == 7
    assert CUDARuntime("cuda").memory_every == 0


# Memory reporting --------------------------------------------------------------------------
@pytest.fixture
def memory_stats(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []

    def stats(device: Any = None) -> dict[str, int]:
        calls.append(device)
        return {
            "allocated_bytes.all.peak": 300 + len(calls),
            "allocated_bytes.all.current": 100,
            "reserved_bytes.all.peak": 512,
        }

    monkeypatch.setattr(torch.cuda, "memory_stats", stats)
    return calls


def test_memory_reporter_reports_at_epoch_starts_and_every_n_steps(memory_stats: list[Any]) -> None:
    model = torch.nn.Linear(2, 1)
    ppe.to(model, "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reporter = MemoryReporter(torch.device("cuda:0"), every=4, epoch_length=3)
    handle = reporter.install(model, optimizer)
    log = ppe.training.extensions.LogReport(trigger=(1, "iteration"), filename=None)
    batches = [(torch.ones(1, 2), torch.ones(1, 1))] * 3

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": (self.model(x) - t).pow(2).mean()}

    wrapper = ppe.to(Loss(), "cpu")
    trainer = ppe.engine.create_trainer(wrapper, optimizer, 3, extensions=[log])
    trainer.run(batches)
    reported = [i for i, entry in enumerate(log.log) if "cuda/max_memory_allocated" in entry]
    # steps 0..8: epoch starts 0, 3, 6 and multiples of 4: 0, 4, 8
    assert reported == [0, 3, 4, 6, 8]
    assert memory_stats == [torch.device("cuda:0")] * 5  # one host-side query per report
    entry = log.log[3]
    assert entry["cuda/memory_allocated"] == 100 and entry["cuda/max_memory_reserved"] == 512
    handle.remove()


def test_runtime_installs_the_reporter_on_the_optimizer_and_keeps_it_for_eval(
    fake_cuda: None, memory_stats: list[Any]
) -> None:
    runtime = CUDARuntime("cuda", {"report_memory": 1})
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runtime.initialize_module(model, [1, 2], optimizer)
    runtime.initialize_module(model, [1], None)  # an evaluator's setup
    with ppe.reporting.Reporter().scope({}) as observation:
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    assert observation["cuda/max_memory_allocated"] == 301
    runtime.initialize_module(model, [1, 2], optimizer)  # a second run: still one hook
    optimizer.step()
    assert len(memory_stats) == 2


def test_without_an_optimizer_the_reporter_counts_training_forwards(
    memory_stats: list[Any],
) -> None:
    model = torch.nn.Linear(2, 1)
    handle = MemoryReporter(torch.device("cuda"), every=1).install(model, None)
    with ppe.reporting.Reporter().scope({}) as observation:
        model(torch.ones(1, 2))
        with torch.no_grad():
            model(torch.ones(1, 2))
    assert len(memory_stats) == 1 and "cuda/memory_allocated" in observation
    handle.remove()


# Prefetching ------------------------------------------------------------------------------
def test_prefetch_loader_checks_its_device(fake_cuda: None) -> None:
    with pytest.raises(ConfigurationError, match="CUDA devices, got device='cpu'"):
        PrefetchLoader([1], "cpu")


@no_cuda
def test_prefetch_loader_without_cuda_raises_the_plugin_error() -> None:
    with pytest.raises(CUDAUnavailableError):
        PrefetchLoader([1])


def test_prefetch_loader_has_the_loaders_length_and_attributes(fake_cuda: None) -> None:
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=4)
    wrapped = PrefetchLoader(loader, "cuda:1")
    assert len(wrapped) == 3
    assert wrapped.sampler is loader.sampler and wrapped.batch_size == 4
    assert wrapped.device == torch.device("cuda:1")
    with pytest.raises(AttributeError):
        _ = wrapped.no_such_attribute


# Environment lines -------------------------------------------------------------------------
@no_cuda
def test_environment_info_without_cuda() -> None:
    import ppe_cuda.plugin

    lines = ppe_cuda.plugin.ppe_environment_info()
    assert lines[0].startswith("cuda: ppe-cuda ") and f"torch {torch.__version__}" in lines[0]
    assert "cuDNN" in lines[0]
    assert lines[1] == "cuda: no usable device"
    assert not torch.cuda.is_initialized()


def test_environment_info_lists_each_device(
    fake_cuda: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ppe_cuda.plugin

    props = SimpleNamespace(
        name="NVIDIA H200", total_memory=140 * 2**30, major=9, minor=0, multi_processor_count=132
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    lines = ppe_cuda.plugin.ppe_environment_info()
    assert lines[1:] == [
        f"cuda:{i}: NVIDIA H200, 140.0 GiB, compute capability 9.0, 132 SMs" for i in (0, 1)
    ]
