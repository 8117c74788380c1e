"""``DeviceRuntime``: the base of device plugins' runtimes, owning the options they share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ppe_core.runtime._device_types import require_autocast, torch_device_for
from ppe_core.runtime._option_specs import RuntimeOptions
from ppe_core.runtime._registry import device_type_of
from ppe_core.runtime._runtime import DeviceLike, PyTorchRuntime
from ppe_core.runtime._shared_options import (
    BatchMover,
    compile_in_place,
    compile_kwargs,
    device_autocast_kwargs,
    set_autocast_forward,
    shared_option_specs,
)

__all__ = ["DeviceRuntime"]


class DeviceRuntime(PyTorchRuntime):
    """A :class:`PyTorchRuntime` with the options every device plugin shares, declared once.

    A device plugin subclasses it with :attr:`device_type`, :attr:`default_autocast_dtype` and
    :attr:`option_spec`, built from :meth:`shared_options` plus the device's own options
    (``accepted_options`` follows from it). This class validates the options, normalises
    ``autocast`` into ``torch.autocast`` arguments, and applies the module options when
    ``ppe.to`` moves a module and the batch options where batches are converted.
    ``resolved_options`` holds every declared option's value for the subclass's own options;
    ``autocast`` (``None``: off) the ``torch.autocast`` arguments the module's forward runs
    under, always naming ``device_type`` and ``dtype``.
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

    #: The specs of the options every device plugin shares (see :func:`shared_option_specs`).
    shared_options = staticmethod(shared_option_specs)

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        torch_device = torch_device_for(type(self), device_spec)
        resolved = self.option_spec.validate(options)
        super().__init__(torch_device, self._normalise_autocast(torch_device, options, resolved))
        self.device_spec = device_spec  # what the user passed, e.g. "mydev:1"
        self._apply_shared_options(resolved)

    def _normalise_autocast(
        self, torch_device: DeviceLike, options: Mapping[str, Any] | None, resolved: dict[str, Any]
    ) -> dict[str, Any]:
        """Resolve :attr:`autocast_device_type` and return the options given, with ``autocast``
        in the normalised form :class:`PyTorchRuntime` and the Handler read (checked on that
        device type)."""
        name = type(self).__name__
        self.autocast_device_type = type(self).autocast_device_type or device_type_of(torch_device)
        autocast = device_autocast_kwargs(
            resolved["autocast"], self.autocast_device_type, self.default_autocast_dtype, name
        )
        given = {k: v for k, v in (options or {}).items() if v is not None and k != "autocast"}
        if autocast is not None:
            require_autocast(self.autocast_device_type, f"{name} option 'autocast'", name)
            given["autocast"] = autocast  # the normalised form the core's handler reads
        return given

    def _apply_shared_options(self, resolved: dict[str, Any]) -> None:
        """Keep the validated options, read the module and batch options, and bind the batch
        mover those need."""
        #: Every declared option, defaults filled in.
        self.resolved_options: dict[str, Any] = resolved
        self.channels_last: bool = bool(resolved["channels_last"])
        self.non_blocking: bool = bool(resolved.get("non_blocking", False))
        self.compile: dict[str, Any] | None = compile_kwargs(resolved["compile"])
        if self.channels_last or self.non_blocking:
            # Bound per instance so the default runtime keeps the inline batch conversion.
            self.move_tensor = BatchMover(  # type: ignore[method-assign]
                self.device, self.non_blocking, self.channels_last
            )
            self._plain_move = False  # convert_batch calls it for every tensor

    def module_option_values(self) -> dict[str, Any]:
        """The values in effect of the options that act on the modules this runtime moves
        (``OptionSpec.on_move``): ``autocast`` as ``torch.autocast`` arguments, ``compile`` as
        ``torch.compile`` arguments, so equal requests (``True`` and ``torch.bfloat16``)
        compare equal. ``create_trainer`` compares them with the model's runtime's."""
        resolved, normalised = self.resolved_options, vars(self)
        return {
            spec.name: normalised.get(spec.name, resolved[spec.name])
            for spec in self.option_spec
            if spec.on_move
        }

    @property
    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """The scaler code blocks use and the Handler offers to the Logic (whose state is
        saved in snapshots): the ``grad_scaler`` option. A device plugin may set one it creates
        (e.g. for float16 autocast)."""
        return self.options.get("grad_scaler")

    @grad_scaler.setter
    def grad_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is None:
            self.options.pop("grad_scaler", None)
        else:
            self.options["grad_scaler"] = scaler

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` and apply the module options (channels-last, autocast, compile),
        once, when it is moved."""
        return self._apply_module_options(module.to(self.device))

    def _apply_module_options(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` (just moved) in channels-last format, its forward under autocast, and
        compiled in place, as the options ask."""
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        set_autocast_forward(module, self.autocast)
        if self.compile is not None:
            compile_in_place(module, self.compile, type(self).__name__)
        return module
