"""Explanations of user errors that PPE leaves to PyTorch's message, or lets pass silently.

A batch that does not fit ``forward``, a batch of another dtype than the model, a first step
that trains nothing, an output to backpropagate that cannot be, a Logic or Handler option of
the wrong type, autocast on a device type without it, a model or optimizer name the Logic
cannot find, an optimizer holding none of the models' parameters, report keys the outputs
lack: each raises an error (or warns) naming the cause and the fix. The explanations run when
something already failed, or once per run: never per step.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ppe_core.errors import (
    AMPOptionError,
    BackwardOutputWarning,
    BatchDtypeError,
    BatchMismatchError,
    ConfigurationError,
    IgnoredArgumentWarning,
    ModelOutputError,
    NoGradientError,
    NoGradientWarning,
    OptimizerParametersError,
)
from ppe_core.runtime import autocast_available


def explain_forward_mismatch(model: torch.nn.Module, batch: Any, exc: TypeError) -> None:
    """Raise a clearer error when the batch does not fit ``forward``'s signature."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    args: Any = (batch,)
    kwargs: Any = {}
    if isinstance(batch, Mapping):
        args, kwargs = (), batch
        given = f"a dict with keys {sorted(batch)}"
        rule = "dict batches are passed as keyword arguments, so their keys must match"
    elif isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        args = batch
        given = f"a {type(batch).__name__} of {len(batch)} items"
        rule = "list/tuple batches are passed as positional arguments, so their items match"
    else:
        given = f"a single {type(batch).__name__}"
        rule = "any other batch is passed as the single argument, so it must match"
    try:
        signature.bind(*args, **kwargs)
    except TypeError as mismatch:
        # Parameter names only: annotations make the message long and say nothing about the fix.
        empty = inspect.Parameter.empty
        names = signature.replace(
            parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
            return_annotation=empty,
        )
        raise BatchMismatchError(
            f"the batch does not fit {type(model).__name__}.forward{names}: {mismatch}. "
            f"The loader yielded {given}; {rule} forward's parameters. Change the loader's "
            "collate_fn or forward's signature so they agree."
        ) from exc


