"""``DeviceRuntime``: the base of device plugins' runtimes, owning the options they share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ppe_core.errors import ConfigurationError
from ppe_core.runtime._option_specs import OptionSpec, RuntimeOptions
from ppe_core.runtime._options import (
    BatchMover,
    autocast_kwargs,
    compile_in_place,
    compile_kwargs,
    require_autocast,
    set_autocast_forward,
)
from ppe_core.runtime._registry import device_type_of, is_torch_device_type
from ppe_core.runtime._runtime import BaseRuntime, DeviceLike, PyTorchRuntime

__all__ = ["DeviceRuntime"]


class DeviceRuntime(PyTorchRuntime):
    """A :class:`PyTorchRuntime` with the options every device plugin shares, declared once.

    A device plugin subclasses it with :attr:`device_type`, :attr:`default_autocast_dtype` and
    :attr:`option_spec`, built from :meth:`shared_options` plus the device's own options
    (``accepted_options`` follows from it). This class validates the options, normalises
    ``autocast`` into ``torch.autocast`` arguments, and applies the module options when
    ``ppe.to`` moves a module and the batch options where batches are converted.
    ``resolved_options`` holds every declared option's value for the subclass's own options.
    """

    #: The device type this runtime serves (``"cpu"``, ``"cuda"``, ...).
    device_type: ClassVar[str]
    #: What ``autocast=True`` means on this device.
    default_autocast_dtype: ClassVar[torch.dtype]
    #: The declarative spec the options are validated against.
    option_spec: ClassVar[RuntimeOptions]
    #: The torch device type tensors go to when PyTorch does not know :attr:`device_type`
    #: (``None``: ``device_type`` itself), e.g. ``"cpu"`` for a device simulated in host
    #: memory. ``"mydev:1"`` then moves to ``torch.device("<this type>", 1)`` (``"cpu"``: no
    #: index); ``device_spec`` stays ``"mydev:1"``.
    torch_device_type: ClassVar[str | None] = None
    #: The device type ``torch.autocast`` runs on, for the ``autocast`` option and a Logic's
    #: autocast (the Handler reads it). Declare it in the class body when autocast must run on
    #: another type than the tensors' (``None``: the torch device type the tensors live on);
    #: the instance holds the resolved type.
    autocast_device_type: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("option_spec")
        if spec is not None and "accepted_options" not in cls.__dict__:
            cls.accepted_options = spec.names  # any other key is rejected by name

    @staticmethod
    def shared_options(
        device_type: str, autocast_dtype: torch.dtype, *, non_blocking: bool = False
    ) -> tuple[OptionSpec, ...]:
        """The specs of ``autocast``, ``grad_scaler``, ``channels_last`` and ``compile`` (and
        ``non_blocking`` for devices with asynchronous copies), worded for ``device_type``."""
        dtype = str(autocast_dtype).removeprefix("torch.")
        specs = [
            OptionSpec(
                "autocast",
                (bool, torch.dtype, Mapping),
                False,
                f"Run the model's forward under `torch.autocast('{device_type}')`: `True` is "
                f"{dtype}, or a dtype, or a dict of `torch.autocast` arguments.",
                "torch.bfloat16",
            ),
            OptionSpec(
                "grad_scaler",
                (torch.amp.GradScaler,),
                None,
                "A `torch.amp.GradScaler` for code blocks (as `PyTorchRuntime`); saved in "
                "snapshots.",
                f"torch.amp.GradScaler({device_type!r})",
            ),
            OptionSpec(
                "channels_last",
                (bool,),
                False,
                "Module and 4-D batch tensors in channels-last memory format (faster CNNs).",
            ),
            OptionSpec(
                "compile",
                (bool, Mapping),
                False,
                "`torch.compile` the module in place: `True`, or a dict of `torch.compile` "
                "arguments. `state_dict` keys are unchanged.",
                "{'backend': 'inductor'}",
                on_move=True,
            ),
        ]
        if non_blocking:
            specs.append(
                OptionSpec(
                    "non_blocking",
                    (bool,),
                    False,
                    "Host-to-device batch copies with `non_blocking=True` (asynchronous from "
                    "pinned memory: `DataLoader(pin_memory=True)`).",
                )
            )
        return tuple(specs)

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        name = type(self).__name__
        if device_type_of(device_spec) != self.device_type:
            raise ConfigurationError(
                f"{name} serves {self.device_type!r} devices, got {device_spec!r}; pass "
                f"device={self.device_type!r} (or '{self.device_type}:N'), or leave "
                "runtime_class unset so the device's own runtime is looked up"
            )
        resolved = self.option_spec.validate(options)
        torch_device = self._torch_device(device_spec)
        autocast_type = type(self).autocast_device_type or device_type_of(torch_device)
        autocast = autocast_kwargs(
            resolved["autocast"], autocast_type, self.default_autocast_dtype, name
        )
        given = {k: v for k, v in (options or {}).items() if v is not None and k != "autocast"}
        if autocast is not None:
            require_autocast(autocast_type, f"{name} option 'autocast'", name)
            given["autocast"] = autocast  # the normalised form the core's handler reads
        super().__init__(torch_device, given)
        self.device_spec = device_spec  # what the user passed, e.g. "mydev:1"
        self.autocast_device_type = autocast_type
        #: Every declared option, defaults filled in.
        self.resolved_options: dict[str, Any] = resolved
        #: ``torch.autocast`` arguments the module's forward runs under (``None``: off).
        self.autocast: dict[str, Any] | None = autocast
        self.channels_last: bool = bool(resolved["channels_last"])
        self.non_blocking: bool = bool(resolved.get("non_blocking", False))
        self.compile: dict[str, Any] | None = compile_kwargs(resolved["compile"])
        if self.channels_last or self.non_blocking:
            # Bound per instance so the default runtime keeps the inline batch conversion.
            self.move_tensor = BatchMover(  # type: ignore[method-assign]
                self.device, self.non_blocking, self.channels_last
            )
            self.convert_batch = self._convert_each  # type: ignore[method-assign]

    def _torch_device(self, device_spec: DeviceLike) -> DeviceLike:
        """The torch device for ``device_spec``, through :attr:`torch_device_type` if set (a
        malformed spec of a type PyTorch knows is returned as is: ``PyTorchRuntime`` explains
        it)."""
        name = type(self).__name__
        target = self.torch_device_type
        if target is None:
            try:
                return torch.device(device_spec)
            except (RuntimeError, TypeError, ValueError) as exc:
                if is_torch_device_type(self.device_type):
                    return device_spec
                raise ConfigurationError(
                    f"{name} serves {self.device_type!r}, a device type PyTorch does not know "
                    f"(torch.device({str(device_spec)!r}) failed: {exc}); declare "
                    f"torch_device_type = 'cpu' in the body of {name} (or the torch device type "
                    "its tensors live on), or register the device type with PyTorch first"
                ) from exc
        index = device_spec.index if isinstance(device_spec, torch.device) else None
        if isinstance(device_spec, str) and ":" in device_spec:
            tail = device_spec.partition(":")[2]
            if not tail.isdigit():
                raise ConfigurationError(
                    f"{name} cannot use the device {device_spec!r}: the index must be an int, "
                    f"e.g. '{self.device_type}:0'"
                )
            index = int(tail)
        if index is None or target == "cpu":
            return torch.device(target)
        return torch.device(target, index)

    @property
    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """The scaler code blocks use and the Handler offers to the Logic (whose state is
        saved in snapshots). A device plugin may set one it creates (e.g. for float16
        autocast): it becomes the ``grad_scaler`` option too."""
        return self._grad_scaler

    @grad_scaler.setter
    def grad_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        self._grad_scaler = scaler
        if scaler is None:
            self.options.pop("grad_scaler", None)
        else:
            self.options["grad_scaler"] = scaler

    def _convert_each(self, args: Any) -> Any:
        return BaseRuntime.convert_batch(self, args)

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` and apply the module options (channels-last, autocast, compile),
        once, when it is moved."""
        module = module.to(self.device)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        set_autocast_forward(module, self.autocast)
        if self.compile is not None:
            compile_in_place(module, self.compile, type(self).__name__)
        return module
