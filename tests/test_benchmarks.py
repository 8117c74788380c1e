"""The benchmark suite's own claims hold: every variant does the raw loop's work.

The suite (``python -m benchmarks``) is not part of the tests' pass/fail and nothing here is
timed; these tests keep its workloads honest and runnable, on a few batches.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from helpers import run_python

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def suite() -> Iterator[ModuleType]:
    sys.path.insert(0, HERE)
    try:
        import suite as module

        if module._installed("ignite"):
            with warnings.catch_warnings():
                # Importing ignite 0.5 scripts a function with the deprecated torch.jit.script.
                warnings.simplefilter("ignore", DeprecationWarning)
                import ignite.engine  # noqa: F401

        yield module
    finally:
        sys.path.remove(HERE)


def test_every_training_variant_ends_with_the_raw_loops_weights(suite: ModuleType) -> None:
    """The ratios compare equal work: same seed, same batches, bit-identical final weights."""
    data = suite.batches(12)
    _, reference = suite.raw(data, 2)
    variants = {**suite.step_variants()[0], **suite.instruction_variants()}
    trained = [name for name in variants if not name.startswith(("eval:", "raw"))]
    assert {"ppe-core bare", "ppe-core +3ext", "ppe-core +3ext+report"} <= set(trained)
    for name in trained:
        _, model = variants[name](data, 2)
        assert suite.same_weights(model, reference), name


def test_evaluation_workloads_run_every_pass_without_changing_the_model(
    suite: ModuleType,
) -> None:
    data = suite.batches(5)
    variants = suite.instruction_variants()
    for name in ("eval: raw no_grad loop", "eval: ppe-core Evaluator"):
        _, first = variants[name](data, 1)
        _, again = variants[name](data, 3)
        assert suite.same_weights(first, again), name  # same seed, evaluation only


def test_same_weights_tells_different_models_apart(suite: ModuleType) -> None:
    data = suite.batches(4)
    _, one_epoch = suite.raw(data, 1)
    _, two_epochs = suite.raw(data, 2)
    assert not suite.same_weights(one_epoch, two_epochs)


def test_unknown_sections_are_refused_with_the_choices(suite: ModuleType) -> None:
    with pytest.raises(SystemExit, match=r"unknown section.*choose from"):
        suite.main(["--only", "steps"])


def test_the_gpu_section_says_why_it_did_not_run_without_cuda(suite: ModuleType) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the section really runs (see -m gpu runs)")
    report = suite.Report()
    suite.section_gpu(report, suite.parse(["--quick"]))
    assert "no CUDA device" in report.table()


def test_the_whole_suite_reaches_the_emulated_section_after_backward_passes() -> None:
    """``python -m benchmarks`` runs the step sections (backward passes) before ``emulated``;
    the device must be enabled before them, or the last section fails. The step section is
    replaced by one backward pass here, in a fresh process, to keep the test short."""
    code = (
        f"import sys, torch\nsys.path.insert(0, {HERE!r})\nimport suite\n"
        "def one_backward(report, args):\n"
        "    torch.nn.Linear(2, 1)(torch.ones(3, 2)).sum().backward()\n"
        "suite.RUNNERS['step'] = one_backward\n"
        "report = suite.main(['--quick', '--only', 'step,emulated', '--repeats', '1'])\n"
        "print([(r.name, r.detail) for r in report.rows if r.section == 'emulated'])\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = result.stdout.strip().splitlines()[-1]
    assert "'emulated device'" in rows and "bit-identical to cpu" in rows, result.stdout


@pytest.fixture(scope="module")
def bench_log(suite: ModuleType) -> ModuleType:
    import bench_log as module

    return module


def _recorder(events: list[tuple[int, int]], me: int) -> object:
    import ppe_core as ppe

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def record(manager: object) -> None:
        events.append((me, manager.iteration))  # type: ignore[attr-defined]

    return record


@pytest.mark.parametrize("first", [0, 1])
def test_paired_runs_take_turns_block_by_block(
    bench_log: ModuleType, tmp_path: object, first: int
) -> None:
    """The log and tracking sections' paired timing compares blocks of the same few
    milliseconds: the two trainers must really alternate, every PAIR_BLOCK steps, and both
    give one timed block per pair, with the weights of an unchanged training."""
    import suite

    block = bench_log.PAIR_BLOCK
    events: list[tuple[int, int]] = []
    outs = (str(tmp_path / "a"), str(tmp_path / "b"))  # type: ignore[operator]
    result = bench_log.paired_run(
        suite.batches(40, seed=1),
        6 * block,
        2 * block,
        (lambda: [_recorder(events, 0)], lambda: [_recorder(events, 1)]),
        outs,
        first=first,
    )
    runs = [events[i : i + block] for i in range(0, len(events), block)]
    assert len(runs) == 16
    for number, run in enumerate(runs):
        me = (number + first) % 2  # ``first`` trains each pair's first block
        start = (number // 2) * block + 1
        assert run == [(me, start + i) for i in range(block)]
    assert len(result.a) == len(result.b) == len(result.a_wall) == len(result.b_wall) == 6
    assert all(x > 0 for x in result.a + result.b)
    assert suite.same_weights(*result.models)
    mean = result.mean()
    assert mean == pytest.approx(sum(result.b) / 6 - sum(result.a) / 6)
    assert result.mean(wall=True) == pytest.approx(sum(result.b_wall) / 6 - sum(result.a_wall) / 6)
    # Rows give the mean over runs with an interval over runs (runs, not blocks, are the
    # samples): two equal runs have no spread; a single run has no interval.
    assert (
        bench_log.paired_cell([result, result])[0]
        == f"{mean * 1e6:+.1f} +/- 0.0 us/step thread CPU"
    )
    assert "+/-" not in bench_log.paired_cell([result])[0]
    assert bench_log.runs_interval([1.0, 3.0]) == pytest.approx(12.71)


def test_a_failing_paired_trainer_stops_the_pair_with_its_error(
    bench_log: ModuleType, tmp_path: object
) -> None:
    """One trainer's error reaches the caller; the other trainer is not left waiting for a
    turn that never comes."""
    import suite

    import ppe_core as ppe

    @ppe.training.make_extension(trigger=(15, "iteration"))
    def fail(manager: object) -> None:
        raise RuntimeError("trainer b failed")

    outs = (str(tmp_path / "a"), str(tmp_path / "b"))  # type: ignore[operator]
    with pytest.raises(RuntimeError, match="trainer b failed"):
        bench_log.paired_run(suite.batches(40, seed=1), 40, 10, (list, lambda: [fail]), outs)