class GradientWatch:
    """Watches a model whose first training step backpropagated nothing, until the next epoch.

    A gradient hook on each trainable parameter sets :attr:`trained` when any parameter gets a
    gradient; :meth:`check` (at the next epoch's start) removes the hooks and raises
    :class:`NoGradientError` when none fired. A model that trains costs one hook call per
    parameter per step until then; one that never trains costs nothing per step.
    """

    def __init__(self, model: torch.nn.Module, message: str) -> None:
        self.model = model
        self.message = message
        self.trained = False
        self._handles = [
            p.register_hook(self._mark)  # type: ignore[no-untyped-call]
            for p in model.parameters()
            if p.requires_grad
        ]

    def _mark(self, grad: torch.Tensor) -> None:
        self.trained = True

    def check(self) -> None:
        """Raise :class:`NoGradientError` if no parameter got a gradient since the warning."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.trained or any(p.grad is not None for p in self.model.parameters()):
            return
        raise NoGradientError(
            f"a whole epoch trained nothing: no parameter of {type(self.model).__name__} got a "
            f"gradient since the first step warned. {self.message}"
        )


def check_something_trains(
    model: torch.nn.Module, named: Mapping[str, Any]
) -> GradientWatch | None:
    """Warn (:class:`NoGradientWarning`) when nothing in the step's outputs (keyed by name) has
    a graph and no parameter of ``model`` has a gradient (the forward did not run backward).

    Called after the first training step with the default ``backward_outputs``. The step goes
    on with the parameters unchanged, as in PPE; the returned :class:`GradientWatch` turns a
    run that goes on training nothing into :class:`NoGradientError` at the next epoch's start.
    Returns None when the step trained.
    """
    if any(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in named.values()):
        return None  # backpropagated, or BackwardOutputWarning already said why not
    params = list(model.parameters())
    if any(p.grad is not None for p in params):
        return None  # the forward ran backward itself
    described = ", ".join(f"{k!r}: {_grad_state(v)}" for k, v in named.items()) or "nothing"
    if params and not any(p.requires_grad for p in params):
        cause = (
            "Every parameter of the model is frozen (requires_grad=False): unfreeze the ones "
            "to train."
        )
    else:
        cause = (
            "Usual causes: the loss was returned after .item() or .detach(), or computed under "
            "torch.no_grad() / torch.inference_mode(). Return the loss tensor itself, e.g. "
            "{'loss': loss}, and report plain numbers with ppe.reporting.report."
        )
    warnings.warn(
        f"the first training step backpropagated nothing: no output of "
        f"{type(model).__name__}.forward has a graph ({described}), so the parameters are not "
        f"updated. {cause} If no parameter gets a gradient during this epoch, NoGradientError "
        "stops the run at the next epoch's start.",
        NoGradientWarning,
        stacklevel=4,
    )
    return GradientWatch(model, cause)


def _grad_state(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.requires_grad:  # a leaf, e.g. an input returned as it is
            return f"a {value.dtype} leaf tensor, computed from no parameter"
        return f"a {value.dtype} tensor that does not require grad"
    return f"a {type(value).__name__}, not a tensor"


#: Phrases of PyTorch's errors for operands of different dtypes (matmul, conv, embedding...;
#: "same dtype" also matches dot's "expected both vectors to have same dtype").
_DTYPE_ERRORS = (
    "same dtype",
    "expected scalar type",
    "should be the same",
    "Found dtype",
)


def explain_dtype_mismatch(model: torch.nn.Module, batch: Any, exc: RuntimeError) -> None:
    """Raise :class:`BatchDtypeError` naming the batch tensors whose dtype is not the model's,
    when ``exc`` is PyTorch's dtype-mismatch error."""
    message = str(exc)
    if not any(phrase in message for phrase in _DTYPE_ERRORS):
        return
    wanted = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if wanted is None:
        return
    if isinstance(batch, Mapping):
        items = [(repr(k), v) for k, v in batch.items()]
    elif isinstance(batch, (list, tuple)):
        items = [(f"item {i}", v) for i, v in enumerate(batch)]
    else:
        items = [("the batch", batch)]
    other = [(n, v.dtype) for n, v in items if isinstance(v, torch.Tensor) and v.dtype != wanted]
    # A float of another precision is the likely culprit; integer tensors (often class
    # targets) are named only when there is no such float.
    suspects = [(n, d) for n, d in other if d.is_floating_point] or other
    if not suspects:
        return
    named = ", ".join(f"{n} is {d}" for n, d in suspects)
    raise BatchDtypeError(
        f"the batch's dtypes do not match {type(model).__name__}'s parameters ({wanted}): "
        f"{named}. PyTorch said: {message.splitlines()[0]}. Convert the inputs where the "
        f"batch is built (the dataset or the loader's collate_fn), e.g. x.to({wanted}) or "
        "x.float(), or convert the model (e.g. model.double()) if that precision is the one "
        "you want. Integer class targets (for cross_entropy) can stay integers."
    ) from exc


def check_logic_options(options: Mapping[str, Any]) -> None:
    """Refuses ``Logic`` options of the wrong type or range when they are given, before the
    Logic takes any (PPE takes them as they are, to fail at some step with PyTorch's error);
    the ``grad_scaler`` option, which PPE checks too, is checked by the Logic.

    Raises:
        ConfigurationError: ``backward_outputs``, ``backward_function``, ``autocast`` or
            ``grad_accumulation_steps`` is unusable.
    """
    keys = options.get("backward_outputs")
    if keys and (
        not isinstance(keys, (str, list, tuple))
        or not all(isinstance(k, str) for k in ([keys] if isinstance(keys, str) else keys))
    ):
        raise ConfigurationError(
            f"option 'backward_outputs' must be an output key or a list of them, got "
            f"{keys!r}; e.g. options={{'backward_outputs': ['loss']}}"
        )
    backward_fn = options.get("backward_function")
    if backward_fn is not None and not callable(backward_fn):
        raise ConfigurationError(
            f"option 'backward_function' must be a callable fn(tensor), got "
            f"{type(backward_fn).__name__}; e.g. options={{'backward_function': "
            "lambda loss: loss.backward()}, or leave it out to call tensor.backward()"
        )
    autocast = options.get("autocast")
    if autocast is not None and not isinstance(autocast, (bool, dict)):
        raise ConfigurationError(
            f"option 'autocast' must be a bool or a dict of torch.autocast arguments, "
            f"got {autocast!r}; e.g. options={{'autocast': {{'dtype': torch.bfloat16}}}}"
        )
    steps = options.get("grad_accumulation_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ConfigurationError(
            f"option 'grad_accumulation_steps' must be an int >= 1, got {steps!r}"
        )


