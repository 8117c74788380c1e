"""Logics: the math of one training/evaluation step (zero_grad, forward, backward, step)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from ppe_core.errors import (
    AMPOptionError,
    ConfigurationError,
    ModelOutputError,
)
from ppe_core.handler._accumulation import Accumulation, no_sync
from ppe_core.handler._clipping import ClipOptions, GradClipper, build_clipper, pop_clip_options
from ppe_core.handler._diagnostics import (
    GradientWatch,
    check_autocast_device,
    check_closure_options,
    check_logic_options,
    check_something_trains,
    explain_dtype_mismatch,
    explain_forward_mismatch,
    non_scalar_backward,
    unknown_name_error,
    warn_nothing_backpropagated,
    warn_skipped_backward,
)
from ppe_core.handler._grad_scalers import load_scaler_states, scaler_states
from ppe_core.handler._optimizer_targets import (
    OptimizerTarget,
    Plan,
    own_scalers,
    parse_targets,
    plan_stages,
)
from ppe_core.runtime import (
    autocast_device_type_of,
    device_type_of,
    get_runtime,
)
from ppe_core.runtime._execute import call_with_batch

_T = TypeVar("_T")

#: The options :class:`Logic` takes (a ``BaseLogic`` subclass takes none of them).
LOGIC_OPTIONS = (
    "backward_outputs",
    "backward_function",
    "autocast",
    "grad_scaler",
    "grad_accumulation_steps",
    "optimizers",
    "grad_clip_norm",
    "grad_clip_norm_type",
    "grad_clip_value",
)


def set_sampler_epoch(loader: Iterable[Any], epoch: int) -> None:
    """Calls ``set_epoch(epoch)`` on the loader's sampler(s) that have it, once each.

    ``DistributedSampler`` reshuffles per epoch only when told the epoch. Looks at
    ``loader.sampler`` (as PPE) and at ``loader.batch_sampler.sampler`` (a custom batch sampler
    wrapping a distributed sampler).
    """
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    for target in (sampler, inner if inner is not sampler else None):
        if target is not None and hasattr(target, "set_epoch"):
            target.set_epoch(epoch)


def switch_mode(models: Iterable[torch.nn.Module], training: bool) -> None:
    """Puts ``models`` in train (``True``) or eval mode: the one place ppe-core switches modes
    (the logics' epoch and validation callbacks, the handler's setups, :func:`keep_modes`)."""
    for model in models:
        model.train(training)


def keep_modes(
    models: Iterable[torch.nn.Module], training: bool | None = None
) -> Callable[[], None]:
    """Remembers each model's mode, then switches them to ``training`` when it is given; the
    function returned puts each back in the mode it had (the evaluators call it when a pass
    ends, also after an error: an evaluation leaves the modes as it found them)."""
    kept = [(model, model.training) for model in models]
    if training is not None:
        switch_mode((model for model, _ in kept), training)

    def restore() -> None:
        for model, mode in kept:
            switch_mode((model,), mode)

    return restore


@contextlib.contextmanager
def torch_autocast(enabled: bool = True) -> Iterator[None]:
    """PPE's deprecated autocast helper: autocast on the default accelerator, if there is one.

    The device is the one ``device="auto"`` resolves to through the plugins; on a CPU-only setup
    this is a no-op, as PPE's helper is without CUDA. Prefer ``options={"autocast": ...}``.
    """
    from ppe_core._resolve import resolve_device

    try:
        device_type = device_type_of(resolve_device("auto"))
    except ConfigurationError:
        device_type = "cpu"
    cpu = device_type == "cpu"
    with contextlib.nullcontext() if cpu else torch.autocast(device_type, enabled=enabled):
        yield


def normalize_outputs(outputs: Any) -> Mapping[str, Any]:
    """Outputs keyed by name: a dict as is, a namedtuple by field, a list/tuple by index."""
    if isinstance(outputs, Mapping):
        return outputs
    if isinstance(outputs, tuple) and hasattr(outputs, "_asdict"):
        return outputs._asdict()  # type: ignore[no-any-return]
    if isinstance(outputs, (list, tuple)):
        return {str(i): value for i, value in enumerate(outputs)}
    return {"0": outputs}


#: PPE's private name, for subclasses written against ``pytorch_pfn_extras.handler._logic``.
_normalize_outputs = normalize_outputs


class _AutocastManager:
    """How the Logic's forward runs under ``torch.autocast`` (PPE's ``Logic._autocast``).

    Subclasses write ``with self._autocast.autocast(): ...``. Without a ``device_type``
    option the device type is that of the model's runtime, bound when training starts.
    """

    def __init__(self, options: bool | Mapping[str, Any]) -> None:
        kwargs: dict[str, Any] = (
            dict(options) if isinstance(options, Mapping) else {"enabled": bool(options)}
        )
        #: Whether the forward runs under autocast at all (read every step: a plain attribute).
        self.enabled = bool(kwargs.pop("enabled", True))
        #: ``torch.autocast``'s arguments; ``device_type`` the option's, else bound from the
        #: model's runtime.
        self._options = kwargs

    @property
    def _enabled(self) -> bool:
        """PPE's private name of :attr:`enabled`, for subclasses written against PPE."""
        return self.enabled

    def bind(self, device_type: str) -> None:
        """Use ``device_type`` unless the options named one (checked once, here, so torch's
        own error for a device type without autocast never reaches the first step). Autocast
        off needs no device type: nothing changes."""
        if self.enabled and "device_type" not in self._options:
            check_autocast_device(device_type)
            self._options["device_type"] = device_type

    def bind_to(self, model: torch.nn.Module) -> None:
        """:meth:`bind` to the device type of ``model``'s runtime, if it has one (a Logic driven
        without the Handler's setup binds at its first step)."""
        runtime = get_runtime(model)
        if runtime is not None:
            self.bind(autocast_device_type_of(runtime))

    def autocast(self, enabled: bool = True) -> contextlib.AbstractContextManager[Any]:
        """The context the forward runs in (a no-op context when autocast is off)."""
        if not (self.enabled and enabled):
            return contextlib.nullcontext()
        return torch.autocast(**{"device_type": "cpu", **self._options})


