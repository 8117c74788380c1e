"""The runtime contract (``BaseRuntime``) and the generic ``PyTorchRuntime``.

Beyond PPE, which leaves the failure to Python or PyTorch, a device spec ``torch.device``
refuses, an ``autocast`` or ``grad_scaler`` option of another type and ``ppe.map``'s
``out_keys`` on an output that is not a dict raise errors naming the cause and the fix (the
checks at the end).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ppe_core.errors import ConfigurationError, RuntimeOptionError
from ppe_core.runtime._execute import run_code_block
from ppe_core.runtime._option_specs import reject_undeclared

_Tensor = torch.Tensor

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from ppe_core.runtime._execute import CodeBlock

__all__ = [
    "BaseRuntime",
    "DeviceLike",
    "PyTorchRuntime",
    "RuntimeOptionError",
    "autocast_kwargs",
    "get_runtime",
    "iter_runtime_modules",
    "named_runtime_modules",
    "tag_module",
]

DeviceLike = str | torch.device
#: PPE's name for the attribute ``ppe.to`` sets on every module it moves.
_RUNTIME_TAG_NAME = "_ppe_runtime"


class BaseRuntime:
    """Device-specific callbacks used by ``ppe.to``, the Handler, the Trainer and the Evaluator.

    A plugin subclasses this for its device and registers the class for a device type. A
    subclass must provide :meth:`move_module` and :meth:`move_tensor`; every other method has a
    working default (``convert_batch`` maps ``move_tensor`` over the batch, ``execute`` runs a
    code block, the step callbacks do nothing), so a runtime written against PPE that implements
    only the data movement trains end to end. Each method's docstring says who calls it and
    when (the runtime contract table in ``docs/plugins.md`` lists them all).

    Args:
        device_spec: The device modules and tensors go to, e.g. ``"cuda:1"``.
        options: Runtime options (``ppe.to(options=...)``, ``create_trainer(runtime_options=...)``).
            A class that declares :attr:`accepted_options` in its own body rejects other keys
            with :class:`~ppe_core.errors.ConfigurationError`; a class that does not (any
            PPE-style runtime) receives every key, as in PPE.
    """

    #: Option keys this runtime understands; declared in a class body, other keys are rejected
    #: at construction. ``None``: not declared, any key is accepted.
    accepted_options: ClassVar[frozenset[str] | None] = None

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        self.device_spec = device_spec
        self.options: dict[str, Any] = dict(options or {})
        reject_undeclared(type(self), self.options)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickles the runtime with the module it tags; a runtime that cannot be pickled
        unpickles as no runtime, so the module still saves (as in PPE, where the tag never
        travels) and the copy is moved again with ``ppe.to``."""
        key = id(self)
        if key in _CHECKING:  # its state reaches the runtime again: the outer check decides
            return super().__reduce_ex__(protocol)
        _CHECKING.add(key)
        try:
            reduced = super().__reduce_ex__(protocol)
            pickle.dumps(reduced, protocol)  # its state may hold unpicklable objects
        except Exception:
            return (type(None), ())  # NoneType() is None: no runtime
        finally:
            _CHECKING.discard(key)
        return reduced

    # Data and module movement -------------------------------------------------------------
    def convert_batch(self, args: Any) -> Any:
        """Move a batch to the device with :meth:`move_tensor`.

        Tensors nested in dicts, lists, tuples and namedtuples are moved and the container
        types kept; anything else passes through unchanged.
        """
        return map_tensors(args, self.move_tensor)

    def _convert_batch_dict(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """PPE's helper: a dict batch with its top-level tensors moved (subclasses call it)."""
        move = self.move_tensor
        return {k: move(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` to the device and return it (possibly a new object)."""
        raise NotImplementedError(f"{type(self).__name__} must implement move_module")

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` on the device."""
        raise NotImplementedError(f"{type(self).__name__} must implement move_tensor")

    def initialize_module(
        self,
        module: torch.nn.Module,
        loader_or_batch: Iterable[Any] | torch.Tensor | None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """Prepare ``module`` once before the first training or evaluation step.

        The Handler calls it at setup for each module ``ppe.to`` tagged: once when training
        starts, with the training loader (a dict of loaders gives the module's own entry) and
        the module's optimizer (the optimizer keyed like the module, else the only optimizer,
        else ``None``); and once when its first evaluation starts, with the validation loader
        and ``optimizer=None``. A runtime may use the optimizer to copy settings such as the
        learning rate to a device copy of the module.
        """

    # Trainer callbacks ----------------------------------------------------------------------
    def train_epoch_begin(self, module: torch.nn.Module) -> None:
        """Called at the start of every training epoch."""

    def train_epoch_end(self, module: torch.nn.Module) -> None:
        """Called at the end of every training epoch."""

    def train_pre_step(
        self, trainer: Any, module: torch.nn.Module, batch_idx: int, batch: Any
    ) -> None:
        """Called before every training step, before the batch is converted."""

    def train_post_step(
        self, trainer: Any, module: torch.nn.Module, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        """Called after every training step, after the optimizers stepped."""

    def train_validation_begin(self, module: torch.nn.Module) -> None:
        """Called when the trainer starts a validation pass."""

    def train_validation_end(self, module: torch.nn.Module) -> None:
        """Called when the trainer's validation pass ends."""

    def train_cleanup(self, module: torch.nn.Module) -> None:
        """Called once when training ends, successfully or not."""

    # Evaluator callbacks --------------------------------------------------------------------
    def eval_pre_step(
        self, evaluator: Any, module: torch.nn.Module, batch_idx: int, batch: Any
    ) -> None:
        """Called before every evaluation step."""

    def eval_post_step(
        self, evaluator: Any, module: torch.nn.Module, batch_idx: int, batch: Any, outs: Any
    ) -> None:
        """Called after every evaluation step."""

    # Performance ----------------------------------------------------------------------------
    def peak_flops(self) -> float | None:
        """The device's peak FLOP/s for the precision this runtime computes in, or None when
        unknown (the default: no guess). ``Throughput`` divides by it for ``mfu``; called once
        per run, never per step."""
        return None

    # Reproducibility ------------------------------------------------------------------------
    def rng_state(self) -> Any:
        """The device's RNG state for snapshots (``None``: the device has none of its own).

        Must be loadable with ``torch.load(weights_only=True)`` (tensors and plain types).
        """
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore a state returned by :meth:`rng_state` when resuming."""

    # Code blocks ----------------------------------------------------------------------------
    def execute(self, code_block: CodeBlock, batch: Any) -> Any:
        """Run a code block (``ppe.handler.forward`` / ``update_parameters``) on this device.

        Called whenever a code block is called: every training and evaluation step of
        ``CodeBlockLogic`` (``logic="codeblock"``), each item of ``ppe.map``, and blocks user
        code builds. The default ``Logic`` does not build code blocks: it runs forward and
        backward itself, so a runtime that must see whole steps is used with ``CodeBlockLogic``.

        The default zeroes the block's optimizers' gradients, calls its function with the
        batch (a dict as keyword arguments, a list/tuple as positional ones, else as the one
        argument), backpropagates when the block asks for it, steps the optimizers and returns
        the function's outputs. Devices that compile or stage work override it.
        """
        return run_code_block(code_block, batch)

    def map(
        self,
        func: CodeBlock,
        iterable: Iterable[Any],
        out_keys: set[str] | None = None,
        device: Any = "cpu",
    ) -> Iterable[Any]:
        """Apply ``func`` to each item of ``iterable`` lazily; called by ``ppe.map``.

        Yields each output with only ``out_keys`` kept (when given; the output must be a dict)
        and its tensors moved to ``device``. Devices that can overlap transfers and compute
        override it.
        """
        for data in iterable:
            out = func(data)
            if out_keys is not None:
                check_map_output(out, out_keys)
                out = {key: out[key] for key in out_keys}
            yield map_tensors(out, lambda t: t.to(device))

    @classmethod
    def trace(cls, event_name: str | None, arg: Any) -> AbstractContextManager[Any]:
        """A context manager that labels a region for the device's profiler (no-op here).

        ``ppe.profiler.record(tag, device=...)`` (and ``record_function`` /
        ``record_iterable``) enter ``trace(tag, None)`` of the runtime class registered for
        the device type when that class overrides this method; otherwise the region is a
        ``torch.profiler`` range.
        """
        return contextlib.nullcontext()


class PyTorchRuntime(BaseRuntime):
    """The generic runtime: any device PyTorch itself supports, through ``.to(device)``.

    It makes no assumption about a particular device, so 'mps', 'xpu' or 'meta' work without a
    plugin. Device plugins subclass it to add what their hardware needs.

    Options (used by :meth:`execute`, i.e. code blocks and ``CodeBlockLogic``):
        autocast: ``True``, or a dict of ``torch.autocast`` arguments (``enabled`` defaults to
            true, ``device_type`` to this runtime's device type).
        grad_scaler: A ``torch.amp.GradScaler`` that scales the losses a code block
            backpropagates and steps its optimizers.
    """

    accepted_options: ClassVar[frozenset[str] | None] = frozenset({"autocast", "grad_scaler"})

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        # convert_batch may call tensor.to() directly unless a subclass moves tensors itself.
        self._plain_move = type(self).move_tensor is PyTorchRuntime.move_tensor
        try:
            #: The ``torch.device`` this runtime moves data to.
            self.device = torch.device(device_spec)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise device_spec_error(type(self).__name__, device_spec, exc) from exc
        self._on_cpu = self.device.type == "cpu"
        #: ``torch.autocast`` arguments code blocks run under (``None``: off).
        self.autocast = autocast_kwargs(self.options.get("autocast"), self.device.type)
        check_grad_scaler(self.options.get("grad_scaler"), self.device.type)

    def convert_batch(self, args: Any) -> Any:
        move = self.move_tensor
        if type(args) is dict:  # the common batch: one level of tensors, done inline
            device, plain = self.device, self._plain_move
            if plain and self._on_cpu:
                # Every value a CPU tensor already (the CPU runtime's usual batch): a shallow
                # copy, no per-tensor call. ``is_cpu`` is a flag; ``.device`` builds an object.
                for v in args.values():
                    if type(v) is not _Tensor or not v.is_cpu:
                        break
                else:
                    return dict(args)
            # ``v.to(device)`` returns ``v`` itself when it is already there; comparing the
            # device first skips that call's argument parsing (a third of its cost).
            return {
                k: ((v if v.device == device else v.to(device)) if plain else move(v))
                if isinstance(v, torch.Tensor)
                else map_tensors(v, move)
                for k, v in args.items()
            }
        return map_tensors(args, move)

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(self.device)

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device)

    def execute(self, code_block: CodeBlock, batch: Any) -> Any:
        """Run a code block as :meth:`BaseRuntime.execute`, with the autocast/scaler options."""
        return run_code_block(code_block, batch, self.autocast, self.options.get("grad_scaler"))

    @classmethod
    def trace(cls, event_name: str | None, arg: Any) -> AbstractContextManager[Any]:
        """Label the region ``event_name`` in the PyTorch profiler."""
        if event_name is None:
            return contextlib.nullcontext()
        return torch.autograd.profiler.record_function(event_name)


def autocast_kwargs(option: Any, device_type: str) -> dict[str, Any] | None:
    """``torch.autocast`` keyword arguments for the ``autocast`` option (``None``: off), for
    every runtime: ``True`` or a dict of ``torch.autocast`` arguments, whose ``device_type``
    defaults to ``device_type`` and ``enabled=False`` switches it off (PPE's
    ``_autocast.py``). ``DeviceRuntime`` adds its forms on top (``device_autocast_kwargs``)."""
    if option is None or option is False:
        return None
    check_autocast_option(option)
    kwargs = {} if option is True else dict(option)
    kwargs.setdefault("device_type", device_type)
    return kwargs if kwargs.pop("enabled", True) else None


def map_tensors(
    obj: Any,
    fn: Callable[[torch.Tensor], torch.Tensor],
    leaf: Callable[[Any], Any] | None = None,
) -> Any:
    """Apply ``fn`` to every tensor in nested dicts, lists, tuples and namedtuples.

    Container types are kept, including a module ``state_dict``'s ``OrderedDict`` with its
    ``_metadata`` (which ``load_state_dict`` reads). Anything else is passed to ``leaf``
    (e.g. ``copy.deepcopy`` for a snapshot's private copy), or returned as it is.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        converted = {k: map_tensors(v, fn, leaf) for k, v in obj.items()}
        return converted if type(obj) is dict else _as_mapping_type_of(obj, converted)
    if isinstance(obj, tuple):
        items = [map_tensors(v, fn, leaf) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)  # namedtuple
    if isinstance(obj, list):
        return [map_tensors(v, fn, leaf) for v in obj]
    return obj if leaf is None else leaf(obj)


def _as_mapping_type_of(obj: Mapping[Any, Any], converted: dict[Any, Any]) -> Any:
    """``converted`` as ``obj``'s own mapping type (an ``OrderedDict``, a subclass), with a
    module ``state_dict``'s ``_metadata``; a plain dict when that type cannot be built from one."""
    try:
        result = type(obj)(converted)  # type: ignore[call-arg]
    except TypeError:
        return converted
    metadata = getattr(obj, "_metadata", None)
    if metadata is not None:
        result._metadata = metadata.copy()  # type: ignore[attr-defined]
    return result


#: Runtimes whose picklability is being checked (see ``BaseRuntime.__reduce_ex__``).
_CHECKING: set[int] = set()


def tag_module(module: torch.nn.Module, runtime: BaseRuntime) -> None:
    """Record ``runtime`` on ``module`` and every submodule, as ``ppe.to`` does after a move.

    The Handler later finds each tagged module's runtime (:func:`iter_runtime_modules`); a
    later call on a submodule re-tags that branch.
    """
    for sub in module.modules():
        object.__setattr__(sub, _RUNTIME_TAG_NAME, runtime)


def get_runtime(module: object) -> BaseRuntime | None:
    """The runtime ``ppe.to`` tagged ``module`` with, or ``None``.

    Any object may be asked (a code block's owner need not be a module); for a module only its
    own tag counts, not an attribute inherited from its class.
    """
    if isinstance(module, torch.nn.Module):
        runtime = module.__dict__.get(_RUNTIME_TAG_NAME)
    else:
        runtime = getattr(module, _RUNTIME_TAG_NAME, None)
    return runtime if isinstance(runtime, BaseRuntime) else None


def iter_runtime_modules(
    module: torch.nn.Module, prefix: str = "", *, _parent: BaseRuntime | None = None
) -> Iterator[tuple[str, torch.nn.Module, BaseRuntime]]:
    """Yield ``(name, submodule, runtime)`` for the top-most tagged module on each branch.

    A submodule re-tagged with a different runtime (moved to another device) is yielded too
    (``_parent``: the runtime of the branch above, for the recursion).
    """
    runtime = get_runtime(module)
    if runtime is not None and runtime is not _parent:
        yield prefix, module, runtime
        _parent = runtime
    for name, child in module.named_children():
        yield from iter_runtime_modules(
            child, f"{prefix}.{name}" if prefix else name, _parent=_parent
        )


# PPE's helpers under PPE's names -----------------------------------------------------------
def named_runtime_modules(
    module: torch.nn.Module,
    module_name: str = "",
    first_level: bool = True,
    recursive: bool = True,
) -> Iterator[tuple[str, torch.nn.Module]]:
    """PPE's walk: ``(name, module)`` of the top-most tagged module on each branch.

    Unlike :func:`iter_runtime_modules`, names are the module's own attribute name (not a
    dotted path), tagged modules nested in a tagged module are not yielded, and with
    ``recursive=False`` only the direct children of an untagged ``module`` are looked at.
    """
    if get_runtime(module) is not None:
        yield module_name, module
        return
    if first_level or recursive:
        for child_name, child in module.named_children():
            yield from named_runtime_modules(child, child_name, False, recursive)


#: PPE's name for :func:`get_runtime`.
_module_runtime_tag = get_runtime


def _set_module_runtime_tag(module: torch.nn.Module, runtime: BaseRuntime) -> None:
    """Tag ``module`` alone (not its submodules) with ``runtime``, as PPE's helper does."""
    object.__setattr__(module, _RUNTIME_TAG_NAME, runtime)


def device_spec_error(owner: str, device_spec: object, exc: Exception) -> ConfigurationError:
    """Why ``torch.device`` refused ``device_spec`` (``exc``), for the runtime class ``owner``."""
    return ConfigurationError(
        f"{owner} cannot use the device {device_spec!r}: {exc}. Pass a device type with an "
        "optional index, e.g. 'cpu', 'cuda' or 'cuda:1'."
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


def check_map_output(out: object, out_keys: set[str]) -> None:
    """``ppe.map`` with ``out_keys`` needs functions that return a dict."""
    if not isinstance(out, Mapping):
        raise ConfigurationError(
            f"ppe.map was given out_keys={sorted(out_keys)}, but the function "
            f"returned {type(out).__name__}, not a dict; return a dict or omit out_keys"
        )
