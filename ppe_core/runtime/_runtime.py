"""The runtime contract (``BaseRuntime``) and the generic ``PyTorchRuntime``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from ppe_core.errors import ConfigurationError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

__all__ = [
    "BaseRuntime",
    "DeviceLike",
    "PyTorchRuntime",
    "get_runtime",
    "iter_runtime_modules",
]

DeviceLike = str | torch.device
_TAG = "_ppe_runtime"
_T = TypeVar("_T")


class BaseRuntime:
    """Device-specific callbacks used by ``ppe.to``, the Handler, the Trainer and the Evaluator.

    A plugin subclasses this for its device and registers the class for a device type. Every
    method has a no-op or pass-through default except the data-movement ones, so a subclass
    only writes what its device needs.

    Args:
        device_spec: The device modules and tensors go to, e.g. ``"cuda:1"``.
        options: Runtime options; keys not in :attr:`accepted_options` raise
            :class:`~ppe_core.errors.ConfigurationError`.
    """

    #: Option keys this runtime understands; anything else is rejected at construction.
    accepted_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        self.device_spec = device_spec
        self.options: dict[str, Any] = dict(options or {})
        unknown = sorted(set(self.options) - self.accepted_options)
        if unknown:
            accepted = ", ".join(sorted(self.accepted_options)) or "(none)"
            raise ConfigurationError(
                f"{type(self).__name__} does not understand the runtime option(s) "
                f"{', '.join(map(repr, unknown))}; accepted options: {accepted}. "
                "Remove them from runtime_options / ppe.to(options=...)."
            )

    # Data and module movement -------------------------------------------------------------
    def convert_batch(self, args: Any) -> Any:
        """Move a batch (tensors nested in dicts/lists/tuples/namedtuples) to the device."""
        raise NotImplementedError(f"{type(self).__name__} must implement convert_batch")

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` to the device and return it (possibly a new object)."""
        raise NotImplementedError(f"{type(self).__name__} must implement move_module")

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` on the device."""
        raise NotImplementedError(f"{type(self).__name__} must implement move_tensor")

    def initialize_module(
        self,
        module: torch.nn.Module,
        loader_or_batch: Iterable[Any] | Any,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """Prepare ``module`` once before the first training or evaluation step."""

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

    # Reproducibility ------------------------------------------------------------------------
    def rng_state(self) -> Any:
        """The device's RNG state for snapshots (``None``: the device has none of its own).

        Must be loadable with ``torch.load(weights_only=True)`` (tensors and plain types).
        """
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore a state returned by :meth:`rng_state` when resuming."""

    # Execution ------------------------------------------------------------------------------
    def execute(self, code_block: Callable[[Any], _T], batch: Any) -> _T:
        """Run one step's code on this device; devices that compile or stage work override it."""
        return code_block(batch)

    @classmethod
    def trace(cls, event_name: str | None, arg: Any) -> AbstractContextManager[Any]:
        """A context manager that labels a region for the device's profiler (no-op here)."""
        return contextlib.nullcontext()


class PyTorchRuntime(BaseRuntime):
    """The generic runtime: any device PyTorch itself supports, through ``.to(device)``.

    It makes no assumption about a particular device, so 'mps', 'xpu' or 'meta' work without a
    plugin. Device plugins subclass it to add what their hardware needs.
    """

    def __init__(self, device_spec: DeviceLike, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_spec, options)
        # convert_batch may call tensor.to() directly unless a subclass moves tensors itself.
        self._plain_move = type(self).move_tensor is PyTorchRuntime.move_tensor
        try:
            self._device = torch.device(device_spec)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{type(self).__name__} cannot use the device {device_spec!r}: {exc}. Pass a "
                "device type with an optional index, e.g. 'cpu', 'cuda' or 'cuda:1'."
            ) from exc

    @property
    def device(self) -> torch.device:
        """The ``torch.device`` this runtime moves data to."""
        return self._device

    def convert_batch(self, args: Any) -> Any:
        move = self.move_tensor
        if type(args) is dict:  # the common batch: one level of tensors, done inline
            device, plain = self._device, self._plain_move
            return {
                k: (v.to(device) if plain else move(v))
                if isinstance(v, torch.Tensor)
                else _map_tensors(v, move)
                for k, v in args.items()
            }
        return _map_tensors(args, move)

    def move_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(self._device)

    def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self._device)


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in a nested structure, keeping container types."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        converted = {k: _map_tensors(v, fn) for k, v in obj.items()}
        if type(obj) is dict:
            return converted
        try:
            return type(obj)(converted)  # type: ignore[call-arg]  # OrderedDict, subclasses
        except TypeError:
            return converted
    if isinstance(obj, tuple):
        items = [_map_tensors(v, fn) for v in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items) if type(obj) is not tuple else tuple(items)
    if isinstance(obj, list):
        return [_map_tensors(v, fn) for v in obj]
    return obj


def _tag(module: torch.nn.Module, runtime: BaseRuntime) -> None:
    """Record ``runtime`` on ``module`` and every submodule (a later ``ppe.to`` re-tags)."""
    for sub in module.modules():
        object.__setattr__(sub, _TAG, runtime)


def get_runtime(module: torch.nn.Module) -> BaseRuntime | None:
    """The runtime ``ppe.to`` tagged ``module`` with, or ``None``."""
    runtime = module.__dict__.get(_TAG)
    return runtime if isinstance(runtime, BaseRuntime) else None


def iter_runtime_modules(
    module: torch.nn.Module, prefix: str = ""
) -> Iterator[tuple[str, torch.nn.Module, BaseRuntime]]:
    """Yield ``(name, submodule, runtime)`` for the top-most tagged module on each branch.

    A submodule re-tagged with a different runtime (moved to another device) is yielded too.
    """
    yield from _walk(module, prefix, None)


def _walk(
    module: torch.nn.Module, name: str, parent_runtime: BaseRuntime | None
) -> Iterator[tuple[str, torch.nn.Module, BaseRuntime]]:
    runtime = get_runtime(module)
    if runtime is not None and runtime is not parent_runtime:
        yield name, module, runtime
        parent_runtime = runtime
    for child_name, child in module.named_children():
        yield from _walk(child, f"{name}.{child_name}" if name else child_name, parent_runtime)