class BaseLogic:
    """The step callbacks the Handler calls; subclass it for custom flows (GANs, RL, ...).

    Each method receives the trainer's ``models`` and ``optimizers`` dicts, so a subclass can
    drive several models and optimizers per step. As in PPE, ``train_step_optimizers`` does
    nothing here: a subclass steps its optimizers in ``train_step`` or overrides it.

    Args:
        options: Options for :meth:`consume_options` (the dict is copied, not modified).
    """

    #: ``(outputs, named)``: the outputs this logic's step normalised last, and the mapping
    #: (see :meth:`named_outputs`).
    _named: tuple[Any, Mapping[str, Any]] | None = None

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.consume_options(dict(options or {}))

    def named_outputs(self, outputs: Any) -> Mapping[str, Any]:
        """``outputs`` keyed by name (:func:`normalize_outputs`), for the handler's report.

        When this logic's step already keyed these very outputs (a tuple's backward needs
        the keys), that mapping is handed on, once: a step's outputs are normalised once.
        """
        named = self._named
        if named is not None and named[0] is outputs:
            self._named = None
            return named[1]
        return normalize_outputs(outputs)

    def _keyed(self, outputs: Any) -> Mapping[str, Any]:
        """``outputs`` keyed by name, kept for :meth:`named_outputs` (a dict is its own)."""
        if type(outputs) is dict:
            return outputs
        named = normalize_outputs(outputs)
        self._named = (outputs, named)
        return named

    def consume_options(self, options: dict[str, Any]) -> None:
        """Pop the options this logic understands from ``options``; options not given keep
        their current values, so ``create_trainer(options=...)`` adds to the constructor's."""

    def train_epoch_begin(
        self, models: Mapping[str, torch.nn.Module], epoch: int, loader: Iterable[Any]
    ) -> None:
        """Called at the start of each epoch (default: put every model in train mode)."""
        self.set_mode(models, True)

    def train_epoch_end(self, models: Mapping[str, torch.nn.Module], epoch: int) -> None:
        """Called at the end of each epoch."""

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        """Compute one step's outputs and gradients; return the outputs."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_step")

    def train_step_optimizers(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
    ) -> None:
        """Apply the gradients after ``train_step`` (default: nothing, as in PPE)."""

    def train_validation_begin(self, models: Mapping[str, torch.nn.Module]) -> None:
        """Called before a validation pass during training (default: eval mode)."""
        self.set_mode(models, False)

    def train_validation_end(self, models: Mapping[str, torch.nn.Module]) -> None:
        """Called after a validation pass during training (default: back to train mode)."""
        self.set_mode(models, True)

    def set_mode(self, models: Mapping[str, torch.nn.Module], training: bool) -> None:
        """Puts the models this logic runs in train (``True``) or eval mode (at epochs and
        validation passes, through :func:`switch_mode`). Default: every model."""
        switch_mode(models.values(), training)

    def eval_step(self, models: Mapping[str, torch.nn.Module], batch_idx: int, batch: Any) -> Any:
        """Compute one evaluation step's outputs (called under ``torch.no_grad``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement eval_step")

    def bind_device(self, device_type: str) -> None:
        """Called by the Handler at setup with the device type of this logic's model.

        The device type is that of the runtime ``ppe.to`` tagged the model with (the model named
        by ``model_name``, else the first tagged one), so device-dependent settings such as
        autocast need not repeat the device. Default: nothing.
        """

    def offer_grad_scaler(self, scaler: torch.amp.GradScaler) -> None:
        """Called by the Handler at setup with the scaler the model's runtime created or was
        given (e.g. ppe_cuda with fp16 autocast). Default: ignore it; :class:`Logic` adopts it
        when no ``grad_scaler`` option was given, so runtime-level mixed precision needs no
        extra option."""

    def get_grad_scaler(self) -> torch.amp.GradScaler | None:
        """The ``torch.amp.GradScaler`` this logic scales losses with, or ``None``.

        The Handler saves its state in snapshots. The default returns the ``_grad_scaler``
        attribute that PPE's logics (and subclasses written for them) set.
        """
        scaler = getattr(self, "_grad_scaler", None)
        return scaler if isinstance(scaler, torch.amp.GradScaler) else None

    def state_dict(self) -> dict[str, Any]:
        """State to save in snapshots (none here); see :meth:`Logic.state_dict`."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (nothing here)."""


