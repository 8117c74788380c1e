"""What a new runtime author meets writing a runtime from the tutorial (issue 23).

A correct runtime whose ``convert_batch`` recurses through ``self.convert_batch`` passes the
kit; step hooks that change gradients or weights fail it (with gradient accumulation, where
gradients outlive a step); option values of the wrong type fail it; the documented way to
validate options (``option_spec`` validated before ``super().__init__``) passes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from ppe_cpu import CPURuntime
from ppe_testing import (
    ConformanceError,
    RuntimeTarget,
    check_callback_order,
    check_options_validation,
    check_step_hooks,
    check_training_matches_reference,
    run_checks,
)

import ppe_core as ppe
from ppe_core.errors import AMPOptionError, ConfigurationError, RuntimeOptionError
from ppe_core.runtime import (
    BaseRuntime,
    DeviceLike,
    DeviceRuntime,
    OptionSpec,
    PyTorchRuntime,
    RuntimeOptions,
    device_type_of,
)
from ppe_core.testing import plugin_host


def _fails(check: Any, target: RuntimeTarget, tmp_path: Path) -> str:
    with pytest.raises(ConformanceError) as info:
        check(target, tmp_path)
    return str(info.value)


# callback_order and a recursive convert_batch ---------------------------------------------------
class RecursesThroughSelf(PyTorchRuntime):
    """Correct: walks nested containers through self.convert_batch, as the tutorial does."""

    def convert_batch(self, args: Any) -> Any:
        if isinstance(args, dict):
            return {k: self.convert_batch(v) for k, v in args.items()}
        if isinstance(args, tuple) and hasattr(args, "_fields"):
            return type(args)(*(self.convert_batch(v) for v in args))
        if isinstance(args, (list, tuple)):
            return type(args)(self.convert_batch(v) for v in args)
        return self.move_tensor(args) if isinstance(args, torch.Tensor) else args


class ConvertsInPostStep(CPURuntime):
    """Wrong: converts the batch again from its own post-step hook."""

    def train_post_step(
        self, trainer: Any, module: Any, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        self.convert_batch(batch)


def test_a_convert_batch_that_recurses_through_self_passes_callback_order(
    tmp_path: Path,
) -> None:
    check_callback_order(RuntimeTarget("cpu", RecursesThroughSelf), tmp_path)  # must not raise


def test_convert_batch_called_from_a_hook_still_fails_callback_order_readably(
    tmp_path: Path,
) -> None:
    message = _fails(check_callback_order, RuntimeTarget("cpu", ConvertsInPostStep), tmp_path)
    assert message.startswith(
        "convert_batch was called between train_post_step and train_pre_step (calls around it:"
    )
    assert "do not call convert_batch from your own callbacks" in message


# Step hooks leave the training state alone ----------------------------------------------------
class ScalesGradsBeforeStep(CPURuntime):
    """Doubles the gradients in train_pre_step: only visible with gradient accumulation."""

    def train_pre_step(self, trainer: Any, module: Any, batch_idx: int, batch: Any) -> None:
        for param in module.parameters():
            if param.grad is not None:
                param.grad.mul_(2)


class RoundsWeights(CPURuntime):
    """Rounds the weights to 2 decimals before every step (a 'quantising' runtime gone wrong)."""

    def train_pre_step(self, trainer: Any, module: Any, batch_idx: int, batch: Any) -> None:
        with torch.no_grad():
            for param in module.parameters():
                param.copy_(param.round(decimals=2))


class ResetsMomentum(CPURuntime):
    def train_post_step(
        self, trainer: Any, module: Any, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        for state in trainer.optimizers["main"].state.values():
            state.pop("momentum_buffer", None)


class SynchronisesInHooks(CPURuntime):
    """Correct: reads the state in every step hook (as a profiler or a sync would)."""

    def train_pre_step(self, trainer: Any, module: Any, batch_idx: int, batch: Any) -> None:
        for param in module.parameters():
            param.detach().sum()

    def eval_post_step(
        self, evaluator: Any, module: Any, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        assert not module.training


def test_a_pre_step_that_changes_gradients_fails_step_hooks(tmp_path: Path) -> None:
    message = _fails(check_step_hooks, RuntimeTarget("cpu", ScalesGradsBeforeStep), tmp_path)
    # Batch 0 starts with no gradients; batch 1 carries batch 0's in the accumulation window.
    assert message.startswith(
        "ScalesGradsBeforeStep.train_pre_step(batch_idx=1) changed the gradient of parameter "
        "'body.0.weight' (a run with gradient accumulation over 2 batches"
    )
    assert "must leave the weights, buffers, gradients and optimizer state alone" in message


def test_a_pre_step_that_rounds_weights_fails_step_hooks(tmp_path: Path) -> None:
    message = _fails(check_step_hooks, RuntimeTarget("cpu", RoundsWeights), tmp_path)
    assert message.startswith(
        "RoundsWeights.train_pre_step(batch_idx=0) changed parameter 'body.0.weight'"
    )


def test_a_post_step_that_drops_optimizer_state_fails_step_hooks(tmp_path: Path) -> None:
    message = _fails(check_step_hooks, RuntimeTarget("cpu", ResetsMomentum), tmp_path)
    assert message.startswith("ResetsMomentum.train_post_step(batch_idx=1) changed the optimizer")
    assert "'momentum_buffer'" in message


def test_hooks_that_only_read_pass_step_hooks(tmp_path: Path) -> None:
    check_step_hooks(RuntimeTarget("cpu", SynchronisesInHooks), tmp_path)  # must not raise
    check_step_hooks(RuntimeTarget("cpu", CPURuntime), tmp_path)


def test_rounded_weights_name_the_step_hooks_among_the_suspects(tmp_path: Path) -> None:
    message = _fails(
        check_training_matches_reference, RuntimeTarget("cpu", RoundsWeights), tmp_path
    )
    assert message.startswith("the loss at the first forward on 'cpu' is ")
    assert "move_module and convert_batch" in message
    assert "train_pre_step does not change the weights" in message


# Option types and the documented way to validate options --------------------------------------
class HandChecksKeysOnly(BaseRuntime):
    """Declares its option keys but never checks the values' types."""

    accepted_options: ClassVar[frozenset[str] | None] = frozenset({"workers"})

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        self.workers = self.options.get("workers", 1)

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to("cpu")

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to("cpu")


