"""The device-independent runtime options (``autocast``, ``channels_last``, ``compile``) that
:class:`~ppe_core.runtime.DeviceRuntime` gives every device plugin.

Their declarations (:class:`OptionSpec`, validated by :class:`RuntimeOptions`) live in
``_option_specs.py``; re-exported here, their former path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ppe_core.errors import RuntimeOptionError, RuntimeOptionTypeError
from ppe_core.runtime._option_specs import OptionSpec, RuntimeOptions, positive_int

__all__ = [
    "OptionSpec",
    "RuntimeOptionTypeError",
    "RuntimeOptions",
    "autocast_available",
    "positive_int",
]


# Device-independent option implementations used by the device plugins ---------------------
#: The dtypes ``torch.autocast`` lowers to on the devices the first-party plugins serve.
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def autocast_kwargs(
    value: Any, device_type: str, default_dtype: torch.dtype, owner: str
) -> dict[str, Any] | None:
    """The ``autocast`` option (``True``, a dtype or a dict) as ``torch.autocast`` kwargs.

    Returns ``None`` when autocast is off (``False``, or a dict with ``enabled=False``). The
    result always names ``device_type`` and ``dtype``, the form ``PyTorchRuntime`` and the
    code-block path understand.
    """
    if value is None or value is False:
        return None
    if value is True:
        kwargs: dict[str, Any] = {}
    elif isinstance(value, torch.dtype):
        kwargs = {"dtype": value}
    else:
        kwargs = dict(value)
    if not kwargs.pop("enabled", True):
        return None
    given_type = kwargs.setdefault("device_type", device_type)
    if given_type != device_type:
        raise RuntimeOptionError(
            f"{owner} option 'autocast' names device_type={given_type!r}, but this runtime runs "
            f"on {device_type!r}; drop device_type or use the {given_type!r} device's runtime"
        )
    dtype = kwargs.setdefault("dtype", default_dtype)
    if dtype not in AUTOCAST_DTYPES:
        raise RuntimeOptionError(
            f"{owner} option 'autocast' dtype must be torch.bfloat16 or torch.float16, got "
            f"{dtype!r}; e.g. options={{'autocast': torch.bfloat16}}"
        )
    return kwargs


def autocast_available(device_type: str) -> bool:
    """Whether ``torch.autocast`` supports ``device_type`` (``True`` where torch cannot say)."""
    available = getattr(torch.amp, "is_autocast_available", None)  # torch>=2.4
    if available is None:
        return True
    try:
        return bool(available(device_type))
    except RuntimeError:  # a device type PyTorch does not know at all
        return False


def require_autocast(device_type: str, what: str, owner: str) -> None:
    """Raise a clear error if ``torch.autocast`` has no implementation for ``device_type``.

    Called once, where autocast is switched on, so torch's own error ("unsupported autocast
    device_type") never reaches the first training step.
    """
    if autocast_available(device_type):
        return
    raise RuntimeOptionError(
        f"{what} asks for autocast on device type {device_type!r}, which torch.autocast does "
        f"not support; name the torch device type autocast runs on in the runtime class "
        f"({owner}): autocast_device_type = 'cpu' in a DeviceRuntime subclass whose tensors "
        "compute on the host, or the type whose kernels it uses; or switch autocast off"
    )


def compile_kwargs(value: Any) -> dict[str, Any] | None:
    """The ``compile`` option (``True`` or a dict of ``torch.compile`` kwargs), ``None``: off."""
    if value is None or value is False:
        return None
    return {} if value is True else dict(value)


class AutocastForward:
    """A module's ``forward`` run under ``torch.autocast`` (set as the instance's forward).

    Kept as an object holding the module, not a closure, so ``copy.deepcopy`` and pickling of
    the module carry it over to the copy; ``state_dict`` keys are unchanged.
    """

    def __init__(self, module: torch.nn.Module, kwargs: Mapping[str, Any]) -> None:
        self.module = module
        self.kwargs = dict(kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(**self.kwargs):
            return type(self.module).forward(self.module, *args, **kwargs)


def set_autocast_forward(module: torch.nn.Module, kwargs: Mapping[str, Any] | None) -> None:
    """Run ``module``'s forward under ``torch.autocast(**kwargs)`` (``None``: restore it).

    Applied once when the module is moved, so the training step pays only the autocast
    context the user asked for, whichever Logic calls the module.
    """
    current = module.__dict__.get("forward")
    if kwargs is None:
        if isinstance(current, AutocastForward):
            del module.__dict__["forward"]
        return
    if current is not None and not isinstance(current, AutocastForward):
        raise RuntimeOptionError(
            f"runtime option 'autocast' cannot wrap {type(module).__name__}: the module already "
            "has an instance-level forward; use options={'autocast': ...} of the Logic instead"
        )
    module.__dict__["forward"] = AutocastForward(module, kwargs)


def compile_in_place(module: torch.nn.Module, kwargs: Mapping[str, Any], owner: str) -> None:
    """``torch.compile`` ``module`` in place (``nn.Module.compile``): same object, same
    ``state_dict`` keys, so snapshots load into an uncompiled model. Compilation is lazy
    (first call); ``torch._dynamo`` is imported only here."""
    compile_method = getattr(module, "compile", None)
    if not callable(compile_method):
        raise RuntimeOptionError(
            f"{owner} option 'compile' needs torch>=2.2 (nn.Module.compile), this is "
            f"torch {torch.__version__}; upgrade torch or remove the option"
        )
    try:
        compile_method(**kwargs)
    except TypeError as exc:
        raise RuntimeOptionTypeError(
            f"{owner} option 'compile' got arguments torch.compile does not take ({exc}); pass "
            "a dict of torch.compile keyword arguments, e.g. {'compile': {'mode': "
            "'reduce-overhead'}}"
        ) from exc


class BatchMover:
    """A ``move_tensor`` for the batch options: 4-D tensors to channels-last memory format
    when asked, copies non-blocking when asked (pinned host memory makes them asynchronous).

    An object rather than a closure, so a runtime holding it (and a module tagged with that
    runtime) stays picklable.
    """

    def __init__(self, device: torch.device, non_blocking: bool, channels_last: bool) -> None:
        self.device = device
        self.non_blocking = non_blocking
        self.channels_last = channels_last

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.channels_last and tensor.dim() == 4:
            return tensor.to(
                self.device, non_blocking=self.non_blocking, memory_format=torch.channels_last
            )
        return tensor.to(self.device, non_blocking=self.non_blocking)
