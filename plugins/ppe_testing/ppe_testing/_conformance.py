"""The runtime conformance kit: checks a runtime author runs against their own runtime.

Each check builds a tiny model and batches on the CPU, drives the runtime the way ppe-core does
(``ppe.to``, ``create_trainer``, ``create_evaluator``, snapshots) and compares what it sees with
the contract of :class:`~ppe_core.runtime.BaseRuntime` and with the same work done by the
reference CPU runtime. A failure raises :class:`ConformanceError` whose message says what the
runtime did wrong and what to change, in runtime-author terms.

pytest is not imported here: the base class :class:`RuntimeConformance` only needs pytest to
collect it (``tmp_path`` is requested by argument name) and to skip a check.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import torch

import ppe_core
from ppe_core.errors import ConformanceError, RuntimeOptionError
from ppe_core.runtime import BaseRuntime, PyTorchRuntime, RuntimeOptions, device_type_of
from ppe_core.testing import plugin_host
from ppe_testing._emulated import EMULATED_DEVICE, enable_emulated_device

__all__ = [
    "CHECKS",
    "CheckResult",
    "ConformanceError",
    "Pair",
    "RuntimeConformance",
    "RuntimeTarget",
    "check_callback_order",
    "check_convert_batch",
    "check_eval_no_grad",
    "check_grad_scaler_state",
    "check_module_move",
    "check_options_validation",
    "check_snapshot_resume",
    "check_state_dict_round_trip",
    "check_step_hooks",
    "check_tagging",
    "check_tensor_move",
    "check_training_matches_reference",
    "run_checks",
]

#: The option name the options check passes; no runtime should understand it.
UNKNOWN_OPTION = "ppe_conformance_unknown_option"

#: Training schedule of the checks: epochs x iterations per epoch, and evaluation batches.
_EPOCHS = 2
_ITERS = 3
_VAL_BATCHES = 2


@dataclass(frozen=True)
class RuntimeTarget:
    """The runtime under test and how to judge it.

    Args:
        device: The device string users pass to ``ppe.to`` / ``create_trainer``, e.g.
            ``"mydev:0"``.
        runtime_class: The runtime class; ``None``: the class the plugins (or the active plugin
            host, i.e. installed entry points) register for the device type.
        options: Runtime options used for every check (``ppe.to(options=...)`` and
            ``runtime_options``).
        tensor_device: The torch device moved tensors must report, when it differs from
            ``device`` (a simulated device that keeps data in host memory: ``"cpu"``).
        plugins: Plugin objects, or importable module names, that register the runtime.
        atol: Absolute tolerance against the CPU reference (default 1e-5, for float32 math).
        rtol: Relative tolerance against the CPU reference (default 1e-4). Raise both for a
            runtime that computes in lower precision (autocast options).
    """

    device: str
    runtime_class: type[BaseRuntime] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    tensor_device: str | None = None
    plugins: Sequence[object] = ()
    atol: float = 1e-5
    rtol: float = 1e-4

    def resolve(self) -> type[BaseRuntime]:
        """The runtime class under test (looked up once per check)."""
        if self.runtime_class is not None:
            if not (
                isinstance(self.runtime_class, type) and issubclass(self.runtime_class, BaseRuntime)
            ):
                raise ConformanceError(
                    f"runtime_class must be a BaseRuntime subclass, got {self.runtime_class!r}; "
                    "set runtime_class = MyRuntime (the class, not an instance)"
                )
            return self.runtime_class
        from ppe_core.errors import RegistryLookupError
        from ppe_core.plugins import get_plugin_host

        try:
            if self.plugins:
                with plugin_host(*_load_plugins(self.plugins)) as host:
                    return host.runtimes.get_runtime_class_for_device_spec(self.device)
            return get_plugin_host().runtimes.get_runtime_class_for_device_spec(self.device)
        except RegistryLookupError as exc:
            raise ConformanceError(
                f"no runtime is registered for device {self.device!r}: {exc}\nInstall your "
                "plugin (pip install -e .) so its ppe_core entry point registers the runtime, "
                "or set runtime_class = MyRuntime or plugins = ['my_package.plugin'] on the "
                "conformance test class."
            ) from exc

    def expected_device(self) -> torch.device:
        """The torch device a moved tensor must be on."""
        spec = self.tensor_device if self.tensor_device is not None else self.device
        if device_type_of(spec) == EMULATED_DEVICE:
            enable_emulated_device()  # a runtime may create it only when first constructed
        try:
            return torch.device(spec)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ConformanceError(
                f"device {self.device!r} is not a device type PyTorch knows, so the kit cannot "
                "tell where moved tensors should be; set tensor_device to the torch device your "
                "runtime's tensors report (e.g. tensor_device = 'cpu' for a simulated device "
                "that keeps data in host memory)"
            ) from exc


class CheckResult(NamedTuple):
    """The outcome of one check run by :func:`run_checks`."""

    name: str
    passed: bool
    message: str


# Test material -------------------------------------------------------------------------------
class Pair(NamedTuple):
    """A namedtuple inside batches (runtimes often forget to rebuild these)."""

    first: Any
    second: Any


class _Net(torch.nn.Module):
    """Linear-BatchNorm-Tanh-(Dropout)-Linear with a buffer; records what each forward saw."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 8),
            torch.nn.BatchNorm1d(8),
            torch.nn.Tanh(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(8, 2),
        )
        self.register_buffer("scale", torch.tensor(0.5))
        # Not state: lists the checks read after a run.
        self.losses: list[torch.Tensor] = []
        self.seen: list[tuple[bool, bool, torch.device]] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append((self.training, torch.is_grad_enabled(), x.device))
        out = self.body(x) * self.scale
        loss = torch.nn.functional.mse_loss(out, t)
        self.losses.append(loss.detach())
        return {"loss": loss}


def _batches(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        {"x": torch.randn(8, 4, generator=gen), "t": torch.randn(8, 2, generator=gen)}
        for _ in range(count)
    ]


