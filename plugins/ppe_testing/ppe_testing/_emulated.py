"""The emulated device: a PyTorch device type whose tensors keep their data in host memory.

:func:`enable_emulated_device` registers torch's ``PrivateUse1`` backend under a name
(``ppe_emu`` by default) from Python: a tensor on it is an :class:`EmulatedTensor`, a wrapper
that reports the emulated device and holds a CPU tensor; every operation runs on the CPU data,
so results are bit-equal to the CPU. What makes it worth having is what it refuses: an
operation that mixes it with a CPU tensor fails as on a real accelerator, so a runtime that
forgets to move a buffer, a batch field or optimizer state is caught on a machine without one.

It uses torch's experimental, private PrivateUse1 Python hooks, so it is opt-in, set up at most
once per process (torch renames PrivateUse1 only once) and guarded: where the hooks are missing,
:class:`EmulatedDeviceError` says so. Nothing changes for a process that never enables it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ppe_core.errors import EmulatedDeviceError
from ppe_core.runtime import DeviceLike, DeviceRuntime, RuntimeOptions

__all__ = [
    "EMULATED_DEVICE",
    "EmulatedDeviceError",
    "EmulatedDeviceRuntime",
    "EmulatedTensor",
    "emulated_device_type",
    "enable_emulated_device",
]

#: The default name of the emulated device type.
EMULATED_DEVICE = "ppe_emu"

#: The oldest torch the emulation is tested with: the PrivateUse1 Python hooks it uses are
#: private and experimental, so older versions are refused rather than half-working.
_MIN_TORCH = (2, 13)

_aten = torch.ops.aten
_lock = threading.Lock()
_state: dict[str, Any] = {"name": None, "count": 1, "library": None, "failed": ""}

# torch's autograd engine runs a device's backward on a worker thread of its own, whose
# intra-op thread count is fixed at its first parallel kernel; torch.set_num_threads later
# changes only the calling thread. CPU backward runs on the calling thread, so a worker left
# at the old count would sum gradients in another order than the CPU does. Every emulated op
# therefore runs with the main thread's count, recorded at its last op.
_MAIN_THREAD = threading.main_thread().ident
_threads = [torch.get_num_threads()]

# Ops that copy between devices: the one place a CPU tensor may meet an emulated one.
_COPY_OPS = frozenset(
    {_aten.copy_.default, _aten._to_copy.default, _aten._copy_from.default}
    | {_aten._copy_from_and_resize.default}
)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def emulated_device_type() -> str | None:
    """The emulated device type's name if this process enabled it, else ``None``."""
    return _state["name"]  # type: ignore[no-any-return]


class EmulatedTensor(torch.Tensor):
    """A tensor on the emulated device: reports that device, stores its data on the CPU.

    Created by moving a tensor (``t.to("ppe_emu")``) or by a factory with
    ``device="ppe_emu"``; ``.data_on_host`` is the CPU tensor holding the values.
    """

    data_on_host: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, index: int = 0) -> EmulatedTensor:
        # A wrapper without storage of its own: the sizes, strides and dtype mirror the CPU data.
        name = _state["name"]
        tensor = torch.Tensor._make_wrapper_subclass(
            cls,
            data.size(),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            layout=data.layout,
            device=torch.device(name, index),
            requires_grad=False,
        )
        tensor.data_on_host = data
        return tensor

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"{self.data_on_host!r} on {self.device}"

    def tolist(self) -> Any:
        """The values as (nested) Python numbers, as ``tolist`` gives for any device."""
        return self.data_on_host.tolist()

    def numpy(self, *, force: bool = False) -> Any:
        """Refused without ``force``, as for any non-CPU tensor: call ``.cpu()`` first."""
        if not force:
            raise TypeError(
                f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
                "copy the tensor to host memory first."
            )
        return self.data_on_host.detach().numpy()

    def __reduce_ex__(self, protocol: Any) -> Any:
        # The path torch takes for storage-less device tensors (XLA, MTIA): the data travels
        # as a CPU tensor tagged with the device, and torch.load(map_location=...) applies.
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.data_on_host, self.dtype, str(self.device), self.requires_grad),
        )

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return _run(func, args, kwargs or {})

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        # As torch._C._disabled_torch_function_impl (results are not re-wrapped), except for
        # the `.data` setter: torch swaps the C++ tensor behind `t.data = value` but knows
        # nothing of data_on_host, which must follow, or `module.double()` and
        # `module.to(memory_format=...)` on a moved module would keep the old host data.
        if getattr(func, "__self__", None) is _DATA and func.__name__ == "__set__":
            _set_data(*args)
            return None
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