def unknown_name_error(logic: str, name: str, kind: str, names: list[str]) -> ConfigurationError:
    """The error for a Logic (named ``logic`` in the message) that trains the model ``name``
    when no ``kind`` ("model" or "optimizer") of that name was passed, only ``names``."""
    if kind == "optimizer":
        fix = (
            f"Key the optimizer like its model: optimizers={{{name!r}: optimizer}} (a bare "
            "optimizer is named 'main')."
        )
    elif len(names) == 1:
        fix = (
            f"Key the model {name!r} (a bare module is named 'main'), or pass "
            f"logic={logic}(model_name={names[0]!r}); its optimizer takes the same key."
        )
    else:
        fix = (
            f"{logic} trains one model: pass logic={logic}(model_name=...) naming it, or "
            "subclass ppe.handler.BaseLogic to train several models per step."
        )
    return ConfigurationError(
        f"{logic} trains the {kind} named {name!r}, but the {kind}s passed are named {names}. {fix}"
    )


def check_optimizers_hold_models(
    models: Iterable[torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]
) -> None:
    """Refuse an optimizer that holds none of the models' parameters, once per run.

    Its steps would change nothing the models use, and training would end with the initial
    weights and no error. The usual cause: the optimizer was built before ``ppe.to`` on a
    device whose ``module.to`` makes new parameter objects (the emulated device, XLA-like
    backends), or for another copy of the model.
    """
    held = [p for model in models for p in model.parameters()]
    if not held:
        return
    for name, optimizer in optimizers.items():
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not params or holds_parameters(optimizer, held):
            continue
        theirs = sorted({str(p.device) for p in params})
        ours = sorted({str(p.device) for p in held})
        where = (
            f" (the optimizer's parameters are on {', '.join(theirs)}, the models' on "
            f"{', '.join(ours)}: moving the model made new parameter objects)"
            if theirs != ours
            else ""
        )
        raise OptimizerParametersError(
            f"optimizer {name!r} holds none of the models' parameters, so its steps would "
            f"change nothing the models use{where}; build the optimizer after "
            "ppe.to(model, device), from the model the trainer trains "
            "(torch.optim.SGD(model.parameters(), ...)), or pass the module whose parameters "
            "it holds among the trainer's models"
        )


