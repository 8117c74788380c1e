"""The runtime layer's checks PPE lacks, each raising an error that names the cause and the fix:
a device that is neither a non-empty str nor a ``torch.device``, a spec ``torch.device``
refuses, a device type no runtime serves and PyTorch does not know, a runtime registered as an
instance or for a device instead of a device type, a ``runtime_class`` that is not a runtime
class, an ``autocast`` or ``grad_scaler`` option of another type, a code block's outputs that
cannot be backpropagated, ``ppe.map``'s ``out_keys`` on an output that is not a dict. PPE
stores, calls or indexes what it is given and leaves the failure to Python or PyTorch (or,
with nothing to backpropagate, steps without gradients in silence).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ppe_core.errors import (
    ArgumentTypeError,
    CodeBlockError,
    ConfigurationError,
    RuntimeOptionError,
)

__all__ = [
    "backprop_error",
    "check_autocast_option",
    "check_grad_scaler",
    "check_map_output",
    "check_runtime_class",
    "check_runtime_registration",
    "device_error",
    "device_spec_error",
    "unknown_device_hint",
]


def device_error(device: object) -> ConfigurationError:
    """Why ``device`` names no device type: an empty string, or neither a str nor a
    ``torch.device``."""
    if isinstance(device, str):
        return ConfigurationError(
            "device is an empty string; pass a device such as 'cpu', 'cuda:0' or 'auto'"
        )
    return ArgumentTypeError(
        f"device must be a str or a torch.device, got {type(device).__name__} {device!r}; pass "
        "e.g. device='cpu', device='cuda:0' or torch.device('cuda', 0)"
    )


def device_spec_error(owner: str, device_spec: object, exc: Exception) -> ConfigurationError:
    """Why ``torch.device`` refused ``device_spec`` (``exc``), for the runtime class ``owner``."""
    return ConfigurationError(
        f"{owner} cannot use the device {device_spec!r}: {exc}. Pass a device type with an "
        "optional index, e.g. 'cpu', 'cuda' or 'cuda:1'."
    )


def unknown_device_hint(device_type: str) -> str:
    """What to do about ``device_type`` when no runtime serves it and PyTorch does not know it."""
    return (
        f"{device_type!r} is not a PyTorch device type either. Install the plugin that "
        "provides it (first-party plugins: pip install ppe-cpu / pip install ppe-cuda), "
        "or register one with ppe_core.runtime.runtime_registry.register"
        f"({device_type!r}, MyRuntime)."
    )


def check_runtime_registration(name: str, obj: object, base: type) -> None:
    """``obj`` must be a subclass of ``base`` (a runtime class), registered for a device type."""
    if not (isinstance(obj, type) and issubclass(obj, base)):
        what = "an instance" if isinstance(obj, base) else "not a runtime class"
        raise ArgumentTypeError(
            f"runtime for {name!r} must be a subclass of ppe_core.runtime.BaseRuntime, "
            f"got {obj!r} ({what}); register the class itself, e.g. "
            f"register({name!r}, MyRuntime) with class MyRuntime(PyTorchRuntime)"
        )
    if ":" in name:
        raise ConfigurationError(
            f"runtimes are registered for a device type, not a device: got {name!r}; "
            f"register {name.split(':', 1)[0]!r} instead (the runtime receives the full "
            "device spec when constructed)"
        )


def check_runtime_class(runtime_class: object, base: type) -> None:
    """``runtime_class`` (of ``ppe.to`` / ``runtime_for``) must be ``None`` or a subclass of
    ``base``."""
    if runtime_class is not None and not (
        isinstance(runtime_class, type) and issubclass(runtime_class, base)
    ):
        raise ArgumentTypeError(
            f"runtime_class must be a subclass of ppe_core.runtime.BaseRuntime, got "
            f"{runtime_class!r}; pass the class (not an instance), or omit it to use the runtime "
            "registered for the device"
        )


def check_autocast_option(option: object) -> None:
    """The ``autocast`` runtime option must be a bool or a dict of ``torch.autocast``
    arguments."""
    if not isinstance(option, (bool, Mapping)):
        raise RuntimeOptionError(
            f"runtime option 'autocast' must be a bool or a dict of torch.autocast arguments, "
            f"got {option!r}; e.g. options={{'autocast': True}} or "
            "{'autocast': {'dtype': torch.bfloat16}}"
        )


def check_grad_scaler(scaler: object, device_type: str) -> None:
    """The ``grad_scaler`` runtime option must be ``None`` or a ``torch.amp.GradScaler``."""
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise RuntimeOptionError(
            f"runtime option 'grad_scaler' must be a torch.amp.GradScaler, got "
            f"{type(scaler).__name__}; e.g. options={{'grad_scaler': "
            f"torch.amp.GradScaler({device_type!r})}}"
        )


def backprop_error(out: Any, backprop_from: str | None) -> CodeBlockError:
    """Why a code block's outputs ``out`` give nothing to backpropagate: ``backprop_from`` is
    missing or not a tensor computed with autograd, or (``None``) no output is a one-element
    float tensor computed with autograd."""
    got = sorted(out) if isinstance(out, Mapping) else type(out).__name__
    if backprop_from is None:
        return CodeBlockError(
            f"update_parameters found nothing to backpropagate in the outputs {got}: no "
            "one-element float tensor computed with autograd. Return the loss, e.g. "
            "{'loss': loss}, or name it with backprop_from='loss'."
        )
    if not isinstance(out, Mapping) or backprop_from not in out:
        return CodeBlockError(
            f"update_parameters(backprop_from={backprop_from!r}) but the function returned "
            f"{got}; return a dict holding {backprop_from!r}, or fix backprop_from"
        )
    return CodeBlockError(
        f"the output {backprop_from!r} is not a tensor computed with autograd, so it "
        "cannot be backpropagated; compute it from the parameters (not under no_grad)"
    )


def check_map_output(out: object, out_keys: set[str]) -> None:
    """``ppe.map`` with ``out_keys`` needs functions that return a dict."""
    if not isinstance(out, Mapping):
        raise ConfigurationError(
            f"ppe.map was given out_keys={sorted(out_keys)}, but the function "
            f"returned {type(out).__name__}, not a dict; return a dict or omit out_keys"
        )
