"""The options PPE's runtimes lack, which :class:`~ppe_core.runtime.DeviceRuntime` gives every
device plugin: their declarations (:func:`shared_option_specs`) and what they do: autocast
over a module's ``forward``, channels-last modules and batches, ``torch.compile`` in place,
non-blocking copies, and the forms the ``autocast`` option takes beyond PPE's (a dtype alone, the
device's default dtype, both checked). PPE's runtimes take ``autocast`` and ``grad_scaler`` for
code blocks only, passing the dict to ``torch.autocast`` as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ppe_core.errors import RuntimeOptionError, RuntimeOptionTypeError
from ppe_core.runtime._option_specs import OptionSpec
from ppe_core.runtime._runtime import autocast_kwargs

__all__ = [
    "AUTOCAST_DTYPES",
    "AutocastForward",
    "BatchMover",
    "compile_in_place",
    "compile_kwargs",
    "device_autocast_kwargs",
    "set_autocast_forward",
    "shared_option_specs",
]


def shared_option_specs(
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
            on_move=True,
        ),
        OptionSpec(
            "grad_scaler",
            (torch.amp.GradScaler,),
            None,
            "A `torch.amp.GradScaler` for code blocks (as `PyTorchRuntime`); saved in snapshots.",
            f"torch.amp.GradScaler({device_type!r})",
        ),
        OptionSpec(
            "channels_last",
            (bool,),
            False,
            "Module and 4-D batch tensors in channels-last memory format (faster CNNs).",
            on_move=True,
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


#: The dtypes ``torch.autocast`` lowers to on the devices the first-party plugins serve.
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def device_autocast_kwargs(
    value: Any, device_type: str, default_dtype: torch.dtype, owner: str
) -> dict[str, Any] | None:
    """A ``DeviceRuntime``'s ``autocast`` option as ``torch.autocast`` kwargs (``None``: off).

    The forms of :func:`~ppe_core.runtime._runtime.autocast_kwargs`, plus a dtype alone. The
    result always names ``device_type`` (this runtime's: another is refused) and ``dtype``
    (``default_dtype`` unless given; one of :data:`AUTOCAST_DTYPES`), the form
    ``PyTorchRuntime`` and the code-block path understand.
    """
    kwargs = autocast_kwargs(
        {"dtype": value} if isinstance(value, torch.dtype) else value, device_type
    )
    if kwargs is None:
        return None
    if kwargs["device_type"] != device_type:
        raise RuntimeOptionError(
            f"{owner} option 'autocast' names device_type={kwargs['device_type']!r}, but this "
            f"runtime runs on {device_type!r}; drop device_type or use the "
            f"{kwargs['device_type']!r} device's runtime"
        )
    dtype = kwargs.setdefault("dtype", default_dtype)
    if dtype not in AUTOCAST_DTYPES:
        raise RuntimeOptionError(
            f"{owner} option 'autocast' dtype must be torch.bfloat16 or torch.float16, got "
            f"{dtype!r}; e.g. options={{'autocast': torch.bfloat16}}"
        )
    return kwargs


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