def _nested_batches() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)

    def f(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    def i64() -> torch.Tensor:
        return torch.randint(0, 10, (3,), generator=gen)

    return {
        "a dict batch": {
            "x": f(2, 3),
            "pair": Pair(f(2), i64()),
            "items": [f(3), (f(1, 2), torch.tensor([True, False]))],
            "nested": {"deep": {"z": f(2, 2)}},
            "name": "sample-0",
            "count": 3,
        },
        "a list batch": [f(2), {"label": i64()}],
        "a tuple batch": (f(2, 2), [f(1)]),
        "a namedtuple batch": Pair(f(2), {"mask": torch.ones(2, dtype=torch.bool)}),
        "a bare tensor batch": f(4),
    }


class _RegisterRuntime:
    """An inline plugin registering one runtime class for one device type."""

    def __init__(self, device_type: str, runtime_class: type[BaseRuntime]) -> None:
        self.device_type = device_type
        self.runtime_class = runtime_class

    @ppe_core.hookimpl
    def ppe_register_runtimes(self, registry: Any) -> None:
        registry.register(self.device_type, self.runtime_class)


def _load_plugins(plugins: Sequence[object]) -> list[object]:
    return [importlib.import_module(p) if isinstance(p, str) else p for p in plugins]


@contextlib.contextmanager
def _host_with(device: str, runtime_class: type[BaseRuntime]) -> Iterator[None]:
    """A fresh plugin host (built-ins + ``runtime_class`` for ``device``'s type) for one run."""
    with plugin_host(_RegisterRuntime(device_type_of(device), runtime_class)):
        yield


@contextlib.contextmanager
def _doing(what: str) -> Iterator[None]:
    """Turn an unexpected exception into a ConformanceError saying what the kit was doing."""
    try:
        yield
    except ConformanceError:
        raise
    except Exception as exc:
        hint = ""
        if "Expected all tensors to be on the same device" in str(exc):
            # The words of a real device (and of the emulated one) on a tensor left behind.
            hint = (
                "\nA tensor was left on another device: move_module must move every parameter "
                "and buffer, convert_batch/move_tensor every batch tensor (namedtuple fields "
                "too), and optimizer state must stay on the parameters' device (after a "
                "snapshot or state_dict load too)."
            )
        raise ConformanceError(f"{what} raised {type(exc).__name__}: {exc}{hint}") from exc


# Comparisons ---------------------------------------------------------------------------------
def _same_device(actual: torch.device, expected: torch.device) -> bool:
    if actual.type != expected.type:
        return False
    index: int | None = expected.index  # None for "cuda" (torch's stubs say int)
    if index is None or actual.type == "cpu":
        return True
    return actual.index == index


def _describe_device(expected: torch.device) -> str:
    index: int | None = expected.index
    if index is None and expected.type not in ("cpu", "meta"):
        return f"{expected.type} (any index)"
    return str(expected)


def _comparable(tensor: torch.Tensor) -> bool:
    return tensor.device.type != "meta"


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.detach().to("cpu").double() - expected.detach().to("cpu").double()).abs()
    return float(diff.max()) if diff.numel() else 0.0


def _close(actual: torch.Tensor, expected: torch.Tensor, target: RuntimeTarget) -> bool:
    return torch.allclose(
        actual.detach().to("cpu").double(),
        expected.detach().to("cpu").double(),
        atol=target.atol,
        rtol=target.rtol,
    )