class ModelLogic(BaseLogic):
    """The shared base of the logics that train one of the models (:class:`Logic`,
    ``CodeBlockLogic``): the model named ``model_name``, and the optimizer of the same key.

    It owns what they share: the lookups with their explained errors and the mode switching,
    which touches that model only (train at an epoch's start and after validation, eval at an
    epoch's end and for validation).

    Args:
        model_name: The key of the model (and optimizer) this logic trains.
        options: Options for :meth:`consume_options`.
    """

    def __init__(self, model_name: str = "main", options: Mapping[str, Any] | None = None) -> None:
        self.model_name = model_name
        super().__init__(options)

    def set_mode(self, models: Mapping[str, torch.nn.Module], training: bool) -> None:
        """Switches this logic's model only."""
        switch_mode((self._lookup(models, "model"),), training)

    def train_epoch_end(self, models: Mapping[str, torch.nn.Module], epoch: int) -> None:
        self.set_mode(models, False)

    def _lookup(self, items: Mapping[str, _T], kind: str) -> _T:
        """The ``kind`` ("model" or "optimizer") keyed ``model_name``, or the explained error."""
        try:
            return items[self.model_name]
        except KeyError:  # only on the first step of a misconfigured run
            raise self._unknown_name(items, kind) from None

    def _unknown_name(self, items: Mapping[str, Any], kind: str) -> ConfigurationError:
        """The explained error for a ``kind`` keyed ``model_name`` missing from ``items``."""
        cls = type(self)
        logic = ("ppe.handler." if cls in (Logic, ModelLogic) else "") + cls.__name__
        return unknown_name_error(logic, self.model_name, kind, sorted(items))