#: The ``.data`` property's descriptor (typed Any: its stubs describe the value, not the setter).
_DATA: Any = torch._C.TensorBase.data


def _set_data(tensor: torch.Tensor, value: Any) -> None:
    """``tensor.data = value`` where either side is emulated: swapped between emulated
    tensors, refused with the fix across kinds (torch's own error names C++ tensor types)."""
    if not (isinstance(tensor, EmulatedTensor) and isinstance(value, EmulatedTensor)):
        where = value.device if isinstance(value, torch.Tensor) else type(value).__name__
        raise EmulatedDeviceError(
            f"cannot set .data of a tensor on {tensor.device} to a tensor on {where}: the "
            "emulated device's tensors are a Python tensor subclass, and torch swaps .data only "
            "between tensors of one kind (a real accelerator would allow it); move a module "
            "with module.to(...) (it makes new Parameter objects on the device, so build "
            "optimizers after the move), a tensor with t = t.to(...), or copy values in with "
            "t.data.copy_(value)"
        )
    with torch._C.DisableTorchFunctionSubclass():
        _DATA.__set__(tensor, value)
    tensor.data_on_host = value.data_on_host


def _index_of(device: Any) -> int | None:
    """The emulated index ``device`` names, or ``None`` when it is not the emulated device."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != _state["name"]:
        return None
    index = 0 if device.index is None else device.index
    if index >= _state["count"]:
        raise RuntimeError(
            f"{device} is out of range: the emulated device has {_state['count']} device(s); "
            "pass device_count= to enable_emulated_device for more"
        )
    return index


def _check_devices(func: Any, tensors: list[torch.Tensor]) -> int | None:
    """The emulated index of the operation; raises like a real device on mixed inputs."""
    index: int | None = None
    host: torch.Tensor | None = None
    for tensor in tensors:
        if isinstance(tensor, EmulatedTensor):
            this = tensor.device.index or 0
            if index is not None and this != index:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, {_state['name']}:{index} and {_state['name']}:{this}! "
                    f"(when running {func})"
                )
            index = this
        elif tensor.dim() > 0 and tensor.device.type == "cpu":
            # Zero-dimensional CPU tensors act as scalars, as they do beside CUDA tensors.
            host = tensor
    if index is not None and host is not None and func not in _COPY_OPS:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{_state['name']}:{index} and cpu! (when running {func}: a tensor was not moved "
            "to the device)"
        )
    return index


def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one operation on the host data and wrap its tensor results."""
    if threading.get_ident() == _MAIN_THREAD:
        _threads[0] = torch.get_num_threads()
    elif torch.get_num_threads() != _threads[0]:
        torch.set_num_threads(_threads[0])  # autograd's device worker (see _threads)
    tensors = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
    index = _check_devices(func, tensors)
    target = kwargs.get("device")
    target_index = _index_of(target) if target is not None else None
    if target is not None:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    if func is _aten.copy_.default:
        destination = args[0]
        _unwrap(destination).copy_(_unwrap(args[1]), **kwargs)
        return destination
    by_id = {id(t.data_on_host): t for t in tensors if isinstance(t, EmulatedTensor)}
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if target is not None and target_index is None:
        return out  # asked for another device type (the CPU): e.g. .cpu(), zeros_like(device=)
    if func is _aten._to_copy.default:
        source = args[0]
        if isinstance(source, EmulatedTensor) and out is source.data_on_host:
            out = out.clone()  # torch's copy must not alias the source
        return EmulatedTensor(out, target_index if target_index is not None else index or 0)
    wrap_index = target_index if target_index is not None else index
    if wrap_index is None:
        return out

    def wrap(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or isinstance(value, EmulatedTensor):
            return value
        # An in-place op returns its input: hand back the same wrapper, as torch would.
        same = by_id.get(id(value))
        return same if same is not None else EmulatedTensor(value, wrap_index)

    return tree_map(wrap, out)


def _unwrap(value: Any) -> Any:
    return value.data_on_host if isinstance(value, EmulatedTensor) else value


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    # Reached for operations with no emulated tensor argument that still target the device:
    # factories (torch.zeros(..., device="ppe_emu")) and the allocation inside cpu -> device.
    return _run(op, args, kwargs)


# Autocast on the device follows CPU autocast's op lists for the ops training commonly meets,
# so a forward under torch.autocast("ppe_emu") is bit-equal to one under torch.autocast("cpu").
# Other ops fall through and run in their inputs' dtype (CPU autocast does the same for them).
_AUTOCAST_LOWER = (
    "addbmm", "addmm", "baddbmm", "bmm", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "linalg_vecdot", "linear", "matmul", "mm", "prelu", "_convolution",
)  # fmt: skip
_AUTOCAST_FP32 = (
    "adaptive_avg_pool3d", "avg_pool3d", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "cdist", "cosine_embedding_loss", "cross_entropy_loss",
    "hinge_embedding_loss", "huber_loss", "kl_div", "l1_loss", "margin_ranking_loss",
    "max_pool3d", "mse_loss", "nll_loss", "nll_loss2d", "poisson_nll_loss", "prod",
    "smooth_l1_loss", "soft_margin_loss", "trace",
)  # fmt: skip


def _autocast_kernel(op: Any, lower: bool) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        name = _state["name"]
        dtype = torch.get_autocast_dtype(name) if lower else torch.float32

        def cast(value: Any) -> Any:
            # float64 stays float64 as under CPU autocast; other floats take the op's dtype.
            if (
                isinstance(value, torch.Tensor)
                and value.is_floating_point()
                and value.dtype != torch.float64
                and (lower or value.dtype != torch.float32)
            ):
                return value.to(dtype)
            return value

        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)  # type: ignore[attr-defined]
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return op(*tree_map(cast, args), **tree_map(cast, kwargs))

    return kernel


