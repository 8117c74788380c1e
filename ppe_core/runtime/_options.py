"""Declarative runtime options (name, accepted types, default, doc) and their validation.

Device runtimes declare their options once with :class:`OptionSpec` and validate what a user
passes with :class:`RuntimeOptions`, so every runtime gives the same errors: an unknown option
lists the accepted ones, a wrong type names the type wanted. The helpers at the end implement
the device-independent options (``autocast``, ``channels_last``, ``compile``) that
:class:`~ppe_core.runtime.DeviceRuntime` gives every device plugin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ppe_core.errors import RuntimeOptionError, RuntimeOptionTypeError

__all__ = [
    "OptionSpec",
    "RuntimeOptionTypeError",
    "RuntimeOptions",
    "autocast_available",
    "positive_int",
]


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One runtime option: what it accepts, its default and what it does.

    Args:
        name: The option's key in ``options`` / ``runtime_options``.
        types: Accepted types. ``bool`` is accepted only when listed (not as an ``int``).
            ``None`` is always accepted and means "the default".
        default: The value used when the option is absent or ``None``.
        doc: One line for error messages and the docs' option tables.
        example: A valid value written as Python, shown in error messages.
        check: ``fn(value) -> problem or None`` for checks beyond the type (ranges, choices).
        on_move: The option acts only when a module is moved (``ppe.to``), as ``compile``
            does. ``create_trainer``/``create_evaluator`` refuse it in ``runtime_options`` that
            differ from those the model was moved with, where it would otherwise be ignored.
    """

    name: str
    types: tuple[type, ...]
    default: Any = None
    doc: str = ""
    example: str = "True"
    check: Callable[[Any], str | None] | None = None
    on_move: bool = False

    def type_names(self) -> str:
        """The accepted types in words, e.g. ``"bool, torch.dtype or dict"``."""
        names = [_type_name(t) for t in self.types]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]

    def accepts_type(self, value: Any) -> bool:
        """Whether ``value`` has one of the accepted types."""
        if isinstance(value, bool) and bool not in self.types:
            return False
        return isinstance(value, self.types)


class RuntimeOptions:
    """The options one runtime accepts, and the validator of what a user passes.

    Args:
        owner: The runtime's name, used in error messages (e.g. ``"CPURuntime"``).
        specs: The accepted options.

    Example:
        >>> spec = RuntimeOptions("MyRuntime", OptionSpec("fast", (bool,), False, "Go fast."))
        >>> spec.validate({"fast": True})
        {'fast': True}
    """

    def __init__(self, owner: str, *specs: OptionSpec) -> None:
        self.owner = owner
        self.specs: dict[str, OptionSpec] = {s.name: s for s in specs}
        if len(self.specs) != len(specs):
            raise ValueError(f"{owner}: an option is declared twice")

    @property
    def names(self) -> frozenset[str]:
        """The accepted option names (for ``BaseRuntime.accepted_options``)."""
        return frozenset(self.specs)

    def __iter__(self) -> Iterator[OptionSpec]:
        return iter(self.specs.values())

    def validate(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """Check ``options`` and return every declared option, defaults filled in.

        Raises:
            RuntimeOptionError: an unknown option, or a value the option's check rejects.
            RuntimeOptionTypeError: a value of the wrong type.
        """
        given = dict(options or {})
        unknown = sorted(set(given) - set(self.specs), key=str)
        if unknown:
            raise RuntimeOptionError(
                f"{self.owner} does not understand the runtime option(s) "
                f"{', '.join(map(repr, unknown))}; accepted options: {self._listing()}. "
                "Remove them from ppe.to(options=...) / runtime_options, or fix the spelling."
            )
        resolved: dict[str, Any] = {}
        for name, spec in self.specs.items():
            value = given.get(name)
            if value is None:
                resolved[name] = spec.default
                continue
            if not spec.accepts_type(value):
                raise RuntimeOptionTypeError(
                    f"{self.owner} option {name!r} must be {spec.type_names()}, got "
                    f"{type(value).__name__} {value!r}; e.g. options={{{name!r}: {spec.example}}}"
                )
            problem = spec.check(value) if spec.check is not None else None
            if problem is not None:
                raise RuntimeOptionError(
                    f"{self.owner} option {name!r} {problem}, got {value!r}; e.g. "
                    f"options={{{name!r}: {spec.example}}}"
                )
            resolved[name] = value
        return resolved

    def _listing(self) -> str:
        return ", ".join(f"{s.name} ({s.type_names()})" for s in self) or "(none)"

    def markdown_table(self) -> str:
        """The options as a Markdown table (option, types, default, meaning) for docs."""
        rows = ["| option | accepts | default | meaning |", "|---|---|---|---|"]
        rows += [f"| `{s.name}` | {s.type_names()} | `{s.default!r}` | {s.doc} |" for s in self]
        return "\n".join(rows)


def _type_name(t: type) -> str:
    if t is torch.dtype:
        return "torch.dtype"
    if t is torch.amp.GradScaler:
        return "torch.amp.GradScaler"
    if issubclass(t, Mapping):
        return "dict"
    if t.__module__ in ("builtins", ""):
        return t.__name__
    return f"{t.__module__}.{t.__qualname__}"


def positive_int(value: Any) -> str | None:
    """An :attr:`OptionSpec.check`: the value must be an int >= 1 (bools pass as flags)."""
    if isinstance(value, bool):
        return None
    return None if value >= 1 else "must be >= 1"


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


def move_module(
    module: torch.nn.Module,
    device: torch.device,
    *,
    channels_last: bool,
    autocast: Mapping[str, Any] | None,
    compile: Mapping[str, Any] | None,
    owner: str,
) -> torch.nn.Module:
    """Move ``module`` to ``device`` and apply the module options, once, when it is moved."""
    module = module.to(device)
    if channels_last:
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    set_autocast_forward(module, autocast)
    if compile is not None:
        compile_in_place(module, compile, owner)
    return module
