"""PPE's top-level names, ``ppe.logging``, ``ppe.distributed``, ``ppe.nn.parallel`` and
``ppe.profiler`` used as a PPE script uses them, with only the import changed."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import ppe_core as ppe
from ppe_core.errors import ConfigurationError


def test_import_loads_none_of_the_lazy_modules() -> None:
    code = (
        "import sys, ppe_core as ppe\n"
        "lazy = ['logging', 'distributed', 'nn', 'profiler', 'training', '_record', '_tracing',"
        " '_requires', '_map', '_compile']\n"
        "print([m for m in lazy if 'ppe_core.' + m in sys.modules])\n"
        "print(sorted(n for n in lazy if not n.startswith('_') and n not in dir(ppe)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"]


def test_requires_compares_installed_versions_like_ppe() -> None:
    import pytorch_pfn_extras

    torch_version = importlib.metadata.version("torch").split("+")[0]
    for version in ["1.0", "2.0.0", torch_version, "99.0"]:
        assert ppe.requires(version) == pytorch_pfn_extras.requires(version)
    assert ppe.requires(torch_version, package="torch")
    assert ppe.requires("0.1", package="ppe-core")
    assert not ppe.requires("99", package="ppe-core")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        ppe.requires("1.0", package="no-such-distribution-ppe")


def test_requires_without_packaging_orders_releases_and_prereleases() -> None:
    from ppe_core import _requires

    with mock.patch.dict(sys.modules, {"packaging.version": None}):
        with mock.patch.object(importlib.metadata, "version", return_value="2.1.0rc1+cpu"):
            assert _requires.requires("2.0")
            assert not _requires.requires("2.1")
        with mock.patch.object(importlib.metadata, "version", return_value="2.1.0"):
            assert _requires.requires("2.1")
            assert not _requires.requires("2.1.1")


def test_map_and_compile_are_top_level_functions() -> None:
    assert callable(ppe.map)
    assert callable(ppe.compile)


def test_training_namespace_resolves_ppe_names_lazily() -> None:
    training = ppe.training
    assert training.trigger.get_trigger((2, "iteration")) is not None
    assert training.AccuracyMetric is training.metrics.AccuracyMetric
    assert isinstance(torch.optim.lr_scheduler.StepLR(_sgd(), 1), training.StateObjectProtocol)
    for name in ["DistributedEvaluator", "ExtensionsManagerProtocol", "IgniteExtensionsManager"]:
        assert name in dir(training)
    with pytest.raises(AttributeError):
        training.NoSuchName  # noqa: B018


def _sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)


# --- ppe.logging ------------------------------------------------------------------------------


def test_get_logger_returns_children_of_the_ppe_logger(tmp_path: Path) -> None:
    from ppe_core import logging as ppe_logging

    try:
        ppe_logging._configure_logging(filename=str(tmp_path / "log.txt"), level="DEBUG")
        ppe_logging._configure_logging(filename=str(tmp_path / "log.txt"), level="DEBUG")
        logger = ppe_logging.get_logger("app")
        assert logger.name == "ppe.app"
        logger.debug("hello from the app")
        text = (tmp_path / "log.txt").read_text()
        assert text.count("hello from the app") == 1  # reconfiguring replaced the handler
        assert "[ppe.app]" in text and "(DEBUG)" in text
    finally:
        ppe_logging._configure_logging()
    assert ppe_logging.get_logger("app").getEffectiveLevel() == ppe_logging.ERROR
    assert (ppe_logging.DEBUG, ppe_logging.CRITICAL) == (10, 50)


def test_log_level_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppe_core import logging as ppe_logging

    try:
        monkeypatch.setenv("PPE_LOG_LEVEL", "INFO")
        ppe_logging._configure_logging(level="DEBUG")
        assert ppe_logging._get_root_logger().level == ppe_logging.INFO
    finally:
        monkeypatch.delenv("PPE_LOG_LEVEL")
        ppe_logging._configure_logging()


# --- ppe.distributed --------------------------------------------------------------------------


@pytest.mark.parametrize(("length", "replicas"), [(21, 4), (10, 3), (3, 5), (8, 8)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_validation_sampler_splits_like_ppe(length: int, replicas: int, shuffle: bool) -> None:
    import pytorch_pfn_extras

    dataset = list(range(length))
    seen: list[int] = []
    for rank in range(replicas):
        ours = ppe.distributed.DistributedValidationSampler(
            dataset, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=3
        )
        theirs = pytorch_pfn_extras.distributed.DistributedValidationSampler(
            dataset, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=3
        )
        assert list(ours) == [int(i) for i in theirs]
        assert len(ours) == len(theirs)
        seen += list(ours)
    assert sorted(seen) == dataset


def test_validation_sampler_reads_the_world_from_torch_distributed() -> None:
    with (
        mock.patch.object(dist, "get_world_size", return_value=2),
        mock.patch.object(dist, "get_rank", return_value=1),
    ):
        sampler = ppe.distributed.DistributedValidationSampler(range(5), shuffle=False)
    assert list(sampler) == [3, 4]


def test_validation_sampler_errors() -> None:
    with pytest.raises(ppe.distributed.ProcessGroupNotInitializedError, match="init_process"):
        ppe.distributed.DistributedValidationSampler(range(5), num_replicas=2)
    with pytest.raises(RuntimeError):
        ppe.distributed.DistributedValidationSampler(range(5), rank=0)
    with pytest.raises(ConfigurationError, match=r"\[0, 1\]"):
        ppe.distributed.DistributedValidationSampler(range(5), num_replicas=2, rank=2)


@pytest.mark.parametrize(("total", "replicas"), [(10, 3), (12, 4), (5, 2)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_subset_indices_match_ppe(total: int, replicas: int, shuffle: bool) -> None:
    import pytorch_pfn_extras

    for rank in range(replicas):
        assert ppe.distributed.create_distributed_subset_indices(
            total, replicas, rank, shuffle=shuffle, seed=7
        ) == pytorch_pfn_extras.distributed.create_distributed_subset_indices(
            total, replicas, rank, shuffle=shuffle, seed=7
        )


def test_subset_indices_without_a_seed_cover_the_dataset_per_rank() -> None:
    indices = ppe.distributed.create_distributed_subset_indices(10, 1, 0)
    assert sorted(indices) == list(range(10))


def test_initialize_ompi_environment_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ]:
        # setenv first so that teardown also removes what initialize_ompi_environment sets.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    result = ppe.distributed.initialize_ompi_environment(init_method="env", port="2345")
    assert result == (1, 0, 0)
    assert not dist.is_initialized()  # one process: no group needed
    assert (os.environ["MASTER_PORT"], os.environ["WORLD_SIZE"]) == ("2345", "1")
    with pytest.raises(ConfigurationError, match="backend"):
        ppe.distributed.initialize_ompi_environment(backend="mpi")
    with pytest.raises(ConfigurationError, match="init_method"):
        ppe.distributed.initialize_ompi_environment(init_method="file")


# --- ppe.nn.parallel --------------------------------------------------------------------------


@pytest.fixture
def single_process_group(tmp_path: Path) -> object:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0
    )
    yield None
    dist.destroy_process_group()


@pytest.mark.usefixtures("single_process_group")
def test_distributed_data_parallel_trains_and_keeps_module_keys() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    reference.load_state_dict(model.state_dict())
    ddp = ppe.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
    assert ppe.nn.DistributedDataParallel is ppe.nn.parallel.distributed.DistributedDataParallel
    x = torch.randn(8, 3)
    ddp(x).sum().backward()
    reference(x).sum().backward()
    assert torch.allclose(model[0].weight.grad, reference[0].weight.grad)  # type: ignore[arg-type]
    assert list(ddp.state_dict()) == list(model.state_dict())
    ddp.load_state_dict(reference.state_dict())
    with ddp.no_sync():
        ddp(x).sum().backward()


@pytest.mark.usefixtures("single_process_group")
def test_distributed_data_parallel_rejects_custom_communication() -> None:
    with pytest.raises(ConfigurationError, match="register_comm_hook"):
        ppe.nn.parallel.DistributedDataParallel(
            torch.nn.Linear(2, 2), reduce_function=lambda values, group: None
        )


# --- ppe.profiler -----------------------------------------------------------------------------


def _profiled_keys(run: object) -> list[str]:
    with torch.profiler.profile() as prof:
        run()  # type: ignore[operator]
    return [event.key for event in prof.key_averages()]


@pytest.fixture
def time_summary() -> object:
    summary = ppe.profiler.get_time_summary()
    with summary.summary(clear=True):
        pass
    yield summary
    with summary.summary(clear=True):
        pass


def _stats(summary: object) -> dict[str, float]:
    with summary.summary() as s:  # type: ignore[attr-defined]
        return dict(s.make_statistics())


def test_record_marks_a_profiler_range_and_feeds_the_time_summary(time_summary: object) -> None:
    model = torch.nn.Linear(30, 40)
    x = torch.ones(30)

    def run() -> None:
        with ppe.profiler.record("my_tag"):
            model(x)
        with ppe.profiler.record(None):
            model(x)
        with ppe.profiler.record("other", metric="grouped") as ntf:
            ntf.defer()
        ntf.complete()

    keys = _profiled_keys(run)
    assert "my_tag" in keys and "aten::linear" in keys
    assert any(k.startswith("test_compat_toplevel:") and k.endswith(":run") for k in keys)
    stats = _stats(time_summary)
    assert stats["my_tag"] > 0 and "grouped" in stats and "other" not in stats


def test_disabled_record_does_nothing(time_summary: object) -> None:
    def run() -> None:
        with ppe.profiler.record("off", enable=False) as ntf:
            ntf.defer()
            ntf.complete()

    assert "off" not in _profiled_keys(run)
    assert _stats(time_summary) == {}


def test_record_function_and_record_iterable(time_summary: object) -> None:
    @ppe.profiler.record_function(None)
    def my_step(x: torch.Tensor) -> torch.Tensor:
        """Doubles x."""
        return x * 2

    assert my_step.__name__ == "my_step" and my_step.__doc__ == "Doubles x."
    items: list[int] = []

    def run() -> None:
        assert my_step(torch.ones(2)).sum() == 4
        items.extend(ppe.profiler.record_iterable("batch", [1, 2, 3]))
        items.extend(ppe.profiler.record_iterable("split", [4], divide_metric=True))

    keys = _profiled_keys(run)
    assert items == [1, 2, 3, 4]
    assert {"my_step", "batch-0", "batch-1", "batch-2", "split-0"} <= set(keys)
    stats = _stats(time_summary)
    assert {"my_step", "batch", "split-0"} <= set(stats) and "batch-0" not in stats


def test_chrome_tracer_writes_a_trace_ppe_can_read(tmp_path: Path) -> None:
    import pytorch_pfn_extras

    tracer = ppe.profiler.ChromeTracer(max_event_count=3)
    writer = ppe.writing.SimpleWriter(out_dir=str(tmp_path))
    tracer.initialize_writer("trace.json", writer)
    dataset = ppe.profiler.TraceableDataset([10, 20], "getitem", tracer=tracer)
    assert [dataset[0], dataset[1]] == [10, 20] and len(dataset) == 2
    with ppe.profiler.record("step", enable=False, trace=tracer):
        pass
    ppe.profiler.enable_thread_trace(False)
    try:
        with tracer.add_event("hidden"):
            pass
    finally:
        ppe.profiler.enable_thread_trace(True)
    tracer.flush("trace.json", writer)
    with tracer.add_event("after"), tracer.add_event("over the limit"):
        pass
    tracer.flush("trace.json", writer)
    path = str(tmp_path / "trace.json")
    events = ppe.profiler.load_chrome_trace_as_json(path)
    assert [e["name"] for e in events] == ["getitem", "getitem", "step"]
    assert events == pytorch_pfn_extras.profiler.load_chrome_trace_as_json(path)
    assert {"ph", "ts", "dur", "pid", "tid"} <= set(events[0])
    state = tracer.state_dict()
    assert set(state) == {"_enable", "_event_list", "_max_event_count", "_event_count"}
    restored = ppe.profiler.ChromeTracer()
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_global_tracer_is_shared_and_typed() -> None:
    tracer = ppe.profiler.get_tracer()
    assert ppe.profiler.get_tracer() is tracer
    with pytest.raises(TypeError, match="ChromeTracer"):
        ppe.profiler.get_tracer(ppe.profiler.Tracer)
    ppe.profiler.enable_global_trace(False)
    try:
        with tracer.add_event("ignored"):
            pass
    finally:
        ppe.profiler.enable_global_trace(True)
    ppe.profiler.clear_tracer()
    assert json.loads(tracer.state_dict()["_event_list"]) == []