# Checks --------------------------------------------------------------------------------------
def check_module_move(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """``move_module`` returns the module with every parameter and buffer on the device.

    Values, dtypes and ``requires_grad`` must be kept.
    """
    cls, expected = target.resolve(), target.expected_device()
    torch.manual_seed(0)
    model = _Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with _doing(f"{cls.__name__}({target.device!r}, options={dict(target.options)!r})"):
        runtime = cls(target.device, target.options)
    with _doing(f"{cls.__name__}.move_module(model)"):
        moved = runtime.move_module(model)
    if not isinstance(moved, torch.nn.Module):
        raise ConformanceError(
            f"{cls.__name__}.move_module returned {type(moved).__name__}, not the module; "
            "return the moved module (e.g. `return module.to(self.device)`)"
        )
    for kind, named in (("parameter", moved.named_parameters()), ("buffer", moved.named_buffers())):
        for name, tensor in named:
            if not _same_device(tensor.device, expected):
                raise ConformanceError(
                    f"move_module left {kind} {name!r} on {tensor.device}; expected "
                    f"{_describe_device(expected)} -- move every parameter AND buffer "
                    "(module.to(device) does both; BatchNorm running stats are buffers)"
                )
            if tensor.dtype != before[name].dtype:
                raise ConformanceError(
                    f"move_module changed the dtype of {kind} {name!r} from "
                    f"{before[name].dtype} to {tensor.dtype}; keep dtypes (cast only when the "
                    "user asks, through an option)"
                )
            if _comparable(tensor) and not torch.equal(tensor.detach().to("cpu"), before[name]):
                raise ConformanceError(
                    f"move_module changed the values of {kind} {name!r} (max difference "
                    f"{_max_error(tensor, before[name]):.3g}); a move must copy values exactly"
                )
    for name, param in moved.named_parameters():
        if not param.requires_grad:
            raise ConformanceError(
                f"after move_module, parameter {name!r} no longer requires grad; keep "
                "parameters trainable (move the module, do not detach its parameters)"
            )


def _tensor_cases() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(3, 4, generator=gen)
    return {
        "a float32 tensor": base,
        "an int64 tensor": torch.arange(6).reshape(2, 3),
        "a bool tensor": torch.tensor([True, False, True]),
        "a 0-d tensor": torch.tensor(2.5),
        "an empty tensor": torch.empty(0, 3),
        "a non-contiguous tensor": base.t(),
        "a float64 tensor": torch.randn(2, generator=gen, dtype=torch.float64),
    }


def check_tensor_move(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """``move_tensor`` (and ``ppe.to(tensor, device)``) put tensors of every kind on the device.

    Shape, dtype and values must be kept.
    """
    cls, expected = target.resolve(), target.expected_device()
    runtime = cls(target.device, target.options)
    for what, tensor in _tensor_cases().items():
        with _doing(f"{cls.__name__}.move_tensor({what})"):
            moved = runtime.move_tensor(tensor)
        _check_moved_leaf(moved, tensor, f"move_tensor({what})", expected, "move_tensor")
    with _host_with(target.device, cls), _doing(f"ppe.to(tensor, {target.device!r})"):
        moved = ppe_core.to(torch.ones(2), target.device, options=target.options)
    _check_moved_leaf(
        moved, torch.ones(2), f"ppe.to(tensor, {target.device!r})", expected, "move_tensor"
    )


def _check_moved_leaf(
    moved: Any, original: torch.Tensor, where: str, expected: torch.device, method: str
) -> None:
    if not isinstance(moved, torch.Tensor):
        raise ConformanceError(
            f"{where} returned {type(moved).__name__}, not a tensor; {method} must return the "
            "tensor on the device"
        )
    if not _same_device(moved.device, expected):
        raise ConformanceError(
            f"{where} left the tensor on {moved.device}; expected {_describe_device(expected)}"
        )
    if moved.shape != original.shape or moved.dtype != original.dtype:
        raise ConformanceError(
            f"{where} changed the tensor from {original.dtype}{list(original.shape)} to "
            f"{moved.dtype}{list(moved.shape)}; keep shape and dtype"
        )
    if _comparable(moved) and not torch.equal(moved.to("cpu"), original):
        raise ConformanceError(f"{where} changed the tensor's values; a move must copy exactly")


_KIND_HINT = {
    "a dict value": "move every tensor inside dicts (and keep dict subclasses)",
    "a list item": "move every tensor inside lists",
    "a tuple item": "move every tensor inside tuples and rebuild the tuple",
    "a namedtuple field": (
        "move every tensor inside namedtuples and rebuild them with type(batch)(*fields)"
    ),
    "the batch": "move a batch that is a bare tensor",
}


def _compare_batch(
    got: Any, original: Any, path: str, kind: str, expected: torch.device, what: str
) -> None:
    """Walk ``original`` and ``got`` together; raise at the first wrong leaf or container."""
    hint = _KIND_HINT[kind]
    if isinstance(original, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise ConformanceError(
                f"convert_batch replaced the tensor at {path} ({kind}) in {what} with "
                f"{type(got).__name__}; return tensors as tensors"
            )
        if not _same_device(got.device, expected):
            raise ConformanceError(
                f"convert_batch left tensor at {path} ({kind}) in {what} on {got.device}; "
                f"expected {_describe_device(expected)} -- {hint}"
            )
        if got.dtype != original.dtype or got.shape != original.shape:
            raise ConformanceError(
                f"convert_batch changed the tensor at {path} ({kind}) in {what} from "
                f"{original.dtype}{list(original.shape)} to {got.dtype}{list(got.shape)}; keep "
                "shape and dtype"
            )
        if _comparable(got) and not torch.equal(got.to("cpu"), original):
            raise ConformanceError(
                f"convert_batch changed the values of the tensor at {path} ({kind}) in {what}"
            )
        return
    if type(got) is not type(original):
        where = f"for {what}" if path == "batch" else f"at {path} in {what}"
        raise ConformanceError(
            f"convert_batch returned {type(got).__name__} {where}, which was "
            f"{type(original).__name__}; keep container types (a model may rely on them: "
            "namedtuple fields, tuple vs list)"
        )
    if isinstance(original, Mapping):
        if list(got) != list(original):
            raise ConformanceError(
                f"convert_batch changed the keys at {path} in {what} from {list(original)} to "
                f"{list(got)}; keep every key, in order"
            )
        for key, value in original.items():
            _compare_batch(got[key], value, f"{path}[{key!r}]", "a dict value", expected, what)
    elif isinstance(original, tuple) and hasattr(original, "_fields"):
        for name in original._fields:
            _compare_batch(
                getattr(got, name),
                getattr(original, name),
                f"{path}.{name}",
                "a namedtuple field",
                expected,
                what,
            )
    elif isinstance(original, (list, tuple)):
        item_kind = "a list item" if isinstance(original, list) else "a tuple item"
        if len(got) != len(original):
            raise ConformanceError(
                f"convert_batch changed the length of the {type(original).__name__} at {path} "
                f"in {what} from {len(original)} to {len(got)}"
            )
        for i, (g, o) in enumerate(zip(got, original, strict=True)):
            _compare_batch(g, o, f"{path}[{i}]", item_kind, expected, what)
    elif got != original:
        raise ConformanceError(
            f"convert_batch changed the non-tensor value at {path} in {what} from "
            f"{original!r} to {got!r}; pass values that are not tensors through unchanged"
        )


def check_convert_batch(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """``convert_batch`` moves every tensor of nested batches and keeps their structure.

    Batches: dicts, lists, tuples, namedtuples, nested in each other, with non-tensor values
    and a bare tensor. Every tensor must land on the device with shape, dtype and values kept;
    every container keeps its type and keys; other values pass through unchanged.
    """
    cls, expected = target.resolve(), target.expected_device()
    runtime = cls(target.device, target.options)
    for what, batch in _nested_batches().items():
        with _doing(f"{cls.__name__}.convert_batch({what})"):
            got = runtime.convert_batch(batch)
        _compare_batch(got, batch, "batch", "the batch", expected, what)


def check_tagging(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """``ppe.to`` tags the moved module and its submodules with one runtime of the class.

    ``get_runtime`` and ``named_runtime_modules`` must find it, with the runtime's
    ``device_spec`` as given.
    """
    from ppe_core.runtime import get_runtime, named_runtime_modules

    cls = target.resolve()
    wrapper = torch.nn.Module()
    wrapper.inner = _Net()
    with _host_with(target.device, cls), _doing(f"ppe.to(module, {target.device!r})"):
        moved = ppe_core.to(wrapper.inner, target.device, options=target.options)
    wrapper.inner = moved
    runtime = get_runtime(moved)
    if not isinstance(runtime, cls):
        raise ConformanceError(
            f"after ppe.to(module, {target.device!r}) the module is tagged with "
            f"{type(runtime).__name__}, expected {cls.__name__}; move_module must return a "
            "module ppe.to can tag (the moved module itself, or its replacement)"
        )
    if runtime.device_spec != target.device:
        raise ConformanceError(
            f"the runtime's device_spec is {runtime.device_spec!r}, expected {target.device!r}; "
            "call super().__init__(device_spec, options) in your runtime's __init__"
        )
    for name, sub in moved.named_modules():
        if get_runtime(sub) is not runtime:
            raise ConformanceError(
                f"submodule {name!r} is not tagged with the runtime; ppe.to tags every module "
                "returned by move_module, so return the module whose submodules are the moved ones"
            )
    found = list(named_runtime_modules(wrapper))
    if [(n, m) for n, m in found] != [("inner", moved)]:
        raise ConformanceError(
            f"named_runtime_modules(parent) found {[n for n, _ in found]}, expected ['inner']"
        )


def _train(
    device: str,
    options: Mapping[str, Any],
    *,
    epochs: int,
    out_dir: Path,
    seed: int = 0,
    dropout: float = 0.0,
    extensions: Sequence[Any] = (),
    evaluator: bool = False,
) -> tuple[_Net, Any]:
    torch.manual_seed(seed)
    net = _Net(dropout)
    model = ppe_core.to(net, device, options=options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kwargs: dict[str, Any] = {}
    if evaluator:
        kwargs["evaluator"] = ppe_core.engine.create_evaluator(
            model, device=device, runtime_options=options
        )
    trainer = ppe_core.engine.create_trainer(
        model,
        optimizer,
        epochs,
        device=device,
        runtime_options=options,
        out_dir=str(out_dir),
        extensions=list(extensions),
        **kwargs,
    )
    torch.manual_seed(seed + 100)  # the training run's RNG stream, equal across runs
    trainer.run(_batches(_ITERS, 1), _batches(_VAL_BATCHES, 2) if evaluator else None)
    return net, trainer


def _reference(
    workdir: Path, *, epochs: int = _EPOCHS, dropout: float = 0.0
) -> tuple[_Net, dict[str, torch.Tensor]]:
    with _host_with("cpu", PyTorchRuntime):
        net, _ = _train("cpu", {}, epochs=epochs, out_dir=workdir / "reference", dropout=dropout)
    return net, {k: v.clone() for k, v in net.state_dict().items()}


def _compare_states(
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    target: RuntimeTarget,
    what: str,
    hint: str,
) -> None:
    hint = f"; {hint}" if hint else ""
    for name, ref in want.items():
        value = got[name]
        if not _same_device(value.device, target.expected_device()):
            raise ConformanceError(
                f"{what}: {name!r} is on {value.device}, expected "
                f"{_describe_device(target.expected_device())}{hint}"
            )
        if ref.is_floating_point() and not _close(value, ref, target):
            raise ConformanceError(
                f"{what}: {name!r} differs by up to {_max_error(value, ref):.3g} "
                f"(atol={target.atol:g}, rtol={target.rtol:g}){hint}"
            )
        if not ref.is_floating_point() and not torch.equal(value.to("cpu"), ref.to("cpu")):
            raise ConformanceError(f"{what}: {name!r} is {value}, expected {ref}{hint}")


def check_training_matches_reference(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """A few ``create_trainer`` steps give the CPU reference runtime's losses and weights.

    The reference is :class:`~ppe_core.runtime.PyTorchRuntime` on ``"cpu"``, with the same
    model, seed, batches and SGD-with-momentum optimizer; values must agree within the
    target's ``atol``/``rtol``.
    """
    with _workdir(workdir) as work:
        cls, expected = target.resolve(), target.expected_device()
        ref_net, ref_state = _reference(work)
        with _host_with(target.device, cls), _doing(f"training on {target.device!r}"):
            net, _ = _train(target.device, target.options, epochs=_EPOCHS, out_dir=work / "run")
        steps = _EPOCHS * _ITERS
        if len(net.losses) != steps:
            raise ConformanceError(
                f"training {_EPOCHS} epochs of {_ITERS} batches ran forward {len(net.losses)} "
                f"times, expected {steps}; the runtime must not skip or repeat steps"
            )
        for training, _, device in net.seen:
            if not training:
                raise ConformanceError(
                    "the model ran a training step in eval mode; do not call module.eval() in "
                    "the train callbacks (train_pre_step, initialize_module, ...)"
                )
            if not _same_device(device, expected):
                raise ConformanceError(
                    f"during training the model received batches on {device}, expected "
                    f"{_describe_device(expected)}; convert_batch must move the trainer's "
                    "batches"
                )
        for step, (loss, ref) in enumerate(zip(net.losses, ref_net.losses, strict=True)):
            if not _close(loss, ref, target):
                where = "the first forward" if step == 0 else f"step {step}"
                cause = (
                    "the forward pass differs: check that move_module and convert_batch keep "
                    "values and dtypes, and that train_pre_step does not change the weights"
                    if step == 0
                    else "the update differs: check that the step hooks (train_pre_step, "
                    "train_post_step) do not change gradients, weights or the optimizer state "
                    "(the step_hooks check tells which)"
                )
                raise ConformanceError(
                    f"the loss at {where} on {target.device!r} is {float(loss):.6g}, the CPU "
                    f"reference's {float(ref):.6g} (atol={target.atol:g}, "
                    f"rtol={target.rtol:g}); {cause}. A runtime that computes in lower "
                    "precision should raise atol/rtol on its conformance class."
                )
        _compare_states(
            net.state_dict(),
            ref_state,
            target,
            f"after {steps} training steps on {target.device!r}, the weights differ from the "
            "CPU reference",
            "the optimizer step or the step hooks around it (train_pre_step, train_post_step) "
            "changed the result",
        )


def check_eval_no_grad(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """``create_evaluator(...).run`` runs the model in eval mode without recording gradients.

    The reported ``val/loss`` must match the CPU reference and no parameter may get a gradient.
    """
    cls = target.resolve()
    batches = _batches(_VAL_BATCHES, 2)

    def evaluate(device: str, options: Mapping[str, Any]) -> tuple[_Net, dict[str, Any]]:
        torch.manual_seed(0)
        net = _Net()
        model = ppe_core.to(net, device, options=options)
        model.train()  # the evaluator must switch to eval mode itself
        evaluator = ppe_core.engine.create_evaluator(model, device=device, runtime_options=options)
        return net, evaluator.run(batches)

    with _host_with("cpu", PyTorchRuntime):
        _, ref = evaluate("cpu", {})
    with _host_with(target.device, cls), _doing(f"evaluating on {target.device!r}"):
        net, result = evaluate(target.device, target.options)
    for batch_idx, (training, grad, _) in enumerate(net.seen):
        if grad:
            raise ConformanceError(
                f"during evaluation the model's forward ran with gradients enabled "
                f"(torch.is_grad_enabled() was True at eval batch {batch_idx}); the evaluator "
                "runs under torch.no_grad() -- do not re-enable grad in eval_pre_step, "
                "convert_batch or any other runtime callback"
            )
        if training:
            raise ConformanceError(
                f"during evaluation the model was in training mode at eval batch {batch_idx}; "
                "the evaluator calls model.eval() -- do not call module.train() in "
                "eval_pre_step or other runtime callbacks"
            )
    for name, param in net.named_parameters():
        if param.grad is not None:
            raise ConformanceError(
                f"evaluation left a gradient on parameter {name!r}; evaluation must not "
                "backpropagate"
            )
    loss = result.get("val/loss")
    if loss is None:
        raise ConformanceError(
            f"evaluation on {target.device!r} reported {sorted(result)}, without 'val/loss'"
        )
    loss_t = torch.as_tensor(loss, dtype=torch.float64)
    ref_t = torch.as_tensor(ref["val/loss"], dtype=torch.float64)
    if not _close(loss_t, ref_t, target):
        raise ConformanceError(
            f"val/loss on {target.device!r} is {float(loss_t):.6g}, the CPU reference's "
            f"{float(ref_t):.6g} (atol={target.atol:g}, rtol={target.rtol:g}); check that "
            "convert_batch keeps values and eval mode uses the running statistics"
        )


def check_state_dict_round_trip(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """A moved model's ``state_dict`` saves, loads back (on and off the device) unchanged.

    The runtime's :meth:`~ppe_core.runtime.BaseRuntime.rng_state` must load with
    ``torch.load(weights_only=True)`` and :meth:`set_rng_state` must restore it.
    """
    cls, expected = target.resolve(), target.expected_device()
    with _host_with(target.device, cls):
        torch.manual_seed(0)
        model = ppe_core.to(_Net(), target.device, options=target.options)
        state = model.state_dict()
        with _doing("torch.save(model.state_dict()) of a model on the device"):
            buffer = io.BytesIO()
            torch.save(state, buffer)
            buffer.seek(0)
            loaded = torch.load(buffer, map_location="cpu", weights_only=True)
        torch.manual_seed(1)  # different initial weights, overwritten by the load
        fresh = _Net()
        fresh.load_state_dict(loaded)
        fresh = ppe_core.to(fresh, target.device, options=target.options)
        if any(not _same_device(t.device, expected) for t in state.values()):
            raise ConformanceError(
                f"state_dict() of a module moved to {target.device!r} has tensors off the "
                "device; move parameters and buffers in place"
            )
        if _comparable(next(iter(state.values()))):
            _compare_states(
                fresh.state_dict(),
                {k: v.to("cpu") for k, v in state.items()},
                target,
                "a state_dict saved from the device and loaded into a new moved model",
                "move_module must keep values",
            )
        other = ppe_core.to(_Net(), target.device, options=target.options)
        with _doing("load_state_dict of a device state_dict into a model on the device"):
            other.load_state_dict(state)
        if _comparable(next(iter(state.values()))):
            _compare_states(
                other.state_dict(),
                {k: v.to("cpu") for k, v in state.items()},
                target,
                "load_state_dict device-to-device",
                "loading must keep values and devices",
            )
        runtime = cls(target.device, target.options)
        with _doing(f"{cls.__name__}.rng_state()"):
            rng = runtime.rng_state()
        buffer = io.BytesIO()
        torch.save(rng, buffer)
        buffer.seek(0)
        try:
            rng_loaded = torch.load(buffer, weights_only=True)
        except Exception as exc:
            why = str(exc).splitlines()[0]
            raise ConformanceError(
                f"{cls.__name__}.rng_state() returned {type(rng).__name__}, which "
                f"torch.load(weights_only=True) cannot load ({why}); return tensors and plain "
                "types only, snapshots are loaded that way"
            ) from exc
        with _doing(f"{cls.__name__}.set_rng_state(rng_state())"):
            runtime.set_rng_state(rng_loaded)
        if rng is not None and expected.type not in ("cpu", "meta"):
            first = torch.rand(4, device=expected)
            runtime.set_rng_state(rng_loaded)
            again = torch.rand(4, device=expected)
            if not torch.equal(first.to("cpu"), again.to("cpu")):
                raise ConformanceError(
                    f"set_rng_state(rng_state()) did not restore the random stream of "
                    f"{expected}: torch.rand after restoring gave other numbers; restore the "
                    "device generator's state exactly"
                )


def _resume_differs(
    target: RuntimeTarget, cls: type[BaseRuntime], work: Path, dropout: float
) -> str:
    """Train 4 epochs straight and 2 + 2 through a snapshot; '' if the weights agree, else why."""
    snapshot = ppe_core.training.extensions.snapshot
    tag = f"dropout{dropout}"
    with _host_with(target.device, cls), _doing(f"snapshot and resume on {target.device!r}"):
        whole, _ = _train(
            target.device,
            target.options,
            epochs=2 * _EPOCHS,
            dropout=dropout,
            out_dir=work / f"whole-{tag}",
        )
        _train(
            target.device,
            target.options,
            epochs=_EPOCHS,
            dropout=dropout,
            out_dir=work / f"resume-{tag}",
            extensions=[snapshot()],
        )
        resumed, _ = _train(
            target.device,
            target.options,
            epochs=2 * _EPOCHS,
            dropout=dropout,
            out_dir=work / f"resume-{tag}",
            extensions=[snapshot(autoload=True)],
            seed=1,  # other initial weights: the snapshot must overwrite them
        )
    if len(resumed.losses) != _EPOCHS * _ITERS:
        raise ConformanceError(
            f"the trainer with snapshot(autoload=True) ran {len(resumed.losses)} steps, "
            f"expected {_EPOCHS * _ITERS} after resuming at iteration {_EPOCHS * _ITERS}; the "
            f"snapshot written on {target.device!r} did not autoload"
        )
    try:
        _compare_states(
            resumed.state_dict(),
            {k: v.to("cpu") for k, v in whole.state_dict().items()},
            target,
            "after resuming from a snapshot"
            + (" (with dropout)" if dropout else "")
            + ", the weights differ from an uninterrupted run",
            "",
        )
    except ConformanceError as exc:
        return str(exc)
    return ""


def check_snapshot_resume(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """A snapshot written on the device autoloads in a new trainer that continues exactly.

    Two epochs with ``extensions.snapshot()``, then a new trainer (other initial weights) with
    ``snapshot(autoload=True)`` trains to four; its weights must equal an uninterrupted
    four-epoch run. The model uses dropout, so the device's random stream must resume too;
    when the weights differ, the run is repeated without dropout to tell the two causes apart.
    """
    with _workdir(workdir) as work:
        cls = target.resolve()
        differs = _resume_differs(target, cls, work, dropout=0.5)
        if not differs:
            return
        if _resume_differs(target, cls, work, dropout=0.0):
            raise ConformanceError(
                f"{differs}; the snapshot did not restore the model or optimizer state on the "
                "device (check move_module/move_tensor keep values and state_dict round-trips)"
            )
        raise ConformanceError(
            f"{differs}; the device's random stream did not resume (without dropout the runs "
            "agree): return the device generator's state from rng_state() and restore it in "
            "set_rng_state()"
        )


#: The grad scaler check's scaler: grows every step, so a lost or unused state shows.
_SCALER_INIT = 2.0**8


def _scaler(device_type: str) -> torch.amp.GradScaler:
    return torch.amp.GradScaler(device_type, init_scale=_SCALER_INIT, growth_interval=1)


def check_grad_scaler_state(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """A ``grad_scaler`` runtime option scales every step, and its state resumes from snapshots.

    Trains with a fresh ``torch.amp.GradScaler`` (growing every step) for four epochs, and for
    two plus two through a snapshot; both scalers must have grown, to the same state. A
    runtime whose ``accepted_options`` leave out ``grad_scaler`` passes (it offers none).
    """
    with _workdir(workdir) as work:
        cls, expected = target.resolve(), target.expected_device()
        accepted = cls.accepted_options
        if accepted is not None and "grad_scaler" not in accepted:
            return
        snapshot = ppe_core.training.extensions.snapshot
        scalers = {name: _scaler(expected.type) for name in ("whole", "first", "resumed")}

        def train(name: str, epochs: int, out: str, seed: int, ext: list[Any]) -> None:
            options = {**target.options, "grad_scaler": scalers[name]}
            _train(
                target.device, options, epochs=epochs, out_dir=work / out, seed=seed, extensions=ext
            )

        doing = f"training with a GradScaler on {target.device!r}"
        with _host_with(target.device, cls), _doing(doing):
            train("whole", 2 * _EPOCHS, "whole", 0, [])
            train("first", _EPOCHS, "resume", 0, [snapshot()])
            train("resumed", 2 * _EPOCHS, "resume", 1, [snapshot(autoload=True)])
        whole, resumed = scalers["whole"].state_dict(), scalers["resumed"].state_dict()
        if whole["scale"] == _SCALER_INIT:
            raise ConformanceError(
                "the grad_scaler option was never used: four epochs with a "
                "torch.amp.GradScaler(growth_interval=1) left its scale at the initial "
                f"{_SCALER_INIT:g} -- keep the scaler in runtime.options['grad_scaler'] (the "
                "DeviceRuntime/PyTorchRuntime grad_scaler setter does), where the handler "
                "offers it to the step and saves its state in snapshots"
            )
        if resumed != whole:
            raise ConformanceError(
                f"after resuming from a snapshot the GradScaler state is {resumed}, but an "
                f"uninterrupted run's is {whole} -- the scaler in runtime.options['grad_scaler'] "
                "is the one snapshots save and restore: use it for the whole run, do not "
                "replace or reset it (in initialize_module, train_epoch_begin, ...)"
            )


_CALLBACKS = (
    "initialize_module",
    "convert_batch",
    "train_epoch_begin",
    "train_pre_step",
    "train_post_step",
    "train_epoch_end",
    "train_validation_begin",
    "train_validation_end",
    "eval_pre_step",
    "eval_post_step",
    "train_cleanup",
)
_STEP_CALLBACKS = ("train_pre_step", "train_post_step", "eval_pre_step", "eval_post_step")


def _recording_class(cls: type[BaseRuntime], log: list[tuple[str, Any]]) -> type[BaseRuntime]:
    """A subclass of ``cls`` that logs each callback (name, batch index) and calls ``cls``'s."""

    depth = [0]  # nesting of convert_batch calls: a runtime may recurse through it

    def make(name: str) -> Callable[..., Any]:
        base = getattr(cls, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if name != "convert_batch":
                log.append((name, args[2] if name in _STEP_CALLBACKS else None))
                return base(self, *args, **kwargs)
            # A convert_batch that walks nested containers through self.convert_batch (the
            # tutorial's pattern) reaches this override again: only the outermost call is the
            # Handler's, the inner ones are the runtime's own recursion.
            if depth[0] == 0:
                log.append((name, None))
            depth[0] += 1
            try:
                return base(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        method.__name__ = name
        return method

    namespace: dict[str, Any] = {name: make(name) for name in _CALLBACKS}
    if "accepted_options" in cls.__dict__:  # keep the option validation of the class body
        namespace["accepted_options"] = cls.__dict__["accepted_options"]
    return type(f"Recording{cls.__name__}", (cls,), namespace)


def _expected_calls() -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    for _ in range(_EPOCHS):
        calls.append(("train_epoch_begin", None))
        for i in range(_ITERS):
            calls += [("train_pre_step", i), ("train_post_step", i)]
        calls.append(("train_validation_begin", None))
        for i in range(_VAL_BATCHES):
            calls += [("eval_pre_step", i), ("eval_post_step", i)]
        calls += [("train_validation_end", None), ("train_epoch_end", None)]
    calls.append(("train_cleanup", None))
    return calls


def _call_name(call: tuple[str, Any]) -> str:
    name, idx = call
    return f"{name}(batch_idx={idx})" if idx is not None else name


def check_callback_order(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """The runtime's callbacks are called in the documented order during a run.

    ``initialize_module`` before the first step; per epoch ``train_epoch_begin``, per batch
    ``train_pre_step``, ``convert_batch``, ``train_post_step``; the evaluator's
    ``train_validation_begin``, ``eval_pre_step``/``eval_post_step`` per batch,
    ``train_validation_end``; ``train_epoch_end``; ``train_cleanup`` once at the end. A recording
    subclass of the runtime observes the calls.
    """
    with _workdir(workdir) as work:
        log: list[tuple[str, Any]] = []
        recording = _recording_class(target.resolve(), log)
        with _host_with(target.device, recording), _doing(f"training on {target.device!r}"):
            _train(target.device, target.options, epochs=_EPOCHS, out_dir=work, evaluator=True)
        names = [name for name, _ in log]
        first_step = names.index("train_pre_step") if "train_pre_step" in names else len(names)
        if "initialize_module" not in names[:first_step]:
            raise ConformanceError(
                "initialize_module was not called before the first training step; it is "
                "called once per handler during setup -- if you override it, do not raise"
            )
        for position, name in enumerate(names):
            if name == "convert_batch":
                before = names[position - 1] if position else None
                after = names[position + 1] if position + 1 < len(names) else None
                pairs = {("train_pre_step", "train_post_step"), ("eval_pre_step", "eval_post_step")}
                if (before, after) not in pairs:
                    around = log[max(0, position - 2) : position + 3]
                    raise ConformanceError(
                        f"convert_batch was called between {before or 'the start'} and "
                        f"{after or 'the end'} (calls around it: "
                        f"{', '.join(_call_name(c) for c in around)}"
                        "); the Handler calls it once per step, after the pre-step callback and "
                        "before the post-step one -- do not call convert_batch from your own "
                        "callbacks"
                    )
        calls = [c for c in log if c[0] not in ("initialize_module", "convert_batch")]
        expected = _expected_calls()
        for i, (got, want) in enumerate(zip(calls, expected, strict=False)):
            if got != want:
                context = ", ".join(_call_name(c) for c in calls[max(0, i - 3) : i + 2])
                raise ConformanceError(
                    f"runtime callback #{i} was {_call_name(got)}, expected {_call_name(want)} "
                    f"(calls around it: {context}); ppe-core calls the callbacks in a fixed "
                    "order -- do not call them from each other or skip super() in a subclass"
                )
        if len(calls) != len(expected):
            raise ConformanceError(
                f"a {_EPOCHS}-epoch run with evaluation made {len(calls)} callback calls, "
                f"expected {len(expected)}; missing or extra at the end: "
                f"{[_call_name(c) for c in (calls[len(expected) :] or expected[len(calls) :])]}"
            )


#: Batches per optimizer step in the step_hooks check: gradients then live across steps, so a
#: pre-step hook that touches them changes the update (without accumulation zero_grad hides it).
_ACCUMULATION = 2


def _step_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Copies of what a step hook must not change: weights, buffers, gradients, optimizer."""
    state: dict[str, Any] = {}
    for name, param in module.named_parameters():
        state[f"parameter {name!r}"] = param.detach().to("cpu", copy=True)
        grad = param.grad
        state[f"the gradient of parameter {name!r}"] = (
            None if grad is None else grad.detach().to("cpu", copy=True)
        )
    for name, buffer in module.named_buffers():
        state[f"buffer {name!r}"] = buffer.detach().to("cpu", copy=True)
    optim = optimizer.state_dict()
    for index, entries in optim["state"].items():
        for key, value in entries.items():
            copied = value.detach().to("cpu", copy=True) if torch.is_tensor(value) else value
            state[f"the optimizer state {key!r} of parameter #{index}"] = copied
    for number, group in enumerate(optim["param_groups"]):
        for key, value in group.items():
            if key != "params":
                state[f"the optimizer's param_groups[{number}][{key!r}]"] = value
    return state


def _state_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    """The first entry that differs between two :func:`_step_state` copies, else ``None``."""
    for what in [*before, *(key for key in after if key not in before)]:
        old, new = before.get(what), after.get(what)
        if torch.is_tensor(old) and torch.is_tensor(new):
            same = (
                old.shape == new.shape
                and old.dtype == new.dtype
                and (not _comparable(old) or torch.equal(old, new))
            )
        else:
            same = torch.is_tensor(old) == torch.is_tensor(new) and old == new
        if not same:
            return what
    return None


def _guarded_class(
    cls: type[BaseRuntime], optimizers: list[torch.optim.Optimizer], found: list[str]
) -> type[BaseRuntime]:
    """A subclass of ``cls`` whose step hooks record in ``found`` what ``cls``'s hooks change."""

    def make(name: str) -> Callable[..., Any]:
        base = getattr(cls, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            module = args[1]
            if found or not optimizers:  # report the first change only
                return base(self, *args, **kwargs)
            before = _step_state(module, optimizers[0])
            result = base(self, *args, **kwargs)
            changed = _state_change(before, _step_state(module, optimizers[0]))
            if changed is not None:
                found.append(f"{name}(batch_idx={args[2]}) changed {changed}")
            return result

        method.__name__ = name
        return method

    namespace: dict[str, Any] = {name: make(name) for name in _STEP_CALLBACKS}
    if "accepted_options" in cls.__dict__:  # keep the option validation of the class body
        namespace["accepted_options"] = cls.__dict__["accepted_options"]
    return type(f"Guarded{cls.__name__}", (cls,), namespace)


def check_step_hooks(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """The step hooks leave weights, buffers, gradients and the optimizer state alone.

    ``train_pre_step``, ``train_post_step``, ``eval_pre_step`` and ``eval_post_step`` are
    compared before and after each call during a run with gradient accumulation
    (``options={"grad_accumulation_steps": 2}``), where gradients live across steps, and an
    evaluator. Those hooks are for device work around a step (synchronising, profiling),
    not for changing the training math.
    """
    with _workdir(workdir) as work:
        cls = target.resolve()
        optimizers: list[torch.optim.Optimizer] = []
        found: list[str] = []
        guarded = _guarded_class(cls, optimizers, found)
        with _host_with(target.device, guarded), _doing(f"training on {target.device!r}"):
            torch.manual_seed(0)
            model = ppe_core.to(_Net(), target.device, options=target.options)
            optimizers.append(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
            evaluator = ppe_core.engine.create_evaluator(
                model, device=target.device, runtime_options=target.options
            )
            trainer = ppe_core.engine.create_trainer(
                model,
                optimizers[0],
                _EPOCHS,
                device=target.device,
                runtime_options=target.options,
                options={"grad_accumulation_steps": _ACCUMULATION},
                out_dir=str(work),
                evaluator=evaluator,
            )
            trainer.run(_batches(_ITERS, 1), _batches(_VAL_BATCHES, 2))
        if found:
            raise ConformanceError(
                f"{cls.__name__}.{found[0]} (a run with gradient accumulation over "
                f"{_ACCUMULATION} batches, so gradients carry over between steps); the step "
                "hooks (train_pre_step, train_post_step, eval_pre_step, eval_post_step) must "
                "leave the weights, buffers, gradients and optimizer state alone -- do device "
                "work there (synchronise, profile), and change the training math in a Logic or "
                "an extension instead"
            )


def check_options_validation(target: RuntimeTarget, workdir: Path | None = None) -> None:
    """An unknown runtime option, or one of the wrong type, raises an error naming it.

    The unknown option is checked on the class and through ``ppe.to(options=...)``; each
    declared option is then given a value of the wrong type (see
    :func:`_check_option_types`). Declaring ``option_spec = RuntimeOptions(...)`` and validating
    with it before ``super().__init__`` does both, as the tutorial shows.
    """
    cls = target.resolve()
    options = {**target.options, UNKNOWN_OPTION: 1}
    fix = (
        f"declare accepted_options = frozenset({{...}}) in the body of {cls.__name__} "
        "(BaseRuntime then rejects other keys), or validate the options in __init__ and raise "
        "ppe_core.errors.ConfigurationError naming the option and the accepted ones"
    )
    attempts: list[tuple[str, Callable[[], Any]]] = [
        (f"{cls.__name__}({target.device!r}, options)", lambda: cls(target.device, options)),
        (
            f"ppe.to(module, {target.device!r}, options=...)",
            lambda: ppe_core.to(torch.nn.Linear(2, 2), target.device, options=options),
        ),
    ]
    for what, attempt in attempts:
        with _host_with(target.device, cls):
            try:
                attempt()
            except (ValueError, TypeError) as exc:
                if UNKNOWN_OPTION not in str(exc):
                    raise ConformanceError(
                        f"{what} with the unknown option {UNKNOWN_OPTION!r} raised "
                        f"{type(exc).__name__}, but the message does not name the option: "
                        f"{exc}; say which option is wrong and which are accepted"
                    ) from exc
                continue
            except Exception as exc:
                raise ConformanceError(
                    f"{what} with the unknown option {UNKNOWN_OPTION!r} raised "
                    f"{type(exc).__name__}: {exc}; raise a ValueError or TypeError (e.g. "
                    "ppe_core.errors.ConfigurationError), which users catch for bad options"
                ) from exc
        raise ConformanceError(
            f"{what} accepted the unknown option {UNKNOWN_OPTION!r} silently, so a typo in "
            f"runtime_options goes unnoticed; {fix}"
        )
    _check_option_types(target, cls)


class _NotAnOptionValue:
    """A value of a type no runtime option accepts."""

    def __repr__(self) -> str:
        return "<not an option value>"


def _option_spec(cls: type[BaseRuntime]) -> RuntimeOptions | None:
    spec = getattr(cls, "option_spec", None)
    return spec if isinstance(spec, RuntimeOptions) else None


def _check_option_types(target: RuntimeTarget, cls: type[BaseRuntime]) -> None:
    """Each declared option given a value of the wrong type raises an error naming it.

    The names come from the class's ``option_spec`` (a :class:`RuntimeOptions`), else from its
    ``accepted_options``. The wrong value is the string ``"2"`` (a value read from a config
    file or command line) unless the spec accepts strings, else an object of a private class.
    A runtime with an ``option_spec`` must raise the spec's own error
    (:class:`~ppe_core.errors.RuntimeOptionError`), i.e. validate before
    ``super().__init__``, where :class:`BaseRuntime` would reject unknown keys without saying
    which types the options take.
    """
    spec = _option_spec(cls)
    accepted = cls.accepted_options
    names = sorted(spec.names if spec is not None else accepted or ())
    fix = (
        f"declare option_spec = RuntimeOptions({cls.__name__!r}, OptionSpec(name, types, "
        "default, doc), ...) and accepted_options = option_spec.names in the class body, and "
        "call self.option_spec.validate(options) in __init__ before super().__init__ (see "
        "docs/plugin-tutorial.md)"
    )
    if spec is not None:
        try:
            cls(target.device, {**target.options, UNKNOWN_OPTION: 1})
        except RuntimeOptionError:
            pass
        except Exception as exc:
            raise ConformanceError(
                f"{cls.__name__} declares option_spec, but an unknown option raised "
                f"{type(exc).__name__} ({exc}) instead of the spec's RuntimeOptionError, which "
                "lists the accepted options and their types; call "
                "self.option_spec.validate(options) before super().__init__"
            ) from exc
    for name in names:
        option = spec.specs[name] if spec is not None else None
        wrong: Any = "2"
        if option is None or option.accepts_type(wrong):
            wrong = _NotAnOptionValue()
        given = f"{type(wrong).__name__} {wrong!r}"
        what = f"{cls.__name__}({target.device!r}, options={{{name!r}: {wrong!r}}})"
        try:
            cls(target.device, {**target.options, name: wrong})
        except (ValueError, TypeError) as exc:
            if name not in str(exc):
                raise ConformanceError(
                    f"{what} raised {type(exc).__name__}, but the message does not name the "
                    f"option: {exc}; say which option has the wrong type and which it takes"
                ) from exc
            continue
        except Exception as exc:
            raise ConformanceError(
                f"{what} raised {type(exc).__name__}: {exc}; raise a TypeError or ValueError "
                "(OptionSpec/RuntimeOptions raise RuntimeOptionTypeError, both) for an option "
                "of the wrong type"
            ) from exc
        raise ConformanceError(
            f"{what} accepted a {given} for option {name!r} silently, so a wrongly typed "
            f"runtime option (e.g. '2' for 2 from a config file) goes unnoticed; {fix}"
        )


@contextlib.contextmanager
def _workdir(workdir: Path | None) -> Iterator[Path]:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir
        return
    with tempfile.TemporaryDirectory(prefix="ppe-conformance-") as tmp:
        yield Path(tmp)


#: Every check by name, in the order :func:`run_checks` and the base class run them.
CHECKS: Mapping[str, Callable[[RuntimeTarget, Path | None], None]] = MappingProxyType(
    {
        "module_move": check_module_move,
        "tensor_move": check_tensor_move,
        "convert_batch": check_convert_batch,
        "tagging": check_tagging,
        "training_matches_reference": check_training_matches_reference,
        "eval_no_grad": check_eval_no_grad,
        "state_dict_round_trip": check_state_dict_round_trip,
        "snapshot_resume": check_snapshot_resume,
        "grad_scaler_state": check_grad_scaler_state,
        "callback_order": check_callback_order,
        "step_hooks": check_step_hooks,
        "options_validation": check_options_validation,
    }
)


def run_checks(
    target: RuntimeTarget,
    names: Sequence[str] | None = None,
    workdir: Path | None = None,
) -> list[CheckResult]:
    """Run checks without pytest (a script, a notebook, a CI step) and collect the outcomes.

    Args:
        target: The runtime under test.
        names: Check names (keys of :data:`CHECKS`); all by default.
        workdir: Where checks that train write; a temporary directory by default.

    Returns:
        One :class:`CheckResult` per check, in order; a failed check's message says what the
        runtime did wrong.

    Raises:
        ConformanceError: ``names`` holds a name that is not a check (also an AssertionError).
    """
    unknown = [n for n in names or () if n not in CHECKS]
    if unknown:
        raise ConformanceError(f"unknown check(s) {unknown}; the checks are {list(CHECKS)}")
    results = []
    with _workdir(workdir) as work:
        for name in names or list(CHECKS):
            try:
                with _doing(f"the {name} check"):
                    CHECKS[name](target, work / name)
            except ConformanceError as exc:
                results.append(CheckResult(name, False, str(exc)))
            else:
                results.append(CheckResult(name, True, ""))
    return results


class RuntimeConformance:
    """Base test class: subclass it as ``Test...`` and pytest runs every check on your runtime.

    Set the class attributes (they mirror :class:`RuntimeTarget`)::

        from ppe_testing import RuntimeConformance

        class TestMyRuntimeConformance(RuntimeConformance):
            device = "mydev:0"
            runtime_class = MyRuntime        # or plugins = ["my_device.plugin"], or neither
            tensor_device = "cpu"            # only for a device whose data lives in host memory
            atol, rtol = 1e-5, 1e-4          # the defaults, for float32 math

    A check listed in ``skip_checks`` is skipped with a reason naming the attribute.
    """

    device: ClassVar[str] = ""
    runtime_class: ClassVar[type[BaseRuntime] | None] = None
    options: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    tensor_device: ClassVar[str | None] = None
    plugins: ClassVar[Sequence[object]] = ()
    atol: ClassVar[float] = 1e-5
    rtol: ClassVar[float] = 1e-4
    skip_checks: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def conformance_target(cls) -> RuntimeTarget:
        """The :class:`RuntimeTarget` the class attributes describe."""
        if not cls.device:
            raise ConformanceError(
                f"{cls.__name__} does not say which device to test; set the class attribute "
                "device = 'mydev' (the string users pass to ppe.to)"
            )
        unknown = sorted(set(cls.skip_checks) - set(CHECKS))
        if unknown:
            raise ConformanceError(
                f"{cls.__name__}.skip_checks names unknown checks {unknown}; the checks are "
                f"{list(CHECKS)}"
            )
        return RuntimeTarget(
            device=cls.device,
            runtime_class=cls.runtime_class,
            options=dict(cls.options),
            tensor_device=cls.tensor_device,
            plugins=tuple(cls.plugins),
            atol=cls.atol,
            rtol=cls.rtol,
        )

    def _check(self, name: str, workdir: Path) -> None:
        target = self.conformance_target()
        if name in self.skip_checks:
            import pytest

            pytest.skip(f"{name} is listed in {type(self).__name__}.skip_checks")
        with _doing(f"the {name} check"):
            CHECKS[name](target, workdir)

    def test_module_move(self, tmp_path: Path) -> None:
        self._check("module_move", tmp_path)

    def test_tensor_move(self, tmp_path: Path) -> None:
        self._check("tensor_move", tmp_path)

    def test_convert_batch(self, tmp_path: Path) -> None:
        self._check("convert_batch", tmp_path)

    def test_tagging(self, tmp_path: Path) -> None:
        self._check("tagging", tmp_path)

    def test_training_matches_reference(self, tmp_path: Path) -> None:
        self._check("training_matches_reference", tmp_path)

    def test_eval_no_grad(self, tmp_path: Path) -> None:
        self._check("eval_no_grad", tmp_path)

    def test_state_dict_round_trip(self, tmp_path: Path) -> None:
        self._check("state_dict_round_trip", tmp_path)

    def test_snapshot_resume(self, tmp_path: Path) -> None:
        self._check("snapshot_resume", tmp_path)

    def test_grad_scaler_state(self, tmp_path: Path) -> None:
        self._check("grad_scaler_state", tmp_path)

    def test_callback_order(self, tmp_path: Path) -> None:
        self._check("callback_order", tmp_path)

    def test_step_hooks(self, tmp_path: Path) -> None:
        self._check("step_hooks", tmp_path)

    def test_options_validation(self, tmp_path: Path) -> None:
        self._check("options_validation", tmp_path)