class Logic(ModelLogic):
    """The standard supervised step for one model: zero_grad, forward, backward, step.

    The batch is passed to ``forward`` as keyword arguments when it is a dict, as positional
    arguments when it is a list/tuple, else as the single argument. The outputs may be a
    dict, a (named) tuple or list (keys ``"0"``, ``"1"``, ... or the field names) or a single
    tensor (key ``"0"``).

    Options:
        backward_outputs: Output key, or list of keys, to backpropagate (default: every
            floating scalar tensor output that has a graph). All are backpropagated in one
            pass, gradients summed. A named key that is missing or has no graph is skipped
            with a :class:`BackwardOutputWarning`.
        backward_function: ``fn(tensor)`` used instead of ``tensor.backward()``.
        autocast: ``True``/``False`` or a dict of ``torch.autocast`` keyword arguments
            (``device_type``, ``dtype``, ``enabled``, ...); without ``device_type`` the device
            type is that of the model's runtime, the dtype PyTorch's default for it.
        grad_scaler: A ``torch.amp.GradScaler`` (any device) used to scale the loss.
        grad_accumulation_steps: Accumulate gradients over this many batches before an
            optimizer step; losses are divided by the window size so the update equals one
            step on the concatenated batch. Windows restart at each epoch.
        optimizers: Several optimizers, each with its own target: a dict keyed by the
            trainer's optimizer names, ``{"gen": {"model": ..., "loss": ..., "grad_scaler":
            ...}, ...}`` (every key optional; defaults: ``model_name``, ``backward_outputs``,
            the ``grad_scaler``), or a list of names. Each model named runs its forward once
            per step, in the order first named; each optimizer's loss is backpropagated to
            that optimizer's parameters only (when there are several losses), then the
            model's optimizers step before the next model's forward. See
            ``docs/handler-logic.md``.
        grad_clip_norm: Clip the gradients of each optimizer's parameters to this total norm
            (``torch.nn.utils.clip_grad_norm_``) right before it steps: after the grad
            scaler unscaled them, once per accumulation window, over every rank's gradients
            (DDP, FSDP2). A number for every optimizer, or ``{optimizer name: max_norm}``.
            The norm before clipping is reported as ``train/grad_norm`` (with several
            optimizers ``train/<name>/grad_norm``), a tensor: nothing waits for the device.
        grad_clip_norm_type: The p of that norm (default 2.0; ``math.inf``: the largest).
        grad_clip_value: Clamp each gradient element to ``[-value, value]``
            (``torch.nn.utils.clip_grad_value_``), at the same point; a number or a dict.
            One optimizer takes a norm or a value, not both.

    Args:
        model_name: The key of the model (and optimizer) this logic trains.
        options: The options above.
    """

    # Defaults, until options or a step change them.
    backward_outputs: str | list[str] | tuple[str, ...] | None = None
    _backward_fn: Callable[[torch.Tensor], Any] | None = None
    _autocast = _AutocastManager(False)  # off: never bound, so it can be shared
    _grad_scaler: torch.amp.GradScaler | None = None
    #: The ``grad_accumulation_steps`` option (1: no accumulation).
    grad_accumulation_steps: int = 1
    #: The ``optimizers`` option; None: one optimizer, keyed like the model.
    _targets: dict[str, OptimizerTarget] | None = None
    #: The stages planned from ``_targets`` (planned again when the options change).
    _plan: Plan | None = None
    _warned_nothing = False
    #: True until the first training step has checked that the run can train at all.
    _first_step = True
    #: Set when that step trained nothing: checked (and cleared) at the next epoch's start.
    _nograd_watch: GradientWatch | None = None
    #: The clipping options as given so far (the clipper is built from them and the targets).
    _clip_options = ClipOptions()
    #: The clipping options' clipper (None: no clipping).
    _clipper: GradClipper | None = None

    def __init__(self, model_name: str = "main", options: Mapping[str, Any] | None = None) -> None:
        #: The accumulation windows' state (the option is ``grad_accumulation_steps``, which
        #: the step reads every batch).
        self._accumulation = Accumulation()
        super().__init__(model_name, options)

    def consume_options(self, options: dict[str, Any]) -> None:
        super().consume_options(options)
        check_logic_options(options)
        scaler = options.get("grad_scaler")
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise AMPOptionError(
                f"option 'grad_scaler' must be a torch.amp.GradScaler, got "
                f"{type(scaler).__name__}; e.g. options={{'grad_scaler': "
                "torch.amp.GradScaler('cuda')}"
            )
        # An option left out (or None) keeps its current value; the checks above make every
        # given value but autocast's truthy. Each is set on the instance (the class defaults
        # are read once, here): the step reads instance attributes.
        self.backward_outputs = options.pop("backward_outputs", None) or self.backward_outputs
        self._backward_fn = options.pop("backward_function", None) or self._backward_fn
        autocast = options.pop("autocast", None)
        self._autocast = self._autocast if autocast is None else _AutocastManager(autocast)
        self._grad_scaler = options.pop("grad_scaler", None) or self._grad_scaler
        steps = options.pop("grad_accumulation_steps", None)
        self.grad_accumulation_steps = steps or self.grad_accumulation_steps
        given = options.pop("optimizers", None)
        self._targets = self._targets if given is None else parse_targets(given)
        self._plan = None  # planned again at the next step: the options changed
        self._clip_options = pop_clip_options(options, self._clip_options)
        targets = None if self._targets is None else list(self._targets)
        self._clipper = build_clipper(self._clip_options, targets, self.model_name)

    def _model_names(self) -> list[str]:
        """The models this logic trains: its model, or with the ``optimizers`` option every
        model the targets name."""
        if self._targets is None:
            return [self.model_name]
        names = (
            t.model if t.model is not None else self.model_name for t in self._targets.values()
        )
        return list(dict.fromkeys(names))

    def bind_device(self, device_type: str) -> None:
        """Autocast on ``device_type`` unless the ``autocast`` option names a device type."""
        self._autocast.bind(device_type)

    def set_mode(self, models: Mapping[str, torch.nn.Module], training: bool) -> None:
        """Switches this logic's model only; with the ``optimizers`` option, every model it
        names."""
        if self._targets is None:
            super().set_mode(models, training)
        else:  # an unknown name is the plan's to explain
            switch_mode([models[n] for n in self._model_names() if n in models], training)

    def _forward(self, model: torch.nn.Module, batch: Any) -> Any:
        try:
            return call_with_batch(model, batch)
        except TypeError as exc:
            explain_forward_mismatch(model, batch, exc)
            raise
        except RuntimeError as exc:  # free until it fires: nothing per step
            explain_dtype_mismatch(model, batch, exc)
            raise

    def _to_backward(self, outputs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The tensors to backpropagate, chosen as PPE chooses them.

        Without ``backward_outputs``: every floating scalar tensor with a graph. Named keys
        that are missing or have no graph are skipped with a warning (PPE skips them too); a
        named non-scalar is an error before ``backward()`` fails with a message naming
        neither the output nor the fix.
        """
        keys = self.backward_outputs
        tensors = []
        if keys is None:
            # A loop, not a comprehension (no frame per step); ``not is_leaf`` is
            # ``grad_fn is not None`` without wrapping the graph node in a Python object.
            for v in outputs.values():
                if (
                    isinstance(v, torch.Tensor)
                    and not v.is_leaf
                    and (v.ndim == 0 or v.numel() == 1)
                    and (v.dtype.is_floating_point or v.dtype.is_complex)
                ):
                    tensors.append(v)
            if not tensors and not self._warned_nothing:
                self._warned_nothing = warn_nothing_backpropagated(outputs)
            return tensors
        for key in (keys,) if isinstance(keys, str) else keys:
            value = outputs.get(key)
            if not isinstance(value, torch.Tensor) or value.grad_fn is None:
                warn_skipped_backward(key, outputs)
                continue
            if self._backward_fn is None and value.numel() != 1:
                raise non_scalar_backward(key, value)
            if all(value is not t for t in tensors):
                tensors.append(value)
        return tensors

    def _backward(self, outputs: Any, scale: int = 1) -> list[torch.Tensor]:
        """Backpropagate the chosen outputs (``outputs`` raw or normalized), divided by
        ``scale`` (the accumulation window) and scaled by the grad scaler; returns the tensors
        backpropagated (none: nothing was)."""
        named = outputs if type(outputs) is dict else self._keyed(outputs)
        tensors = self._to_backward(named)
        if not tensors:
            return tensors
        if scale != 1:
            tensors = [t / scale for t in tensors]
        if self._grad_scaler is not None:
            tensors = [self._grad_scaler.scale(t) for t in tensors]
        if self._backward_fn is None:
            torch.autograd.backward(tensors)  # what tensor.backward() calls: one frame less
        else:
            for t in tensors:
                self._backward_fn(t)
        return tensors

    # Step callbacks -------------------------------------------------------------------------
    def train_epoch_begin(
        self, models: Mapping[str, torch.nn.Module], epoch: int, loader: Iterable[Any]
    ) -> None:
        super().train_epoch_begin(models, epoch, loader)
        # As PPE's Logic does, so that code driving a Logic directly gets per-epoch shuffling;
        # the handler then leaves it to this method (see Handler.train_epoch_begin).
        set_sampler_epoch(loader, epoch)
        self._accumulation.begin_epoch(loader, models)
        if self._nograd_watch is not None:  # the first step trained nothing: did any since?
            watch, self._nograd_watch = self._nograd_watch, None
            watch.check()

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        if self._targets is not None:
            return self._train_stages(models, optimizers, batch_idx, batch)
        try:  # two subscripts inline, not two helper calls: this runs every step
            model, optimizer = models[self.model_name], optimizers[self.model_name]
        except KeyError:  # raises the explained error
            model, optimizer = self._lookup(models, "model"), self._lookup(optimizers, "optimizer")
        if self.grad_accumulation_steps == 1:
            optimizer.zero_grad()
            return self._forward_backward(model, batch, 1)
        # A window's batch: zero_grad at its first, no gradient reduction before its last
        # (the optimizer steps there, in train_step_optimizers).
        n = self.grad_accumulation_steps
        window, ends = self._accumulation.window(batch_idx, n)
        if batch_idx % n == 0:
            optimizer.zero_grad()
        with contextlib.nullcontext() if ends else no_sync(model):
            return self._forward_backward(model, batch, window)

    def _forward_backward(self, model: torch.nn.Module, batch: Any, window: int) -> Any:
        outputs = self._autocast_forward(model, batch)
        named = outputs if type(outputs) is dict else self._keyed(outputs)
        if window == 1:  # PPE's call: a subclass's ``_backward(self, outputs)`` works
            self._backward(named)
        else:
            self._backward(named, window)
        if self._first_step:  # one attribute test per step; the check itself runs once
            self._check_first_step(model, named)
        return outputs

    def _check_first_step(self, model: torch.nn.Module, named: Mapping[str, Any]) -> None:
        """At the first training step: without ``backward_outputs``, the outputs must let the
        model train (see :func:`check_something_trains`)."""
        self._first_step = False
        if self.backward_outputs is None:
            self._nograd_watch = check_something_trains(model, named)

    def train_step_optimizers(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
    ) -> None:
        if self.grad_accumulation_steps > 1:
            # Inside a window its gradients are training state, which a snapshot then saves.
            if not self._accumulation.window(batch_idx, self.grad_accumulation_steps)[1]:
                self._accumulation.open_window = models
                return
            self._accumulation.open_window = None
        if self._targets is not None:
            self._planned(models, optimizers).stages[-1].step(self._clipper)
            return
        try:
            optimizer = optimizers[self.model_name]
        except KeyError:
            optimizer = self._lookup(optimizers, "optimizer")  # raises the explained error
        clipper = self._clipper
        if clipper is not None:  # the options' clipping: after unscaling, before the step
            clipper.clip(self.model_name, optimizer, self._grad_scaler)
        if self._grad_scaler is None:
            optimizer.step()
        else:
            self._grad_scaler.step(optimizer)
            self._grad_scaler.update()

    def eval_step(self, models: Mapping[str, torch.nn.Module], batch_idx: int, batch: Any) -> Any:
        return self._autocast_forward(self._lookup(models, "model"), batch)

    def _autocast_forward(self, model: torch.nn.Module, batch: Any) -> Any:
        """The model's forward under the Logic's autocast (bound to the model's device on
        first use)."""
        autocast = self._autocast
        if not autocast.enabled:  # the common case: no context object per step
            return self._forward(model, batch)
        if "device_type" not in autocast._options:
            autocast.bind_to(model)
        with autocast.autocast():
            return self._forward(model, batch)

    # The ``optimizers`` option ----------------------------------------------------------------
    def _planned(
        self, models: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]
    ) -> Plan:
        """The stages of the ``optimizers`` option for these trainer dicts, planned when they
        or the options change (see :func:`plan_stages`)."""
        plan = self._plan
        if plan is None or plan.models is not models or plan.optimizers is not optimizers:
            assert self._targets is not None
            plan = self._plan = plan_stages(
                self._targets,
                models,
                optimizers,
                model_name=self.model_name,
                backward_outputs=self.backward_outputs,
                grad_scaler=self._grad_scaler,
                backward_function=self._backward_fn,
            )
        return plan

    def _train_stages(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        """The step with the ``optimizers`` option: each stage in turn zeroes its optimizers,
        runs its model's forward and backpropagates each loss to its own optimizers'
        parameters; the stages before the last step their optimizers here (the next forward
        sees the update), the last in ``train_step_optimizers``."""
        plan = self._planned(models, optimizers)
        n = self.grad_accumulation_steps
        window, ends = (1, True) if n == 1 else self._accumulation.window(batch_idx, n)
        stages = plan.stages
        merged: dict[str, Any] = {}
        for stage in stages:
            model, groups = stage.model, stage.groups
            if batch_idx % n == 0:
                for group in groups:
                    for optimizer in group.optimizers:
                        optimizer.zero_grad()
            with contextlib.nullcontext() if ends else no_sync(model):
                outputs = self._autocast_forward(model, batch)
                named = self._keyed(outputs)
                if not stage.checked:
                    stage.check(named, self.backward_outputs)
                for i, group in enumerate(groups):
                    keys = group.loss
                    tensors = self._to_backward(named) if keys is None else [named[k] for k in keys]
                    if not tensors:
                        continue
                    if window != 1:
                        tensors = [t / window for t in tensors]
                    if group.scaler is not None:
                        tensors = [group.scaler.scale(t) for t in tensors]
                    if self._backward_fn is not None:  # one group: the plan refuses more
                        for t in tensors:
                            self._backward_fn(t)
                    else:
                        # Several groups: only this group's parameters (a generator's loss must
                        # not leave gradients on the discriminator); later ones reuse the graph.
                        inputs = group.parameters() if plan.restrict else None
                        retain = i < len(groups) - 1
                        torch.autograd.backward(tensors, inputs=inputs, retain_graph=retain)
            if len(stages) == 1:
                return outputs
            merged.update(self.named_outputs(outputs))
            if ends and stage is not stages[-1]:
                stage.step(self._clipper)
        return merged

    # Grad scalers and snapshots ---------------------------------------------------------------
    def offer_grad_scaler(self, scaler: torch.amp.GradScaler) -> None:
        """Scale losses with the runtime's scaler unless a ``grad_scaler`` option was given."""
        if self._grad_scaler is None:
            self._grad_scaler = scaler
            self._plan = None

    def state_dict(self) -> dict[str, Any]:
        """``{"grad_scaler": scaler.state_dict()}`` with a grad scaler, else ``{}``; with
        the ``optimizers`` option, also ``"grad_scalers"``: the state of each optimizer's own
        scaler, by optimizer name; inside a gradient-accumulation window, also
        ``"accumulation"``: the window's gradients so far (see ``_accumulation``)."""
        state = scaler_states({"grad_scaler": self._grad_scaler})
        own = own_scalers(self._targets, self._grad_scaler)
        if own:
            state["grad_scalers"] = scaler_states(own)
        state.update(self._accumulation.state_dict(self._model_names()))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the grad scalers' states (each ignored when this logic has no such scaler),
        and keep an unfinished window's gradients for the resumed epoch's start."""
        load_scaler_states({"grad_scaler": self._grad_scaler}, state)
        load_scaler_states(
            own_scalers(self._targets, self._grad_scaler), state.get("grad_scalers", {})
        )
        self._accumulation.load_state_dict(state)


@dataclasses.dataclass
class ClousureModelOutput:
    """What :class:`ClousureLogic`'s closure returns: the outputs, and the loss the optimizer
    reads through ``float()``."""

    outs: Any
    loss: torch.Tensor

    def __float__(self) -> float:
        return float(self.loss)


class ClousureLogic(Logic):
    """The step for optimizers that take a closure (``torch.optim.LBFGS``; PPE's spelling).

    ``train_step`` calls ``optimizer.step(closure)``; the closure zeroes the gradients, runs the
    forward and backward, and may run several times per step. ``train_step_optimizers``
    does nothing. The model must yield one loss to backpropagate (the outputs named by
    ``backward_outputs``, or its single floating scalar output). A ``grad_scaler`` and
    ``grad_accumulation_steps`` are not supported: the closure owns the step.
    """

    def consume_options(self, options: dict[str, Any]) -> None:
        super().consume_options(options)
        if self._grad_scaler is not None:
            raise AMPOptionError(
                "ClousureLogic cannot use a grad_scaler: GradScaler.step does not support "
                "closures. Remove the 'grad_scaler' option, or use ppe.handler.Logic with an "
                "optimizer that needs no closure."
            )
        check_closure_options(self.grad_accumulation_steps, self._targets is not None)
        if self._clipper is not None:
            raise ConfigurationError(
                "ClousureLogic cannot clip gradients: the optimizer evaluates the closure, "
                "maybe several times, inside its own step. Remove the 'grad_clip_norm' / "
                "'grad_clip_value' option, or use ppe.handler.Logic with an optimizer that "
                "needs no closure"
            )

    def offer_grad_scaler(self, scaler: torch.amp.GradScaler) -> None:
        """Ignored: a closure-driven optimizer step cannot be scaled (see above)."""

    def train_step(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        model = self._lookup(models, "model")
        optimizer = self._lookup(optimizers, "optimizer")

        def closure() -> ClousureModelOutput:
            optimizer.zero_grad()
            outs = self._autocast_forward(model, batch)
            # No accumulation window and no grad scaler here: the tensors are the outputs.
            tensors = self._backward(outs)
            if not tensors:
                raise ModelOutputError(
                    "ClousureLogic found no loss to backpropagate in the model's outputs; "
                    "return the loss (e.g. {'loss': loss}) or name it with "
                    "options={'backward_outputs': ['loss']}."
                )
            loss = tensors[0] if len(tensors) == 1 else torch.stack(tensors).sum()
            return ClousureModelOutput(outs=outs, loss=loss)

        result = optimizer.step(closure)  # type: ignore[arg-type]
        if not isinstance(result, ClousureModelOutput):
            raise ModelOutputError(
                f"optimizer.step(closure) returned {type(result).__name__}, but ClousureLogic "
                "needs the closure's result back (torch.optim.LBFGS returns it). Use an "
                "optimizer whose step returns the closure's value, or ppe.handler.Logic."
            )
        return result.outs

    def train_step_optimizers(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
    ) -> None:
        """Nothing: the optimizer already stepped inside ``train_step``."""