def holds_parameters(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> bool:
    """Whether ``optimizer`` holds any of ``params`` (the same tensor objects)."""
    held = {id(p) for p in params}
    return any(id(p) in held for group in optimizer.param_groups for p in group["params"])


def warn_skipped_backward(key: str, outputs: Mapping[str, Any]) -> None:
    """Warn that the named backward output ``key`` is skipped: it is not among ``outputs``
    (PPE warns, without the fix) or has no graph (PPE skips it in silence)."""
    if key not in outputs:
        skipped = (
            f"requested backward value: {key} is not among the model's outputs "
            f"{sorted(outputs)}, so it is skipped; fix backward_outputs or the "
            "model's outputs."
        )
    else:
        skipped = _no_graph_message(key, outputs[key])
    warnings.warn(skipped, BackwardOutputWarning, stacklevel=3)


def _no_graph_message(key: str, value: Any) -> str:
    """Why the named backward output ``key``, whose ``value`` has no graph, is skipped (PPE
    skips it in silence)."""
    what = (
        "does not require grad"
        if isinstance(value, torch.Tensor)
        else f"is a {type(value).__name__}, not a tensor"
    )
    return (
        f"the backward output {key!r} {what}, so it is skipped and nothing is "
        "backpropagated for it; compute it from the parameters with autograd "
        "enabled (not under torch.no_grad(), not .detach()ed or .item()ed)."
    )


def non_scalar_backward(key: str, value: torch.Tensor) -> ModelOutputError:
    """The error for a named backward output that is not a scalar, raised before
    ``backward()`` fails with a message naming neither the output nor the fix."""
    return ModelOutputError(
        f"the model output {key!r} has shape {tuple(value.shape)}, but backward "
        "needs a scalar; reduce it in forward (e.g. loss.mean()), or pass "
        "options={'backward_function': fn} to backpropagate it yourself."
    )


def warn_nothing_backpropagated(outputs: Mapping[str, Any]) -> bool:
    """Warn, and return ``True``, when ``outputs`` have a graph but no floating scalar to
    backpropagate: that looks like a forgotten loss (PPE backpropagates nothing in silence).

    A model returning no graph at all is warned about at the first step instead (see
    :func:`check_something_trains`), unless its forward ran backward itself.
    """
    if not any(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in outputs.values()):
        return False
    warnings.warn(
        f"none of the model's outputs {sorted(outputs)} is a floating scalar tensor, so "
        "nothing is backpropagated and the parameters do not change. Return the loss, "
        "e.g. {'loss': loss}, or name it with options={'backward_outputs': ['loss']}.",
        BackwardOutputWarning,
        stacklevel=3,
    )
    return True


def check_autocast_device(device_type: str) -> None:
    """Refuse autocast on a device type ``torch.autocast`` does not support, once at setup,
    so torch's own error never reaches the first step."""
    if not autocast_available(device_type):
        raise AMPOptionError(
            f"the Logic's option 'autocast' asks for autocast on the model's device "
            f"type {device_type!r}, which torch.autocast does not support; the runtime "
            "names the type autocast runs on with its autocast_device_type attribute "
            "(e.g. autocast_device_type = 'cpu' in a DeviceRuntime subclass whose "
            "tensors compute on the host), or pass options={'autocast': "
            "{'device_type': ...}}"
        )


def check_closure_options(grad_accumulation_steps: int, staged: bool) -> None:
    """Refuse the Logic options a ``ClousureLogic`` cannot honour (options PPE lacks):
    gradient accumulation and several optimizers (``staged``)."""
    if grad_accumulation_steps != 1:
        raise ConfigurationError(
            "ClousureLogic cannot accumulate gradients: the optimizer steps inside every "
            "train_step. Remove the 'grad_accumulation_steps' option."
        )
    if staged:
        raise ConfigurationError(
            "ClousureLogic steps one optimizer, with a closure; remove the 'optimizers' "
            "option, or use ppe.handler.Logic to step several optimizers"
        )


def pop_async_option(options: dict[str, Any], stacklevel: int) -> None:
    """Pops PPE's ``async`` option, warning once (this call) that ``async=True`` has no effect:
    PPE removed the asynchronous mode but still accepts the key; a false value asks for what
    runs anyway. ``stacklevel`` points the warning at the caller's call site."""
    if options.pop("async", None):
        warnings.warn(
            IgnoredArgumentWarning(
                "option 'async' has no effect: steps run synchronously (PPE removed its "
                "asynchronous mode and accepts the key for compatibility); remove it"
            ),
            stacklevel=stacklevel + 1,
        )


def pop_report_keys(options: dict[str, Any], name: str) -> list[str] | None:
    """Pops the Handler option ``name`` (``train_report_keys``/``eval_report_keys``): a list of
    output keys, or None; refused when it is anything else (see :func:`_check_report_keys`)."""
    value = options.pop(name, None)
    if value is None:
        return None
    _check_report_keys(name, value)
    return list(value)


def _check_report_keys(name: str, value: Any) -> None:
    """Refuses the report keys option ``name`` when ``value`` is not a list of output keys (PPE
    iterates what it is given)."""
    if isinstance(value, str) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError(
            f"option {name!r} must be a list of output keys, got {value!r}; e.g. "
            f"options={{{name!r}: ['loss']}}"
        )


def missing_report_keys(keys: list[str], outputs: Mapping[str, Any]) -> ConfigurationError:
    """The error for report keys the model's outputs lack (PPE: the bare ``KeyError``)."""
    missing = [k for k in keys if k not in outputs]
    return ConfigurationError(
        f"report keys {missing} are not in the model's outputs {sorted(outputs)}; "
        "fix train_report_keys/eval_report_keys or the model's output dict."
    )