class SpecValidated(HandChecksKeysOnly):
    """The documented way: an option_spec, validated before super().__init__."""

    option_spec: ClassVar[RuntimeOptions] = RuntimeOptions(
        "SpecValidated", OptionSpec("workers", (int,), 1, "Copy threads.", "2")
    )
    accepted_options = option_spec.names

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        self.resolved_options = self.option_spec.validate(options)
        super().__init__(device_spec, options)


class SpecValidatedTooLate(HandChecksKeysOnly):
    """Validates with its spec, but after super().__init__ rejected unknown keys tersely."""

    option_spec: ClassVar[RuntimeOptions] = SpecValidated.option_spec
    accepted_options = option_spec.names

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        self.resolved_options = self.option_spec.validate(options)


def test_an_option_whose_type_is_never_checked_fails_options_validation(tmp_path: Path) -> None:
    message = _fails(check_options_validation, RuntimeTarget("cpu", HandChecksKeysOnly), tmp_path)
    assert "accepted a _NotAnOptionValue <not an option value> for option 'workers'" in message
    assert "declare option_spec = RuntimeOptions('HandChecksKeysOnly'" in message
    assert "before super().__init__" in message


def test_the_documented_option_spec_passes_options_validation(tmp_path: Path) -> None:
    check_options_validation(RuntimeTarget("cpu", SpecValidated), tmp_path)  # must not raise
    with pytest.raises(TypeError, match=r"option 'workers' must be int, got str '2'"):
        SpecValidated("cpu", {"workers": "2"})


def test_a_spec_validated_after_super_init_fails_options_validation(tmp_path: Path) -> None:
    message = _fails(check_options_validation, RuntimeTarget("cpu", SpecValidatedTooLate), tmp_path)
    assert "SpecValidatedTooLate declares option_spec, but an unknown option raised " in message
    assert "ConfigurationError" in message
    assert "call self.option_spec.validate(options) before super().__init__" in message


# A device type PyTorch does not know, and the device type autocast runs on --------------------
class SimDevRuntime(DeviceRuntime):
    """``simdev``: unknown to PyTorch, data in host memory, autocast on the CPU's kernels."""

    device_type = "simdev"
    default_autocast_dtype = torch.bfloat16
    option_spec = RuntimeOptions(
        "SimDevRuntime", *DeviceRuntime.shared_options("simdev", torch.bfloat16)
    )
    torch_device_type = "cpu"


