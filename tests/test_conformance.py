"""The runtime conformance kit: the first-party runtimes pass it, broken runtimes fail it.

Each broken runtime below makes one mistake a runtime author could make; the test asserts the
kit's message says what is wrong in runtime-author terms. Moves that are invisible on the CPU
(CPU to CPU) are checked on PyTorch's ``meta`` device, where a forgotten move shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from ppe_cpu import CPURuntime
from ppe_cuda import CUDARuntime
from ppe_testing import (
    CHECKS,
    ConformanceError,
    RuntimeConformance,
    RuntimeTarget,
    check_callback_order,
    check_convert_batch,
    check_eval_no_grad,
    check_module_move,
    check_options_validation,
    check_snapshot_resume,
    check_state_dict_round_trip,
    check_training_matches_reference,
    run_checks,
)

from ppe_core.errors import PPEError
from ppe_core.runtime import BaseRuntime, PyTorchRuntime

pytest_plugins = ["pytester"]


# The first-party runtimes run the kit ---------------------------------------------------------
class TestCPURuntimeConformance(RuntimeConformance):
    device = "cpu"
    runtime_class = CPURuntime


class TestCPURuntimeBF16AutocastConformance(RuntimeConformance):
    """bf16 autocast: the stated tolerances widen to what bf16 matmuls give (about 1e-3)."""

    device = "cpu"
    runtime_class = CPURuntime
    options: ClassVar[Mapping[str, Any]] = {"autocast": True}
    atol = rtol = 5e-2


def test_bf16_autocast_needs_the_wider_tolerance(tmp_path: Path) -> None:
    strict = RuntimeTarget("cpu", CPURuntime, options={"autocast": True})
    message = _fails(check_training_matches_reference, strict, tmp_path)
    assert "should raise atol/rtol on its conformance class" in message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestCUDARuntimeConformance(RuntimeConformance):
    device = "cuda:0"
    runtime_class = CUDARuntime


class TestRegisteredCPURuntimeConformance(RuntimeConformance):
    """No runtime_class: the kit looks the device up in the active plugin host."""

    device = "cpu"


# Broken runtimes ------------------------------------------------------------------------------
class ForgetsNamedtuples(PyTorchRuntime):
    """Rebuilds dicts, lists and tuples, but returns namedtuples as they came."""

    def convert_batch(self, args: Any) -> Any:
        if isinstance(args, tuple) and hasattr(args, "_fields"):
            return args
        if isinstance(args, dict):
            return {k: self.convert_batch(v) for k, v in args.items()}
        if isinstance(args, (list, tuple)):
            return type(args)(self.convert_batch(v) for v in args)
        return self.move_tensor(args) if isinstance(args, torch.Tensor) else args


class TuplesBecomeLists(PyTorchRuntime):
    def convert_batch(self, args: Any) -> Any:
        if isinstance(args, (list, tuple)) and not hasattr(args, "_fields"):
            return [self.convert_batch(v) for v in args]
        return super().convert_batch(args)


class MovesOnlyParameters(PyTorchRuntime):
    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        for sub in module.modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                setattr(sub, name, torch.nn.Parameter(param.detach().to(self.device)))
        return module


class GradInEval(CPURuntime):
    def eval_pre_step(self, evaluator: Any, module: Any, batch_idx: int, batch: Any) -> None:
        torch.set_grad_enabled(True)


class TrainModeInEval(CPURuntime):
    def eval_pre_step(self, evaluator: Any, module: Any, batch_idx: int, batch: Any) -> None:
        module.train()


class NudgesWeights(CPURuntime):
    def train_post_step(
        self, trainer: Any, module: Any, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        with torch.no_grad():
            for param in module.parameters():
                param.mul_(1.01)


class ExtraPreStep(CPURuntime):
    def train_post_step(
        self, trainer: Any, module: Any, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        self.train_pre_step(trainer, module, batch_idx + 1, batch)


class ReseedsOnResume(CPURuntime):
    """Has a device RNG state, but restoring it reseeds the generator instead."""

    def rng_state(self) -> torch.Tensor:
        return torch.zeros(1)

    def set_rng_state(self, state: Any) -> None:
        torch.manual_seed(1234)


class UnpicklableRngState(CPURuntime):
    def rng_state(self) -> Any:
        return object()


class AcceptsAnyOption(BaseRuntime):
    """A PPE-style runtime: moves with .to('cpu'), no accepted_options declared."""

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to("cpu")

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to("cpu")


class VagueOptionError(AcceptsAnyOption):
    def __init__(self, device_spec: Any, options: Any = None) -> None:
        super().__init__(device_spec, options)
        if set(self.options) - {"fast"}:
            raise ValueError("bad options")


def _fails(check: Any, target: RuntimeTarget, tmp_path: Path) -> str:
    with pytest.raises(ConformanceError) as info:
        check(target, tmp_path)
    return str(info.value)


def test_forgotten_namedtuple_move_fails_convert_batch_naming_the_field(tmp_path: Path) -> None:
    message = _fails(check_convert_batch, RuntimeTarget("meta", ForgetsNamedtuples), tmp_path)
    assert message == (
        "convert_batch left tensor at batch['pair'].first (a namedtuple field) in a dict batch "
        "on cpu; expected meta -- move every tensor inside namedtuples and rebuild them with "
        "type(batch)(*fields)"
    )


def test_the_generic_runtime_moves_every_nested_tensor_to_meta(tmp_path: Path) -> None:
    check_convert_batch(RuntimeTarget("meta", PyTorchRuntime), tmp_path)  # must not raise
    check_module_move(RuntimeTarget("meta", PyTorchRuntime), tmp_path)


def test_tuples_turned_into_lists_fail_convert_batch(tmp_path: Path) -> None:
    message = _fails(check_convert_batch, RuntimeTarget("meta", TuplesBecomeLists), tmp_path)
    assert message.startswith("convert_batch returned list for a tuple batch, which was tuple")
    assert "keep container types" in message


def test_buffers_left_behind_fail_module_move(tmp_path: Path) -> None:
    message = _fails(check_module_move, RuntimeTarget("meta", MovesOnlyParameters), tmp_path)
    assert message.startswith("move_module left buffer 'scale' on cpu; expected meta")
    assert "move every parameter AND buffer" in message


def test_grad_enabled_during_eval_fails_eval_no_grad(tmp_path: Path) -> None:
    message = _fails(check_eval_no_grad, RuntimeTarget("cpu", GradInEval), tmp_path)
    assert "ran with gradients enabled" in message and "eval batch 0" in message
    assert "do not re-enable grad in eval_pre_step" in message


def test_train_mode_during_eval_fails_eval_no_grad(tmp_path: Path) -> None:
    message = _fails(check_eval_no_grad, RuntimeTarget("cpu", TrainModeInEval), tmp_path)
    assert "was in training mode at eval batch 0" in message
    assert "do not call module.train()" in message


def test_a_runtime_that_changes_weights_fails_the_reference_comparison(tmp_path: Path) -> None:
    message = _fails(
        check_training_matches_reference, RuntimeTarget("cpu", NudgesWeights), tmp_path
    )
    assert message.startswith("the loss at step 1 on 'cpu' is ")
    assert "the update differs" in message and "atol=1e-05, rtol=0.0001" in message


def test_wider_tolerances_are_what_the_comparison_uses(tmp_path: Path) -> None:
    lenient = RuntimeTarget("cpu", NudgesWeights, atol=10.0, rtol=10.0)
    check_training_matches_reference(lenient, tmp_path)  # 1 % nudges fit a tolerance of 10


def test_an_extra_callback_call_fails_callback_order(tmp_path: Path) -> None:
    message = _fails(check_callback_order, RuntimeTarget("cpu", ExtraPreStep), tmp_path)
    # Calls 0-3: train_epoch_begin, pre(0), post(0), the extra pre(1); then pre(1) again.
    assert message.startswith(
        "runtime callback #4 was train_pre_step(batch_idx=1), expected train_post_step(batch_idx=1)"
    )
    assert "do not call them from each other" in message


def test_a_device_rng_that_does_not_resume_fails_snapshot_resume(tmp_path: Path) -> None:
    message = _fails(check_snapshot_resume, RuntimeTarget("cpu", ReseedsOnResume), tmp_path)
    assert "after resuming from a snapshot (with dropout)" in message
    assert "restore it in set_rng_state()" in message


def test_an_rng_state_snapshots_cannot_load_fails_state_dict_round_trip(tmp_path: Path) -> None:
    message = _fails(
        check_state_dict_round_trip, RuntimeTarget("cpu", UnpicklableRngState), tmp_path
    )
    assert "UnpicklableRngState.rng_state() returned object" in message
    assert "weights_only=True" in message and "return tensors and plain types" in message


def test_silently_accepted_unknown_option_fails_options_validation(tmp_path: Path) -> None:
    message = _fails(check_options_validation, RuntimeTarget("cpu", AcceptsAnyOption), tmp_path)
    assert "accepted the unknown option 'ppe_conformance_unknown_option' silently" in message
    assert "declare accepted_options = frozenset({...}) in the body of AcceptsAnyOption" in message


def test_an_option_error_that_does_not_name_the_option_fails(tmp_path: Path) -> None:
    message = _fails(check_options_validation, RuntimeTarget("cpu", VagueOptionError), tmp_path)
    assert "the message does not name the option: bad options" in message


def test_run_checks_reports_each_failure_and_the_passes(tmp_path: Path) -> None:
    results = run_checks(RuntimeTarget("cpu", AcceptsAnyOption), workdir=tmp_path)
    assert [r.name for r in results] == list(CHECKS)
    failed = {r.name: r.message for r in results if not r.passed}
    # A CPU-to-CPU move cannot be told apart from no move: only the options check fails.
    assert list(failed) == ["options_validation"]
    with pytest.raises(ConformanceError, match=r"unknown check\(s\) \['nope'\]"):
        run_checks(RuntimeTarget("cpu", CPURuntime), ["nope"])


def test_a_move_method_that_returns_nothing_is_reported_by_every_check(tmp_path: Path) -> None:
    class ReturnsNone(CPURuntime):
        def move_module(self, module: torch.nn.Module) -> Any:
            module.to("cpu")

    results = {r.name: r for r in run_checks(RuntimeTarget("cpu", ReturnsNone), workdir=tmp_path)}
    assert results["module_move"].message.startswith(
        "ReturnsNone.move_module returned NoneType, not the module; return the moved module"
    )
    assert "ppe.to(module, 'cpu') raised AttributeError" in results["tagging"].message
    assert not results["snapshot_resume"].passed


# Using the kit wrongly ------------------------------------------------------------------------
def test_conformance_error_is_an_assertion_error_and_a_ppe_error() -> None:
    assert issubclass(ConformanceError, AssertionError) and issubclass(ConformanceError, PPEError)


def test_a_device_pytorch_does_not_know_needs_tensor_device(tmp_path: Path) -> None:
    class FakeDevice(CPURuntime):
        def __init__(self, device_spec: Any, options: Any = None) -> None:
            super().__init__("cpu", options)

    message = _fails(check_module_move, RuntimeTarget("fakedev", FakeDevice), tmp_path)
    assert "device 'fakedev' is not a device type PyTorch knows" in message
    assert "set tensor_device" in message


def test_an_unregistered_device_says_how_to_register_it(tmp_path: Path) -> None:
    message = _fails(check_module_move, RuntimeTarget("nodev"), tmp_path)
    assert "no runtime is registered for device 'nodev'" in message
    assert "pip install -e ." in message and "runtime_class = MyRuntime" in message


def test_a_class_without_device_says_to_set_it() -> None:
    class TestNothing(RuntimeConformance):
        pass

    with pytest.raises(ConformanceError, match="set the class attribute device = 'mydev'"):
        TestNothing.conformance_target()


def test_the_package_re_exports_exactly_the_kit_and_a_method_per_check() -> None:
    import ppe_testing
    from ppe_testing import _conformance, _emulated, _installs_alone

    # ppe_testing spells the kit's names out for its lazy re-export: keep them in sync.
    modules = (_conformance, _emulated, _installs_alone)
    assert set(ppe_testing.__all__) == {name for module in modules for name in module.__all__}
    for name in _conformance.__all__:
        assert getattr(ppe_testing, name) is getattr(_conformance, name)
    # RuntimeConformance spells out one test method per check, so every check is collected.
    methods = {name for name in dir(RuntimeConformance) if name.startswith("test_")}
    assert methods == {f"test_{name}" for name in CHECKS}


def test_importing_the_kit_does_not_import_pytest() -> None:
    from helpers import run_python

    code = (
        "import sys, ppe_core, ppe_testing\n"
        "assert 'pytest' not in sys.modules, 'import ppe_testing imported pytest'\n"
        "from ppe_testing import RuntimeConformance, run_checks\n"
        "assert 'pytest' not in sys.modules, 'the kit imported pytest'\n"
        "print('ok')\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# The base class as pytest collects it ---------------------------------------------------------
def test_pytest_runs_the_base_class_and_shows_the_kit_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_my_runtime="""
        import torch
        from ppe_core.runtime import PyTorchRuntime
        from ppe_testing import RuntimeConformance

        class GradInEval(PyTorchRuntime):
            accepted_options = PyTorchRuntime.accepted_options

            def eval_pre_step(self, evaluator, module, batch_idx, batch):
                torch.set_grad_enabled(True)

        class TestBroken(RuntimeConformance):
            device = "cpu"
            runtime_class = GradInEval
            skip_checks = frozenset({"snapshot_resume", "training_matches_reference"})
        """
    )
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "-rsf")
    result.assert_outcomes(passed=len(CHECKS) - 3, failed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*snapshot_resume is listed in TestBroken.skip_checks*",
            "*FAILED*TestBroken::test_eval_no_grad*",
        ],
        consecutive=False,
    )
    assert "ran with gradients enabled" in result.stdout.str()
