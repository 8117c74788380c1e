"""The bad-input catalogue: each misuse, done through the public API, gets an error that names
the problem and the fix. docs/errors.md lists every case with the test that backs it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import run_python
from ppe_cuda import CUDAUnavailableError
from torch.utils.data import DataLoader

import ppe_core as ppe
import ppe_core.testing
from ppe_core.errors import (
    AMPOptionError,
    ArgumentTypeError,
    BatchDtypeError,
    ConfigurationError,
    DuplicateRegistrationError,
    MissingObservationError,
    NoGradientError,
    NoGradientWarning,
    NonFiniteParameterError,
    OptimizerParametersError,
    PluginAPIVersionError,
    PluginConflictWarning,
    PluginHookError,
    RegistryLookupError,
    RuntimeNotFoundError,
    RuntimeOptionError,
    ValLoaderIgnoredWarning,
)
from ppe_core.handler import BatchMismatchError, ModelOutputError, NoRuntimeError
from ppe_core.reporting import EmptySummaryError, UnknownObserverError
from ppe_core.training.extension import ExtensionNameError
from ppe_core.training.manager import (
    ManagerStateError,
    ModelStateUnavailableError,
    StateDictKeyError,
    StateDictMismatchError,
)
from ppe_core.training.triggers import TriggerTypeError

E = ppe.training.extensions


# Models, loaders and helpers -----------------------------------------------------------------
class Regressor(torch.nn.Module):
    """The house style: keyword inputs, a dict holding the loss."""

    def __init__(self, features: int = 2) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(features, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


class OtherNet(torch.nn.Module):
    """A different architecture: its state has other keys than Regressor's."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        return {"loss": torch.nn.functional.mse_loss(self.body(x), t)}


def batches(n: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(3, 2, generator=g), "t": torch.randn(3, 1, generator=g)}] * n


def model_on_cpu(model: torch.nn.Module | None = None) -> torch.nn.Module:
    return ppe.to(model if model is not None else Regressor(), "cpu")


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def make_trainer(model: torch.nn.Module | None = None, **kwargs: Any) -> ppe.training.Trainer:
    model = model_on_cpu(model)
    return ppe.engine.create_trainer(model, sgd(model), kwargs.pop("max_epochs", 1), **kwargs)


def says(error: pytest.ExceptionInfo[BaseException], *phrases: str) -> None:
    """The message holds every phrase: the problem and the fix."""
    message = str(error.value)
    missing = [p for p in phrases if p not in message]
    assert not missing, f"{missing} not in message:\n{message}"


def manager_for(model: torch.nn.Module, **kwargs: Any) -> ppe.training.ExtensionsManager:
    return ppe.training.ExtensionsManager(model, sgd(model), 1, iters_per_epoch=1, **kwargs)


# Model outputs and batches ---------------------------------------------------------------------
def test_closure_logic_with_grad_scaler() -> None:
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(RuntimeError) as info:  # AMPOptionError: PPE raises RuntimeError here
        ppe.handler.ClousureLogic(options={"grad_scaler": scaler})
    assert isinstance(info.value, ConfigurationError)
    says(info, "ClousureLogic cannot use a grad_scaler", "Remove the 'grad_scaler' option")


def test_to_with_options_and_config() -> None:
    with pytest.raises(ValueError) as info:  # ConfigurationError is a ValueError, as PPE's
        ppe.to(torch.nn.Linear(1, 1), "cpu", options={}, config={})
    assert isinstance(info.value, ConfigurationError)
    says(info, "both options= and config=", "pass only options=")


def warned(record: pytest.WarningsRecorder, *phrases: str) -> None:
    """One warning was recorded, and its message holds every phrase."""
    assert len(record) == 1, [str(w.message) for w in record]
    message = str(record[0].message)
    missing = [p for p in phrases if p not in message]
    assert not missing, f"{missing} not in message:\n{message}"


def test_backward_outputs_key_missing() -> None:
    trainer = make_trainer(options={"backward_outputs": ["los"]})
    with pytest.warns(ppe.handler.BackwardOutputWarning) as record:  # PPE warns, then skips
        trainer.run(batches(1))
    warned(record, "backward value: los", "outputs ['loss']", "fix backward_outputs")