class _Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.net(x)
        self.dtypes.append(y.dtype)
        return {"loss": torch.nn.functional.mse_loss(y.float(), t)}


def _train_on(
    device: str, runtime_class: type[BaseRuntime], **kwargs: Any
) -> tuple[_Regression, list[torch.Tensor]]:
    with plugin_host(_Registers(device_type_of(device), runtime_class)):
        torch.manual_seed(0)
        net = _Regression()
        model = ppe.to(net, device, options=kwargs.pop("runtime_options", None))
        trainer = ppe.engine.create_trainer(
            model, torch.optim.SGD(model.parameters(), lr=0.1), 1, device=device, **kwargs
        )
        gen = torch.Generator().manual_seed(1)
        trainer.run(
            [
                {"x": torch.randn(8, 4, generator=gen), "t": torch.randn(8, 1, generator=gen)}
                for _ in range(3)
            ]
        )
    return net, [p.detach().clone() for p in net.parameters()]


class _Registers:
    def __init__(self, device_type: str, runtime_class: type[BaseRuntime]) -> None:
        self.device_type, self.runtime_class = device_type, runtime_class

    @ppe.hookimpl
    def ppe_register_runtimes(self, registry: Any) -> None:
        registry.register(self.device_type, self.runtime_class)


def test_a_device_runtime_serves_a_device_type_pytorch_does_not_know() -> None:
    runtime = SimDevRuntime("simdev:1")
    assert runtime.device == torch.device("cpu") and runtime.device_spec == "simdev:1"
    assert runtime.autocast_device_type == "cpu"
    # bf16 autocast through the runtime option runs on the CPU's kernels, exactly as CPURuntime.
    net, weights = _train_on("simdev", SimDevRuntime, runtime_options={"autocast": True})
    ref_net, ref = _train_on("cpu", CPURuntime, runtime_options={"autocast": True})
    assert net.dtypes == ref_net.dtypes == [torch.bfloat16] * 3
    assert all(torch.equal(a, b) for a, b in zip(weights, ref, strict=True))


def test_the_kit_passes_a_device_runtime_for_an_unknown_device_type(tmp_path: Path) -> None:
    target = RuntimeTarget(
        "simdev",
        SimDevRuntime,
        options={"autocast": True},
        tensor_device="cpu",
        atol=5e-2,
        rtol=5e-2,
    )
    names = ["module_move", "convert_batch", "training_matches_reference", "options_validation"]
    results = run_checks(target, names, workdir=tmp_path)
    assert [(r.name, r.message) for r in results if not r.passed] == []


def test_an_unknown_device_type_without_torch_device_type_says_to_declare_it() -> None:
    class NoTorchType(SimDevRuntime):
        torch_device_type = None

    with pytest.raises(ConfigurationError) as info:
        NoTorchType("simdev")
    message = str(info.value)
    assert "NoTorchType serves 'simdev', a device type PyTorch does not know" in message
    assert "declare torch_device_type = 'cpu' in the body of NoTorchType" in message


def test_autocast_on_a_type_torch_cannot_autocast_fails_at_construction() -> None:
    class AutocastOnSimdev(SimDevRuntime):
        autocast_device_type = "simdev"

    AutocastOnSimdev("simdev")  # autocast off: nothing to check
    with pytest.raises(RuntimeOptionError) as info:
        AutocastOnSimdev("simdev", {"autocast": True})
    message = str(info.value)
    assert "AutocastOnSimdev option 'autocast' asks for autocast on device type 'simdev'" in message
    assert "autocast_device_type = 'cpu'" in message


class HostRuntime(BaseRuntime):
    """A PPE-style runtime for ``hostdev``: data in host memory."""

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to("cpu")

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to("cpu")


class HostRuntimeNamingAutocast(HostRuntime):
    autocast_device_type = "cpu"


def test_the_logics_autocast_uses_the_runtimes_autocast_device_type() -> None:
    net, _ = _train_on("hostdev", HostRuntimeNamingAutocast, options={"autocast": True})
    assert net.dtypes == [torch.bfloat16] * 3
    with pytest.raises(AMPOptionError) as info:
        _train_on("hostdev", HostRuntime, options={"autocast": True})
    message = str(info.value)
    assert "asks for autocast on the model's device type 'hostdev'" in message
    assert "autocast_device_type attribute" in message