def _register_autocast(everything: Any, aten: Any) -> None:
    everything.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for names, lower in ((_AUTOCAST_LOWER, True), (_AUTOCAST_FP32, False)):
        for name in names:
            packet = getattr(_aten, name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                qualified = name if overload == "default" else f"{name}.{overload}"
                aten.impl(qualified, _autocast_kernel(op, lower), "AutocastPrivateUse1")


def _is_emulated_location(location: str) -> bool:
    name = _state["name"]
    return location == name or location.startswith(f"{name}:")


def _refuse_restore(storage: Any, location: str) -> None:
    """torch.load's deserializer for the emulated device (consulted before torch's own).

    torch restores a checkpoint by copying each storage to the device and building tensors
    on that storage; a Python backend has no device storage (torch's own path would reach
    ``torch.ppe_emu.device`` and then allocate PrivateUse1 memory no allocator serves), so a
    location on the device is refused with what to write instead. Other locations fall
    through to torch's deserializers (``None``).
    """
    if not _is_emulated_location(location):
        return None
    name = _state["name"]
    raise EmulatedDeviceError(
        f"torch.load cannot place tensors on the emulated device ({location!r} from "
        f"map_location): torch restores tensors into device storage, which the emulated "
        f"device {name!r} does not have; load with map_location='cpu' and move the result "
        f"(model.load_state_dict(...) on a model already on {name!r}, or tensor.to({name!r}))"
    )


class _Stream:
    """The emulated device's one stream: work runs when called, so there is nothing to order.

    torch.distributed.checkpoint's file writer asks a registered device module for streams
    (``current_stream``, ``stream(...)``, ``wait_stream``, ``synchronize``).
    """

    def wait_stream(self, stream: Any) -> None:
        """Nothing to wait for."""

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        return True


_STREAM = _Stream()


class _BackendModule:
    """``torch.<name>``: what torch asks of a device module (availability, count, AMP, RNG,
    streams)."""

    Stream = _Stream

    def current_stream(self, device: Any = None) -> _Stream:
        return _STREAM

    def stream(self, stream: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return int(_state["count"])

    def current_device(self) -> int:
        return 0

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    def is_bf16_supported(self) -> bool:
        return True

    # The data lives on the CPU, so the CPU generator is the device's generator (seeded
    # directly: torch.manual_seed itself calls manual_seed_all here).
    def manual_seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(new_state)

    def synchronize(self, device: Any = None) -> None:
        """Nothing to wait for: every operation ran when it was called."""


def enable_emulated_device(name: str = EMULATED_DEVICE, *, device_count: int = 1) -> str:
    """Make ``name`` a PyTorch device type backed by host memory; returns ``name``.

    Idempotent for the same name. Call it once per process before anything moves to the
    device (a test suite: in a session-scoped fixture or a subprocess).

    Args:
        name: The device type to create (``torch.device(name)``, ``tensor.to(name)``).
        device_count: How many devices (``name:0`` .. ``name:N-1``) to emulate.

    Raises:
        EmulatedDeviceError: torch is older than the hooks the emulation relies on, or
            PrivateUse1 already serves another name in this process.
    """
    with _lock:
        if _state["failed"]:
            raise EmulatedDeviceError(_state["failed"])
        if _state["name"] is not None:
            if _state["name"] != name:
                raise EmulatedDeviceError(
                    f"the emulated device is already enabled as {_state['name']!r} in this "
                    f"process and cannot also be {name!r} (torch names PrivateUse1 once per "
                    f"process); use {_state['name']!r}, or enable {name!r} in a fresh process"
                )
            _state["count"] = max(_state["count"], device_count)
            return name
        version = _torch_version()
        from torch.utils import backend_registration

        setup = getattr(backend_registration, "_setup_privateuseone_for_python_backend", None)
        if version < _MIN_TORCH or setup is None or not hasattr(torch._C, "_acc"):
            raise EmulatedDeviceError(
                f"the emulated device needs torch >= {_MIN_TORCH[0]}.{_MIN_TORCH[1]} with the "
                f"PrivateUse1 Python hooks, this is torch {torch.__version__}; upgrade torch "
                "(pip install -U torch) or run these checks with tensor_device='cpu'"
            )
        current = torch._C._get_privateuse1_backend_name()
        if current != "privateuseone":
            raise EmulatedDeviceError(
                f"PrivateUse1 already serves the device type {current!r} in this process (an "
                f"out-of-tree backend was imported), so {name!r} cannot be emulated here; run "
                "the emulated device in a process that does not load that backend"
            )
        _state["name"] = name
        _state["count"] = device_count
        setup(rename=name, backend_module=_BackendModule())
        library = torch.library.Library("_", "IMPL")  # type: ignore[no-untyped-call]
        library.fallback(_fallback, "PrivateUse1")  # type: ignore[no-untyped-call]
        aten = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
        _register_autocast(library, aten)
        # Before torch's privateuse1 deserializer (priority 23); the tagger tags nothing.
        torch.serialization.register_package(19, _tags_nothing, _refuse_restore)
        # Registrations live as long as their library objects.
        _state["library"] = (library, aten)
        _probe_autograd(name)
        return name


def _tags_nothing(storage: Any) -> None:
    return None  # emulated tensors are saved as CPU tensors (EmulatedTensor.__reduce_ex__)


def _probe_autograd(name: str) -> None:
    """Fail clearly if autograd cannot reach the device in this process.

    torch's autograd engine sizes its per-device worker queues once, at the process's first
    backward; a device type registered after that has no queue, and every later backward on
    it fails with an internal assertion. One tiny backward tells.
    """
    probe = torch.ones(1, device=name, requires_grad=True)
    try:
        (probe * 2).sum().backward()  # type: ignore[no-untyped-call]
    except RuntimeError as exc:
        if "device_ready_queues_" not in str(exc):
            raise
        _state["failed"] = (
            f"the emulated device {name!r} was enabled after this process had already run a "
            "backward pass, and torch's autograd engine cannot take a new device type then; "
            "enable it before the first backward: at the top of the script, in a pytest "
            "conftest.py (def pytest_configure(config): enable_emulated_device()), or in a "
            "fresh process"
        )
        raise EmulatedDeviceError(_state["failed"]) from exc


class EmulatedDeviceRuntime(DeviceRuntime):
    """The runtime for the emulated device (``device="ppe_emu"``): the shared device options
    (``autocast``, ``grad_scaler``, ``channels_last``, ``compile``) on a device whose tensors
    are not CPU tensors. Creating it enables the emulated device under the default name.

    Not registered by any plugin: pass it as ``runtime_class`` (``ppe.to(model, "ppe_emu",
    runtime_class=EmulatedDeviceRuntime)``, the kit's ``RuntimeTarget``), or register it for
    ``"ppe_emu"`` in a test's plugin host.
    """

    option_spec: ClassVar[RuntimeOptions] = RuntimeOptions(
        "EmulatedDeviceRuntime", *DeviceRuntime.shared_options(EMULATED_DEVICE, torch.bfloat16)
    )
    device_type: ClassVar[str] = EMULATED_DEVICE
    default_autocast_dtype: ClassVar[torch.dtype] = torch.bfloat16

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        enable_emulated_device()
        super().__init__(device_spec, options)