def test_output_without_loss() -> None:
    class NoLoss(Regressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            return {"prediction": self.fc(x)}

    with pytest.warns(ppe.handler.BackwardOutputWarning) as record:  # once per Logic
        make_trainer(NoLoss()).run(batches())
    warned(record, "nothing is backpropagated", "{'loss': loss}", "backward_outputs")


def test_loss_not_scalar() -> None:
    class VectorLoss(Regressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            return {"loss": (self.fc(x) - t) ** 2}

    trainer = make_trainer(VectorLoss(), options={"backward_outputs": ["loss"]})
    with pytest.raises(ModelOutputError) as info:
        trainer.run(batches())
    says(info, "'loss' has shape (3, 1)", "needs a scalar", "loss.mean()", "backward_function")


def test_loss_without_grad() -> None:
    class DetachedLoss(Regressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            return {"loss": torch.nn.functional.mse_loss(self.fc(x), t).detach()}

    trainer = make_trainer(DetachedLoss(), options={"backward_outputs": ["loss"]})
    with pytest.warns(ppe.handler.BackwardOutputWarning) as record:  # PPE skips it silently
        trainer.run(batches(1))
    warned(record, "'loss' does not require grad", "not under torch.no_grad()", "detach")


def test_batch_keys_do_not_fit_forward() -> None:
    bad = [{"inputs": torch.randn(3, 2), "t": torch.randn(3, 1)}] * 2
    with pytest.raises(BatchMismatchError) as info:
        make_trainer().run(bad)
    says(info, "Regressor.forward(x, t)", "keys ['inputs', 't']", "keyword arguments")


def test_batch_tuple_does_not_fit_forward() -> None:
    with pytest.raises(BatchMismatchError) as info:
        make_trainer().run([(torch.randn(3, 2),)] * 2)
    says(info, "missing a required argument: 't'", "tuple of 1 items", "positional arguments")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_batch_dtype_differs_from_the_model(dtype: torch.dtype) -> None:
    bad = [{"x": torch.ones(3, 2, dtype=dtype), "t": torch.randn(3, 1)}] * 2
    with pytest.raises(BatchDtypeError) as info:  # also a RuntimeError, as torch's
        make_trainer().run(bad)
    says(info, f"'x' is {dtype}", "parameters (torch.float32)", "collate_fn", "x.float()")


@pytest.mark.parametrize("cause", ["item", "detach", "no_grad"])
def test_loss_without_grad_with_default_options(cause: str) -> None:
    class NoGraph(Regressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            with torch.no_grad() if cause == "no_grad" else contextlib.nullcontext():
                loss = torch.nn.functional.mse_loss(self.fc(x), t)
            return {"loss": loss.item() if cause == "item" else loss.detach()}

    # A warning at the first step (the run goes on, as in PPE), the error after an epoch.
    first = "first training step backpropagated nothing"
    with pytest.raises(NoGradientError) as info, pytest.warns(NoGradientWarning, match=first):
        make_trainer(NoGraph(), max_epochs=2).run(batches())
    says(info, "a whole epoch trained nothing", ".item()", "no_grad")


def test_optimizer_holds_none_of_the_models_parameters() -> None:
    model, other = Regressor(), Regressor()
    trainer = ppe.engine.create_trainer(model, sgd(other), 1, device="cpu")
    ppe.to(model, "cpu")
    with pytest.raises(OptimizerParametersError) as info:  # before the first step
        trainer.run(batches())
    says(info, "optimizer 'main' holds none of the models' parameters", "after ppe.to")
    assert isinstance(info.value, ConfigurationError)
    # The way it happens for real: built before moving to a device whose module.to makes new
    # parameter objects (the emulated device; it needs a fresh process).
    code = (
        "import torch, ppe_core as ppe\n"
        "from ppe_testing import EmulatedDeviceRuntime, enable_emulated_device\n"
        "enable_emulated_device()\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(2, 1)\n"
        "    def forward(self, x):\n        return {'loss': self.fc(x).pow(2).mean()}\n"
        "model = Model()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "ppe.to(model, 'ppe_emu', runtime_class=EmulatedDeviceRuntime)\n"
        "trainer = ppe.engine.create_trainer(model, opt, 1, device='ppe_emu')\n"
        "trainer.run([{'x': torch.ones(4, 2)}])\n"
    )
    result = run_python(code, timeout=120)
    assert "OptimizerParametersError: optimizer 'main' holds none" in result.stderr, result.stderr
    assert "on cpu, the models' on ppe_emu:0" in result.stderr


# Devices and runtimes ----------------------------------------------------------------------
def test_run_without_ppe_to() -> None:
    model = Regressor()
    trainer = ppe.engine.create_trainer(model, sgd(model), 1)
    with pytest.raises(NoRuntimeError) as info:
        trainer.run(batches())
    says(info, "was moved with ppe.to", "ppe.to(model, 'cpu')")


def test_unknown_device() -> None:
    with pytest.raises(RuntimeNotFoundError) as info:
        make_trainer(device="tpu")
    says(info, "No runtime is registered under 'tpu'", "Registered runtimes: cpu, cuda")
    says(info, "pip install", "runtime_registry.register('tpu', MyRuntime)")


def test_invalid_device_string() -> None:
    with pytest.raises(ConfigurationError) as info:
        ppe.to(Regressor(), "cpu:first")
    says(info, "cannot use the device 'cpu:first'", "e.g. 'cpu', 'cuda' or 'cuda:1'")


def test_device_of_wrong_type() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ppe.to(Regressor(), 0)  # type: ignore[call-overload]
    says(info, "device must be a str or a torch.device, got int", "device='cuda:0'")


def test_auto_device_without_plugin() -> None:
    with ppe_core.testing.plugin_host(), pytest.raises(ConfigurationError) as info:
        make_trainer(device="auto")
    says(info, "device='auto' needs a plugin", "none answered", "pip install ppe-cpu", "'cpu'")


def test_cuda_on_cpu_only_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CUDAUnavailableError) as info:
        ppe.to(Regressor(), "cuda")
    says(info, "device 'cuda' was requested but", "use device='cpu'")


def test_ppe_to_non_module() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ppe.to([torch.zeros(1)], "cpu")  # type: ignore[call-overload]
    says(info, "expects a torch.nn.Module or torch.Tensor, got list", "pass the model")


def test_runtime_class_instance_given_to_ppe_to() -> None:
    runtime = ppe.runtime.PyTorchRuntime("cpu")
    with pytest.raises(ArgumentTypeError) as info:
        ppe.to(Regressor(), "cpu", runtime_class=runtime)  # type: ignore[arg-type]
    says(info, "runtime_class must be a subclass of ppe_core.runtime.BaseRuntime", "not an")


def test_register_non_runtime_class() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ppe.runtime.runtime_registry.register("mydev", Regressor)  # type: ignore[arg-type]
    says(info, "must be a subclass of ppe_core.runtime.BaseRuntime", "MyRuntime(PyTorchRuntime)")


def test_register_runtime_instance() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ppe.runtime.runtime_registry.register(
            "mydev",
            ppe.runtime.PyTorchRuntime("cpu"),  # type: ignore[arg-type]
        )
    says(info, "(an instance)", "register the class itself")


def test_register_runtime_for_a_device() -> None:
    with pytest.raises(ConfigurationError) as info:
        ppe.runtime.runtime_registry.register("cuda:1", ppe.runtime.PyTorchRuntime)
    says(info, "not a device: got 'cuda:1'", "register 'cuda' instead")


class _LazyBrokenPlugin:
    @ppe.hookimpl
    def ppe_register_extensions(self, registry: Any) -> None:
        registry.register_lazy("Broken", "ppe_no_such_package._ext:Broken")


def test_lazy_registration_target_is_malformed(plugin_host: Any) -> None:
    with pytest.raises(ArgumentTypeError) as info:
        plugin_host.extensions.register_lazy("Mine", "my_plugin._ext.Mine")
    says(info, "must read 'package.module:attribute'", "register_lazy('MyExt'")


def test_lazy_registration_target_fails_to_import(plugin_host: Any) -> None:
    plugin_host.register(_LazyBrokenPlugin(), name="lazy-broken")
    with pytest.raises(ppe.errors.PluginLoadError) as info:
        E.Broken  # noqa: B018 - the lookup is what fails
    says(info, "extension 'Broken'", "plugin 'lazy-broken'", "ppe_no_such_package", "Fix or")


def test_duplicate_runtime_registration() -> None:
    # User code replaces with a warning, as in PPE; a plugin claiming a taken device conflicts.
    class Plugin:
        @ppe.hookimpl
        def ppe_register_runtimes(self, registry: Any) -> None:
            registry.register("cpu", ppe.runtime.PyTorchRuntime)

    with pytest.raises(DuplicateRegistrationError) as info:
        ppe.plugins.get_plugin_host().register(Plugin(), name="second_cpu")
    says(info, "'cpu' is already registered by plugin 'ppe_cpu'", "replace=True")


def test_plugin_hook_typo() -> None:
    class Plugin:
        @ppe.hookimpl
        def ppe_register_runtime(self, registry: Any) -> None:  # "runtimes" misspelt
            pass

    with pytest.raises(ConfigurationError) as info:
        ppe.plugins.get_plugin_host().register(Plugin(), name="typo")
    says(info, "unknown hook 'ppe_register_runtime'", "known hooks:", "ppe_register_runtimes")


def test_plugin_written_for_another_hook_api() -> None:
    class Plugin:
        PPE_CORE_HOOK_API = (2, 0)

        @ppe.hookimpl
        def ppe_register_runtimes(self, registry: Any) -> None:
            pass

    with pytest.raises(PluginAPIVersionError) as info:
        ppe.plugins.get_plugin_host().register(Plugin(), name="future")
    says(info, "plugin 'future'", "hook API 2.0", "provides hook API 1.1", "upgrade ppe-core")


def test_autocast_on_a_device_type_torch_cannot_autocast() -> None:
    class HostRuntime(ppe.runtime.BaseRuntime):  # "hostdev": data in host memory
        def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
            return module.to("cpu")

        def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to("cpu")

    ppe.runtime.runtime_registry.register("hostdev", HostRuntime)
    model = ppe.to(torch.nn.Linear(2, 1), "hostdev")
    trainer = ppe.engine.create_trainer(
        model, sgd(model), 1, device="hostdev", options={"autocast": True}
    )
    with pytest.raises(AMPOptionError) as info:
        trainer.run([(torch.ones(2, 2),)])
    says(info, "autocast on the model's device type 'hostdev'", "autocast_device_type")


def test_plugin_claims_a_first_party_device_type(
    misbehaving_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(misbehaving_plugins))  # discovered before ppe-cpu
    settings = ppe.plugins.PluginSettings(disabled=("intruder_replace", "failing_setup"))
    with pytest.warns(PluginConflictWarning) as record:
        host = ppe.plugins.PluginHost(settings)
    intruder = "plugin 'intruder' (ppe-misbehaving 0.3.0)"
    warned(record, intruder, "runtime 'cpu'", "stays with ppe-cpu", "PPE_DISABLED_PLUGINS")
    assert host.runtimes.entries()["cpu"].registrant.distribution == "ppe-cpu"


def test_plugin_setup_hook_raises() -> None:
    class Buggy:
        @ppe.hookimpl
        def ppe_trainer_setup(self, trainer: Any) -> None:
            raise ValueError("oops")

    ppe.plugins.get_plugin_host().register(Buggy(), name="buggy")
    with pytest.raises(PluginHookError) as info:
        make_trainer().run(batches())
    says(info, "ppe_trainer_setup of plugin 'buggy'", "ValueError('oops')", "unregister('buggy')")


# create_trainer / create_evaluator arguments -------------------------------------------------
def test_model_of_wrong_type() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ppe.engine.create_trainer("resnet", sgd(Regressor()), 1)  # type: ignore[arg-type]
    says(info, "models must be a torch.nn.Module", "models['main'] is str")


def test_optimizer_class_instead_of_instance() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ppe.engine.create_trainer(Regressor(), torch.optim.SGD, 1)  # type: ignore[arg-type]
    says(info, "the class SGD, not an instance", "torch.optim.SGD(model.parameters(), lr=0.1)")


@pytest.mark.parametrize("max_epochs", [0, -1, 1.5])
def test_max_epochs_not_positive(max_epochs: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        make_trainer(max_epochs=max_epochs)
    says(info, f"max_epochs must be a positive int, got {max_epochs!r}", "e.g. 10")


def test_create_trainer_unknown_argument() -> None:
    with pytest.raises(ConfigurationError) as info:
        make_trainer(extension=[E.LogReport()])
    says(info, "unexpected argument(s) 'extension'", "did you mean 'extensions'?")


def test_extensions_not_a_list() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        make_trainer(extensions=E.LogReport())
    says(info, "extensions must be a list", "got LogReport", "extensions=[extension]")


def test_unknown_option() -> None:
    with pytest.raises(ConfigurationError) as info:
        make_trainer(options={"backward_output": ["loss"]})
    says(info, "unknown option(s) ['backward_output']", "Check the spelling")


def test_options_not_a_dict() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        make_trainer(options=["autocast"])
    says(info, "options must be a dict", "got list", "options={'name': value}")


def test_option_of_wrong_type() -> None:
    with pytest.raises(ConfigurationError) as info:
        make_trainer(options={"backward_function": "backward"})
    says(info, "'backward_function' must be a callable", "got str", "leave it out")


def test_unknown_runtime_option() -> None:
    with pytest.raises(ConfigurationError) as info:
        make_trainer(runtime_options={"pin_memory": True})
    says(info, "does not understand the runtime option(s) 'pin_memory'", "Remove them")


def test_runtime_option_of_wrong_type() -> None:
    with pytest.raises(TypeError) as info:
        make_trainer(runtime_options={"num_threads": "4"})
    assert isinstance(info.value, ConfigurationError)
    says(info, "option 'num_threads' must be int", "got str", "options={'num_threads': 4}")


def test_compile_for_a_model_moved_without_it() -> None:
    with pytest.raises(RuntimeOptionError) as info:
        make_trainer(runtime_options={"compile": True})
    says(info, "'compile' act only when a model is moved", "options={..., 'compile': True}")


def test_handler_class_not_a_handler() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        make_trainer(handler_class=ppe.handler.Logic)
    says(info, "handler_class must be a subclass of ppe_core.handler.Handler", "omit it")


def test_writer_of_wrong_type() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        make_trainer(writer="result").run(batches())
    says(info, "writer must be a ppe_core.writing writer", "got str", "SimpleWriter(out_dir=")


def test_profile_without_step() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        make_trainer(profile=True)
    says(info, "profile must be a torch.profiler.profile", "got bool", "leave it out")


# Logic and model/optimizer names -------------------------------------------------------------
def test_optimizer_keys_do_not_match_models() -> None:
    model = model_on_cpu()
    trainer = ppe.engine.create_trainer({"main": model}, {"net": sgd(model)}, 1)
    with pytest.raises(ConfigurationError) as info:
        trainer.run(batches())
    says(info, "trains the optimizer named 'main'", "named ['net']", "optimizers={'main': ")


def test_model_keys_without_main() -> None:
    model = model_on_cpu()
    trainer = ppe.engine.create_trainer({"net": model}, {"net": sgd(model)}, 1)
    with pytest.raises(ConfigurationError) as info:
        trainer.run(batches())
    says(info, "trains the model named 'main'", "named ['net']", "Logic(model_name='net')")


def test_several_models_with_default_logic() -> None:
    a, b = model_on_cpu(), model_on_cpu()
    trainer = ppe.engine.create_trainer({"a": a, "b": b}, {"a": sgd(a), "b": sgd(b)}, 1)
    with pytest.raises(ConfigurationError) as info:
        trainer.run(batches())
    says(info, "named ['a', 'b']", "trains one model", "subclass ppe.handler.BaseLogic")


def test_logic_name_not_registered() -> None:
    with pytest.raises(RegistryLookupError) as info:
        make_trainer(logic="gan")
    says(info, "No logic is registered under 'gan'", "Registered logics: codeblock, default")
    says(info, "install the plugin that provides it", "ppe_register_logics(registry)")


def test_logic_class_instead_of_instance() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        make_trainer(logic=ppe.handler.Logic)
    says(info, "got the class Logic", "pass an instance, e.g. logic=Logic()")


# Triggers ---------------------------------------------------------------------------------
def test_trigger_bad_unit() -> None:
    with pytest.raises(ConfigurationError) as info:
        E.LogReport(trigger=(1, "epochs"))
    says(info, "unit must be 'epoch' or 'iteration', got 'epochs'", "did you mean 'epoch'?")


def test_trigger_negative_period() -> None:
    with pytest.raises(ConfigurationError) as info:
        make_trainer(stop_trigger=(-1, "epoch")).run(batches())
    says(info, "period must be a finite number > 0, got -1", "use e.g. 1 or 0.5")


def test_trigger_string() -> None:
    trainer = make_trainer()
    with pytest.raises(TriggerTypeError) as info:  # at extend(), not later at run()
        trainer.extend(E.LogReport(), trigger="epoch")
    says(info, "cannot make a trigger from str 'epoch'", "(1, 'epoch')")


def test_trigger_fractional_iterations() -> None:
    with pytest.raises(ConfigurationError) as info:
        E.LogReport(trigger=(1.5, "iteration"))
    says(info, "must be a whole number, got 1.5", "unit='epoch'")


# Extensions and the manager ----------------------------------------------------------------
def test_extension_name_reserved() -> None:
    manager = manager_for(Regressor())
    with pytest.raises(ExtensionNameError) as info:
        manager.extend(E.LogReport(), name="training")
    says(info, "'training' is reserved", "pass another name=")


def test_extension_not_callable() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        make_trainer(extensions=[E.LogReport]).run(batches())
    says(info, "an extension must be", "got the class LogReport", "e.g. LogReport()")


def test_extension_priority_not_int() -> None:
    manager = manager_for(Regressor())
    with pytest.raises(ArgumentTypeError) as info:
        manager.extend(E.LogReport(), priority="high")
    says(info, "priority must be an int, got str 'high'", "PRIORITY_READER")


def test_get_extension_unknown_name() -> None:
    manager = manager_for(Regressor(), extensions=[E.LogReport()])
    with pytest.raises(ExtensionNameError) as info:
        manager.get_extension("LogReprot")
    says(info, "no extension named 'LogReprot'", "did you mean 'LogReport'?", "extend(")


def test_unknown_extension_class() -> None:
    with pytest.raises(AttributeError) as info:
        E.LogReprot  # noqa: B018
    says(info, "No extension is registered under 'LogReprot'", "Did you mean: LogReport")


def test_step_optimizers_unknown() -> None:
    manager = manager_for(Regressor())
    with pytest.raises(ConfigurationError) as info:
        manager.run_iteration(step_optimizers=["adam"])
    says(info, "unknown optimizers ['adam']", "registered: ['main']")


def test_models_read_without_needs_model_state() -> None:
    manager = manager_for(Regressor(), extensions=[lambda m: m.models])
    with pytest.raises(ModelStateUnavailableError) as info, manager.run_iteration():
        pass
    says(info, "models cannot be read", "needs_model_state = True")


def test_manager_used_after_finalize() -> None:
    manager = manager_for(Regressor())
    with manager.run_iteration():
        pass  # the stop trigger (1 epoch) fires: the manager finalizes
    with pytest.raises(ManagerStateError) as info, manager.run_iteration():
        pass
    says(info, "the manager is finalized", "create a new manager")


def test_print_report_without_log_report() -> None:
    trainer = make_trainer(extensions=[E.PrintReport(["epoch", "train/loss"])])
    with pytest.raises(ExtensionNameError) as info:
        trainer.run(batches())
    says(info, "LogReport registered as 'LogReport'", "extensions=[LogReport(), PrintReport(")


def test_print_report_entries_as_string() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        E.PrintReport("train/loss")
    says(info, "entries must be a list of keys", "PrintReport(entries=['train/loss'])")


def test_log_report_unknown_format() -> None:
    with pytest.raises(ConfigurationError) as info:
        E.LogReport(filename="log.xml", format="xml")
    says(info, "format must be one of ['json', 'json-lines', 'yaml', 'csv'], got 'xml'", ".csv")


def test_reduce_lr_on_plateau_without_monitored_key() -> None:
    model = model_on_cpu()
    optimizer = sgd(model)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    trainer = ppe.engine.create_trainer(model, optimizer, 1, extensions=[E.LRScheduler(scheduler)])
    with pytest.raises(MissingObservationError) as info:
        trainer.run(batches())
    says(info, "needs the reported value 'val/loss'", "Attach an evaluator", "step_by_value(")


def test_nan_loss_with_fail_on_non_number() -> None:
    class Diverging(Regressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            return {"loss": self.fc(x).sum() * float("nan")}

    trainer = make_trainer(Diverging(), extensions=[E.FailOnNonNumber()])
    with pytest.raises(NonFiniteParameterError) as info:
        trainer.run(batches())
    says(info, "training diverged", "optimizer 'main'", "main: fc.weight", "lower learning rate")


# Loaders and evaluators ----------------------------------------------------------------------
def test_val_loader_without_evaluator() -> None:
    with pytest.warns(ValLoaderIgnoredWarning) as info:  # PPE warns too, and trains on
        make_trainer().run(batches(), batches())
    message = str(info[0].message)
    assert "got a val_loader but the trainer has no evaluator" in message
    assert "evaluator=" in message


def test_evaluator_without_val_loader() -> None:
    model = model_on_cpu()
    evaluator = ppe.engine.create_evaluator(model)
    trainer = ppe.engine.create_trainer(model, sgd(model), 1, evaluator=evaluator)
    with pytest.raises(ConfigurationError) as info:
        trainer.run(batches())
    says(info, "has an evaluator but run() got no val_loader", "run(train_loader, val_loader)")


def test_generator_read_for_a_second_epoch() -> None:
    def stream() -> Iterator[dict[str, torch.Tensor]]:
        yield from batches()

    with pytest.raises(ConfigurationError) as info:
        make_trainer(max_epochs=2).run(stream())
    says(info, "yielded no batches in epoch 2", "can be read only once", "max_epochs=1")


def test_empty_loader() -> None:
    loader: DataLoader[Any] = DataLoader(batches(2), batch_size=4, drop_last=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as info:
        make_trainer().run(loader)
    says(info, "is empty: len() is 0", "drop_last=True")


def test_loader_shorter_than_train_len() -> None:
    with pytest.raises(ConfigurationError) as info:
        make_trainer().run(batches(2), train_len=4)
    says(info, "ran out after 2 batches but the epoch length is 4", "pass the real train_len")


def test_metric_returns_non_dict() -> None:
    def accuracy(batch: Any, outputs: Any) -> Any:
        return 0.5

    evaluator = ppe.engine.create_evaluator(model_on_cpu(), metrics=[accuracy])
    with pytest.raises(ArgumentTypeError) as info:
        evaluator.run(batches())
    says(info, "accuracy returned float 0.5", "must return a dict", "{'accuracy': acc}")


def test_metrics_not_a_list() -> None:
    def accuracy(batch: Any, outputs: Any) -> Any:
        return {"accuracy": 0.5}

    with pytest.raises(ArgumentTypeError) as info:
        ppe.engine.create_evaluator(model_on_cpu(), metrics=accuracy)  # type: ignore[arg-type]
    says(info, "metrics must be a list of callables", "metrics=[metric]")


def test_distributed_evaluator_without_process_group() -> None:
    from ppe_core.errors import DistributedNotInitializedError

    with pytest.raises(DistributedNotInitializedError) as info:
        ppe.engine.create_evaluator(model_on_cpu(), distributed=True)
    assert isinstance(info.value, RuntimeError)
    says(info, "torch.distributed to be initialised", "init_process_group()")


def test_world_size_without_master_addr(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppe_core.distributed import DistributedEnvironmentError

    for name in ("MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(DistributedEnvironmentError) as info:
        ppe.distributed.init_from_env("cpu")
    assert isinstance(info.value, ValueError)
    says(info, "MASTER_ADDR is not", "launch with torchrun")


def test_distributed_timeout_variable_not_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from ppe_core.distributed import DistributedEnvironmentError

    with socket.socket() as s:  # a reachable rank 0: the check must not depend on a hang
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    for name, value in {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PPE_DISTRIBUTED_TIMEOUT": "10m",
    }.items():
        monkeypatch.setenv(name, value)
    try:
        with pytest.raises(DistributedEnvironmentError) as info:
            ppe.distributed.init_from_env("cpu")
    finally:
        if torch.distributed.is_initialized():  # the variable was ignored: a group was made
            torch.distributed.destroy_process_group()
    assert isinstance(info.value, ValueError)
    says(info, "PPE_DISTRIBUTED_TIMEOUT='10m'", "positive number of seconds", "unset it")


# Reporting -----------------------------------------------------------------------------------
def test_report_unregistered_observer() -> None:
    reporter = ppe.reporting.Reporter()
    with reporter, pytest.raises(UnknownObserverError) as info:
        ppe.reporting.report({"loss": 1.0}, Regressor())
    says(info, "is not registered with this Reporter", "reporter.add_observer(name, observer)")


def test_summary_mean_of_nothing() -> None:
    with pytest.raises(EmptySummaryError) as info:
        ppe.reporting.Summary().compute_mean()
    says(info, "the summary is empty", "add() values before computing a mean")


def test_summary_add_non_number() -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ppe.reporting.Summary().add("n/a")  # type: ignore[arg-type]
    says(info, "takes a number or a one-element tensor", "got str 'n/a'", "summary.add(loss)")


# Snapshots -----------------------------------------------------------------------------------
def trained_state() -> dict[str, Any]:
    trainer = make_trainer()
    trainer.run(batches())
    state: dict[str, Any] = trainer.state_dict()
    return state


def test_snapshot_from_other_model() -> None:
    state = trained_state()
    trainer = make_trainer(OtherNet())
    trainer.load_state_dict(state)
    with pytest.raises(StateDictMismatchError) as info:
        trainer.run(batches())
    says(info, "state of model 'main' does not fit OtherNet")
    says(info, "missing keys (in the model, not in the state): ['body.weight', 'body.bias']")
    says(info, "unexpected keys (in the state, not in the model): ['fc.weight', 'fc.bias']")
    says(info, "same architecture", "strict=False")


def test_snapshot_shape_mismatch() -> None:
    state = trained_state()
    model = Regressor(features=3)
    with pytest.raises(StateDictMismatchError) as info:
        manager_for(model).load_state_dict(state)
    says(info, "does not fit Regressor", "size mismatch for fc.weight", "same architecture")


def test_snapshot_from_data_parallel() -> None:
    state = trained_state()
    state["models"]["main"] = {f"module.{k}": v for k, v in state["models"]["main"].items()}
    with pytest.raises(StateDictMismatchError) as info:
        manager_for(Regressor()).load_state_dict(state)
    says(info, "'module.fc.weight'", "DataParallel", "default_transform_model")


def test_snapshot_optimizer_of_other_type() -> None:
    state = trained_state()
    model = Regressor()
    manager = ppe.training.ExtensionsManager(
        model, torch.optim.Adam(model.parameters()), 1, iters_per_epoch=1
    )
    with pytest.raises(StateDictMismatchError) as info:
        manager.load_state_dict(state)
    says(info, "optimizer 'main' (Adam) lacks the hyperparameters ['betas', 'eps']")
    says(info, "different optimizer type", "Create optimizer 'main' as when the snapshot")


def test_snapshot_optimizer_param_groups_differ() -> None:
    state = trained_state()
    model = Regressor()
    optimizer = torch.optim.SGD([model.fc.weight], lr=0.1)
    manager = ppe.training.ExtensionsManager(model, optimizer, 1, iters_per_epoch=1)
    with pytest.raises(StateDictMismatchError) as info:
        manager.load_state_dict(state)
    says(info, "optimizer 'main' (SGD) does not fit", "the same parameters in the same groups")


def test_model_state_dict_loaded_into_trainer() -> None:
    trainer = make_trainer()
    trainer.load_state_dict(Regressor().state_dict())
    with pytest.raises(StateDictKeyError) as info:
        trainer.run(batches())
    says(info, "the state has no 'models' mapping", "trainer.state_dict()", "model.load_state_dict")


def test_snapshot_lacks_a_model() -> None:
    state = trained_state()
    a = model_on_cpu()
    trainer = ppe.engine.create_trainer({"main": a, "aux": model_on_cpu()}, {"main": sgd(a)}, 1)
    trainer.load_state_dict(state)
    with pytest.raises(StateDictKeyError) as info:
        trainer.run(batches())
    says(info, "the state's 'models' lacks ['aux']", "names they were saved with")


def test_snapshot_filename_template_with_missing_attribute(tmp_path: Path) -> None:
    model = model_on_cpu()
    steps: list[int] = []
    trainer = ppe.engine.create_trainer(
        model,
        sgd(model),
        3,
        out_dir=str(tmp_path),
        extensions=[
            E.snapshot(filename="snap_{.nonexistent}"),
            ppe.training.make_extension(trigger=(1, "iteration"))(
                lambda manager: steps.append(manager.iteration)
            ),
        ],
    )
    with pytest.raises(ConfigurationError) as info:
        trainer.run(batches())
    says(info, "'snap_{.nonexistent}'", "nonexistent", "'{.iteration}'")
    assert steps == []  # found before the first step, not after the first epoch


def test_out_dir_is_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "results"
    path.write_text("not a directory")
    model = model_on_cpu()
    with pytest.raises(ConfigurationError) as info:
        manager_for(model, out_dir=str(path))
    says(info, repr(str(path)), "existing file", "Pass a directory path")
    own_writer = ppe.writing.SimpleWriter(out_dir=str(path / "snapshots"))
    trainer = ppe.engine.create_trainer(
        model, sgd(model), 1, out_dir=str(tmp_path), extensions=[E.snapshot(writer=own_writer)]
    )
    with pytest.raises(ConfigurationError) as info:
        trainer.run(batches())
    says(info, repr(str(path / "snapshots")), "existing file")


def test_disk_full_while_snapshotting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ENOSPC faked at the OS boundary (fsync is where network and some local file systems
    # report it); tests/test_snapshot_leftovers.py fills a real tmpfs.
    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    model = model_on_cpu()
    trainer = ppe.engine.create_trainer(
        model,
        sgd(model),
        1,
        out_dir=str(tmp_path),
        extensions=[ppe.training.ExtensionEntry(E.snapshot(), trigger=(2, "iteration"))],
    )
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError) as info:
        trainer.run(batches())
    assert type(info.value).__name__ == "DiskFullError"
    says(info, "[Errno 28] no space left", "'snapshot_iter_2'", "Free some space")
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert info.value.filename == str(tmp_path / "snapshot_iter_2")
    assert not list(tmp_path.glob(".*.tmp"))  # the partial file is gone


def test_snapshot_of_a_state_holding_an_enum() -> None:
    import enum

    class Phase(enum.Enum):
        WARMUP = 1

    class Scheduler(ppe.training.Extension):
        def __call__(self, manager: Any) -> None:
            pass

        def state_dict(self) -> dict[str, Any]:
            return {"phase": Phase.WARMUP}

    trainer = make_trainer()
    trainer.extend(Scheduler())
    trainer.extend(ppe.training.extensions.snapshot(), trigger=(1, "iteration"))
    with pytest.raises(TypeError) as info:  # SnapshotStateError, a SnapshotError too
        trainer.run(batches())
    says(info, "extension 'Scheduler' (at ['phase']", "Phase", "weights_only=True")
    says(info, "Save its value (Phase.WARMUP.value)", "add_safe_globals([Phase])")


# Output directories and resuming -------------------------------------------------------------
_HOLD_OUT_DIR = """
import sys, torch, ppe_core as ppe
model = torch.nn.Linear(2, 1)
manager = ppe.training.ExtensionsManager(
    model, {}, 1, iters_per_epoch=1, out_dir=sys.argv[1],
    extensions=[ppe.training.extensions.LogReport()],
)
manager.start_extensions()
print("started", flush=True)
sys.stdin.read()
"""


def test_out_dir_in_use_by_another_process(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ppe_core.errors import OutputDirectoryInUseError

    other = subprocess.Popen(
        [sys.executable, "-c", _HOLD_OUT_DIR, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "started\n"
        with pytest.raises(OutputDirectoryInUseError) as info:
            make_trainer(out_dir=str(tmp_path), extensions=[E.LogReport()]).run(batches())
    finally:
        other.communicate("", timeout=60)
    says(
        info,
        os.path.realpath(tmp_path),
        f"pid {other.pid} on host",
        "in use by another training run",
    )
    says(info, "Wait for that run to finish", "pass another out_dir", "delete")


def test_stale_run_lock_file(tmp_path: Path) -> None:
    from ppe_core.errors import RunLockWarning

    (tmp_path / ".ppe_core_run.lock").write_text('{"pid": 999999999, "host": "gone"}')
    trainer = make_trainer(out_dir=str(tmp_path), extensions=[E.LogReport()])
    with pytest.warns(RunLockWarning, match="taking over .* pid 999999999 on host 'gone'"):
        trainer.run(batches())


def test_resume_with_another_epoch_length() -> None:
    from ppe_core.errors import EpochLengthChangedWarning

    state = trained_state()  # 4 iterations per epoch
    trainer = make_trainer(max_epochs=2)
    trainer.load_state_dict(state)
    with pytest.warns(EpochLengthChangedWarning) as record:
        trainer.run(batches(2))
    message = str(record[0].message)
    assert "saved with 4 iterations per epoch, but this run has 2" in message
    assert "same dataset and batch size" in message


# The catalogue -----------------------------------------------------------------------------
def test_catalogue_documents_every_case() -> None:
    """docs/errors.md has one row per test above, and names no test that does not exist."""
    doc = (Path(__file__).parent.parent / "docs" / "errors.md").read_text(encoding="utf-8")
    rows = [line for line in doc.splitlines() if line.startswith("|") and "`test_" in line]
    documented = [re.findall(r"`(test_\w+)`", row)[-1] for row in rows]
    cases = sorted(
        name
        for name, value in globals().items()
        if name.startswith("test_")
        and callable(value)
        and name != "test_catalogue_documents_every_case"
    )
    assert len(documented) == len(set(documented)), "a test is documented twice"
    assert sorted(documented) == cases
    assert len(cases) >= 30
