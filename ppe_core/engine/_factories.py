"""``create_trainer`` / ``create_evaluator``: resolve device, runtime, logic and handler."""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ppe_core._resolve import resolve_runtime
from ppe_core.errors import ArgumentTypeError, ConfigurationError, RuntimeOptionError
from ppe_core.handler import BaseLogic, Handler, Logic
from ppe_core.handler._diagnostics import pop_async_option
from ppe_core.handler._logic import LOGIC_OPTIONS
from ppe_core.runtime import BaseRuntime, DeviceLike, iter_runtime_modules
from ppe_core.training._manager import (
    default_transform_model,
    identity_transform_model,
    named_models,
)
from ppe_core.training._manager_checks import described
from ppe_core.training._protocols import StateObjectProtocol

if TYPE_CHECKING:
    from ppe_core.training._evaluator import Evaluator, Metric
    from ppe_core.training._trainer import EvaluatorSpec, Trainer

__all__ = [
    "create_evaluator",
    "create_trainer",
    "filter_state_objects",
    "filter_state_objects_dict",
]


def _as_dict(value: Any, kind: type, kind_name: str, argument: str, example: str) -> dict[str, Any]:
    items = dict(value) if isinstance(value, Mapping) else {"main": value}
    for name, item in items.items():
        if not isinstance(item, kind):
            got = described(item)
            raise ArgumentTypeError(
                f"{argument} must be a {kind_name} or a dict of them, but {argument}[{name!r}] "
                f"is {got}; pass e.g. {example}"
            )
    return items


#: Arguments other frameworks' trainers take, each with what does it here (said when given).
_ARGUMENT_HINTS: dict[str, str] = {
    "precision": (
        "mixed precision is the autocast option: ppe.to(model, device, "
        "options={'autocast': True}) (bfloat16 on the CPU, float16 with a GradScaler on CUDA; "
        "or a dtype, e.g. {'autocast': torch.bfloat16}), or the Logic's "
        "create_trainer(..., options={'autocast': True}); see docs/runtimes.md"
    ),
    "seed": (
        "create_trainer does not seed: call torch.manual_seed(seed) (and random's and "
        "numpy's, if used) before building the model and the loaders; a resumed run "
        "continues from the RNG states its snapshot saved"
    ),
    "gradient_clip_val": (
        "gradient clipping is the Logic option create_trainer(..., "
        "options={'grad_clip_norm': max_norm}) (or 'grad_clip_value' to clamp each element), "
        "applied after unscaling, once per optimizer step; see docs/how-to/clipping.md"
    ),
}


def _reject_unknown(
    function: Callable[..., Any], kwargs: Mapping[str, Any], also: Sequence[str] = ()
) -> None:
    known = [k for k in inspect.signature(function).parameters if k != "kwargs"]
    known += [k for k in also if k not in known]
    if set(kwargs) <= set(also):
        return
    kwargs = {k: v for k, v in kwargs.items() if k not in also}
    hints = []
    for key in sorted(kwargs):
        # A hinted argument gets its hint below, not the closest name (unrelated to it).
        close = [] if key in _ARGUMENT_HINTS else difflib.get_close_matches(key, known, n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    fixes = "".join(f" {key}: {hint}." for key, hint in _ARGUMENT_HINTS.items() if key in kwargs)
    raise ArgumentTypeError(
        f"{function.__name__} got unexpected argument(s) {', '.join(hints)}; its arguments are "
        f"{', '.join(known)}.{fixes}"
    )


def _check_mapping(value: Any, argument: str) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise ArgumentTypeError(
            f"{argument} must be a dict of names to values, got {type(value).__name__} "
            f"{value!r}; e.g. {argument}={{'name': value}}"
        )


def _check_profile(profile: Any) -> None:
    if profile is not None and not callable(getattr(profile, "step", None)):
        raise ArgumentTypeError(
            f"profile must be a torch.profiler.profile (anything with step()), got "
            f"{type(profile).__name__}; e.g. profile=torch.profiler.profile(...), or leave it out"
        )


def _check_handler_class(handler_class: Any) -> None:
    if handler_class is not None and not (
        isinstance(handler_class, type) and issubclass(handler_class, Handler)
    ):
        raise ArgumentTypeError(
            f"handler_class must be a subclass of ppe_core.handler.Handler, got "
            f"{handler_class!r}; pass the class itself, or omit it for the default Handler"
        )


def _check_trainer_arguments(
    max_epochs: Any, extensions: Any, out_dir: Any, transform_model: Any
) -> None:
    if not isinstance(max_epochs, int) or isinstance(max_epochs, bool) or max_epochs < 1:
        raise ConfigurationError(
            f"max_epochs must be a positive int, got {max_epochs!r}; pass the number of epochs "
            "to train, e.g. 10 (to stop after N iterations, add stop_trigger=(N, 'iteration'))"
        )
    if extensions is not None and not isinstance(extensions, (list, tuple)):
        raise ArgumentTypeError(
            f"extensions must be a list of extensions, got {type(extensions).__name__}; wrap "
            "it in a list: extensions=[extension]"
        )
    if not isinstance(out_dir, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"out_dir must be a directory path (str), got {type(out_dir).__name__} "
            f"{out_dir!r}; e.g. out_dir='result'"
        )
    if transform_model is not None and not callable(transform_model):
        raise ArgumentTypeError(
            f"transform_model must be a callable fn(name, model) -> model, got "
            f"{type(transform_model).__name__}; e.g. ppe.training.manager.default_transform_model"
        )


def _resolve_logic(logic: BaseLogic | str | None) -> BaseLogic:
    if logic is None:
        return Logic()
    if isinstance(logic, str):
        from ppe_core._plugins import get_plugin_host

        factory = get_plugin_host().logics.get(logic)
        logic = factory()
    if not isinstance(logic, BaseLogic):
        got = (
            f"the class {logic.__name__}; pass an instance, e.g. logic={logic.__name__}()"
            if isinstance(logic, type)
            else f"{type(logic).__name__}; pass e.g. logic=ppe.handler.Logic() or logic='default'"
        )
        raise ArgumentTypeError(
            f"logic must be a ppe_core.handler.BaseLogic instance or a registered logic name, "
            f"got {got}"
        )
    return logic


def _split_runtime_options(
    options: Mapping[str, Any] | None, runtime_options: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """PPE's older spelling ``options={'runtime': {...}}`` counts when ``runtime_options`` is
    not given; otherwise a ``'runtime'`` option is left over and reported as unknown."""
    _check_mapping(options, "options")
    _check_mapping(runtime_options, "runtime_options")
    remaining = dict(options or {})
    if not runtime_options:
        runtime_options = remaining.pop("runtime", None) or {}
        _check_mapping(runtime_options, "options['runtime']")
    return remaining, dict(runtime_options)


def _has_state(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


def filter_state_objects(args: Any, key_name: str = "") -> list[tuple[str, StateObjectProtocol]]:
    """The objects with state (``state_dict``/``load_state_dict``) inside ``args``, named.

    Dict entries (and named-tuple fields) add ``__::__<key>`` to the name, sorted by key, and
    list or tuple items ``.__<i>__``, so the names match PPE's ``state_objects`` keys.

    Args:
        args: A value, possibly nested dicts, lists and tuples.
        key_name: The name of ``args`` itself.

    Returns:
        ``(name, object)`` pairs in a stable order.
    """
    if isinstance(args, tuple) and hasattr(args, "_asdict"):
        return filter_state_objects_dict(args._asdict(), key_name)
    if isinstance(args, Mapping):
        return filter_state_objects_dict(args, key_name)
    if isinstance(args, (list, tuple)):
        return [
            item
            for i, v in enumerate(args)
            for item in filter_state_objects(v, f"{key_name}.__{i}__")
        ]
    return [(key_name, args)] if _has_state(args) else []


def filter_state_objects_dict(
    args: Mapping[str, Any], key_name: str = "option"
) -> list[tuple[str, StateObjectProtocol]]:
    """:func:`filter_state_objects` for a dict: each entry is named ``key_name__::__<key>``."""
    return [
        item for k in sorted(args) for item in filter_state_objects(args[k], f"{key_name}__::__{k}")
    ]


def _collect_state_objects(
    options: Mapping[str, Any], runtime_options: Mapping[str, Any]
) -> dict[str, StateObjectProtocol]:
    """What ``options``/``runtime_options`` hold with state (a GradScaler, ...), as PPE names
    it in a manager's ``state_objects``."""
    found = {f"options_{k}": v for k, v in filter_state_objects(dict(options))}
    for key, value in runtime_options.items():
        if _has_state(value):
            found[f"runtime_options_{key}"] = value
    return found


def _refuse_ignored_move_options(
    runtime: BaseRuntime, runtime_options: Mapping[str, Any], models: Mapping[str, torch.nn.Module]
) -> None:
    """Refuses ``runtime_options`` that act on the module a runtime moves (``autocast``,
    ``channels_last``, ``compile``, ``report_memory``: an ``OptionSpec`` with ``on_move``)
    when the models were moved with other values: the trainer's own runtime never moves them,
    so the option would be ignored (or, for ``channels_last``, half applied)."""
    values = getattr(runtime, "module_option_values", None)
    if not callable(values):
        return  # a runtime without declared options (PPE's kind) acts on no module option
    wanted = {k: v for k, v in values().items() if runtime_options.get(k) is not None}
    if not wanted:
        return
    for name, model in models.items():
        for _, _, moved_with in iter_runtime_modules(model):
            if moved_with is runtime:
                continue
            theirs = _module_option_values(moved_with, runtime)
            ignored = [k for k, v in wanted.items() if theirs.get(k) != v]
            if ignored:
                given = {k: runtime_options[k] for k in ignored}
                also = (
                    f" For autocast in this trainer only, the Logic's option works too: "
                    f"options={{'autocast': {runtime_options['autocast']!r}}}."
                    if "autocast" in ignored
                    else ""
                )
                raise RuntimeOptionError(
                    f"runtime option(s) {', '.join(map(repr, ignored))} act only when a model "
                    f"is moved (on the model itself), and model {name!r} was already moved with "
                    f"ppe.to(model, {str(moved_with.device_spec)!r}, options="
                    f"{dict(getattr(moved_with, 'options', None) or {})!r}), so they would be "
                    "ignored. Give them where the model is moved: ppe.to(model, "
                    f"{str(runtime.device_spec)!r}, options={{..., {_items(given)}}}); the "
                    "trainer and evaluator then use that runtime (leave runtime_options out, or "
                    f"pass the same dict).{also}"
                )


def _module_option_values(moved_with: BaseRuntime, like: BaseRuntime) -> dict[str, Any]:
    """``moved_with``'s module options in effect: its own account when it gives one, else
    read from its options (absent: the default in ``like``'s spec)."""
    values = getattr(moved_with, "module_option_values", None)
    if callable(values):
        return dict(values())
    given = getattr(moved_with, "options", None) or {}
    specs = getattr(getattr(type(like), "option_spec", None), "specs", {})
    return {
        k: (spec.default if given.get(k) is None else given[k])
        for k, spec in specs.items()
        if spec.on_move
    }


def _refuse_ignored_scaler(
    runtime: BaseRuntime,
    runtime_options: Mapping[str, Any],
    models: Mapping[str, torch.nn.Module],
    logic: BaseLogic,
) -> None:
    """Refuses a ``grad_scaler`` in ``runtime_options`` that no step would use: the model's
    runtime has another scaler (which the Logic adopts first), or the Logic takes no scaler
    from a runtime (code blocks run on the model's runtime, with its scaler)."""
    scaler = runtime_options.get("grad_scaler")
    if scaler is None:
        return
    adopts = type(logic).offer_grad_scaler is not BaseLogic.offer_grad_scaler
    for name, model in models.items():
        for _, _, moved_with in iter_runtime_modules(model):
            theirs = (getattr(moved_with, "options", None) or {}).get("grad_scaler")
            if moved_with is runtime or theirs is scaler or (theirs is None and adopts):
                continue
            why = (
                "that runtime has its own grad_scaler, which the Logic uses"
                if theirs is not None
                else f"{type(logic).__name__} runs steps with the model's runtime's scaler"
            )
            raise RuntimeOptionError(
                f"runtime option 'grad_scaler' would be ignored: model {name!r} was moved with "
                f"ppe.to(model, {str(moved_with.device_spec)!r}, ...) and {why}. Give it "
                f"where the model is moved: ppe.to(model, {str(runtime.device_spec)!r}, "
                "options={..., 'grad_scaler': scaler})"
                + (", or as the Logic's option options={'grad_scaler': scaler}." if adopts else ".")
            )


def _items(options: Mapping[str, Any]) -> str:
    return ", ".join(f"{k!r}: {v!r}" for k, v in options.items())


def _build_handler(
    logic: BaseLogic | str | None,
    device: DeviceLike,
    handler_class: type[Handler] | None,
    remaining: dict[str, Any],
    runtime_options: Mapping[str, Any],
    models: Mapping[str, torch.nn.Module],
    training: bool,
) -> Handler:
    _check_handler_class(handler_class)
    # The runtime the models were moved with, when it serves the device: one per model and
    # device, with the options given to ppe.to.
    runtime = resolve_runtime(device, runtime_options, modules=models.values())
    _refuse_ignored_move_options(runtime, runtime_options, models)
    resolved = _resolve_logic(logic)
    if training:  # evaluators ignore grad_scaler: no backward pass
        _refuse_ignored_scaler(runtime, runtime_options, models, resolved)
    # PPE accepts "async" and ignores it (its asynchronous mode was removed): warned about
    # here, at the create_trainer / create_evaluator call, before any handler sees it.
    pop_async_option(remaining, stacklevel=3)
    handler = (handler_class or Handler)(resolved, runtime, remaining)
    resolved.consume_options(remaining)  # the handler took its options first
    dropped = sorted(set(remaining) & set(LOGIC_OPTIONS))
    if dropped and not isinstance(resolved, Logic):
        raise ConfigurationError(
            f"option(s) {dropped} are ppe.handler.Logic's, and {type(resolved).__name__} is not "
            "a Logic subclass (a BaseLogic subclass takes none of them). Subclass "
            "ppe.handler.Logic, calling super() in what it overrides, to keep them; see "
            "docs/handler-logic.md, A custom Logic"
        )
    if remaining:
        raise ConfigurationError(
            f"unknown option(s) {sorted(remaining)}: neither {type(handler).__name__} nor "
            f"{type(resolved).__name__} understands them. Check the spelling; runtime settings "
            "go in runtime_options."
        )
    return handler


def create_trainer(
    models: torch.nn.Module | Mapping[str, torch.nn.Module],
    optimizers: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
    max_epochs: int,
    *,
    extensions: list[Any] | None = None,
    out_dir: str | os.PathLike[str] = "result",
    stop_trigger: Any = None,
    writer: Any = None,
    evaluator: EvaluatorSpec | None = None,
    device: DeviceLike = "cpu",
    logic: BaseLogic | str | None = None,
    transform_model: Callable[[str, torch.nn.Module], torch.nn.Module]
    | None = default_transform_model,
    handler_class: type[Handler] | None = None,
    options: Mapping[str, Any] | None = None,
    runtime_options: Mapping[str, Any] | None = None,
    profile: Any = None,
    **kwargs: Any,
) -> Trainer:
    """Create a :class:`~ppe_core.training.Trainer`.

    Args:
        models: A module (named ``"main"``) or a dict of modules.
        optimizers: An optimizer (named ``"main"``) or a dict keyed like ``models``.
        max_epochs: Epochs to train unless ``stop_trigger`` says otherwise.
        extensions: Extensions to run on their triggers.
        out_dir: Where extensions write logs and snapshots.
        stop_trigger: When to stop (default ``(max_epochs, "epoch")``).
        writer: The writer extensions save through.
        evaluator: An evaluator, ``(evaluator, trigger)`` or a dict of either; run once per
            epoch by default.
        device: ``"cpu"``, ``"cuda:0"``, ... or ``"auto"`` (asks the ``ppe_default_device``
            hook).
        logic: A :class:`~ppe_core.handler.BaseLogic` instance or a registered logic name.
        transform_model: ``fn(name, model)`` giving the module whose state is saved and
            whose reports are named; by default DistributedDataParallel is unwrapped, so
            state keys lack ``module.`` (as in PPE).
        handler_class: A :class:`~ppe_core.handler.Handler` subclass.
        options: Options for the handler, then the logic; leftovers raise. PPE's
            ``options['runtime']`` is taken as ``runtime_options`` when those are not given,
            and ``options['async']=True`` warns that it has no effect. Objects with state in them
            (a GradScaler, ...) are saved in the trainer's ``state_dict`` under
            ``'state_objects'``, with PPE's key names.
        runtime_options: Options for the device runtime. Without them the runtime the model
            was moved with (``ppe.to``) serves ``device`` when it can, so options given to
            ``ppe.to`` are given once.
        profile: A ``torch.profiler.profile``, entered around training and stepped after
            every iteration.
        **kwargs: Further :class:`~ppe_core.training.ExtensionsManager` arguments, as in
            PPE: ``enable_profile`` (record each step and extension for ``torch.profiler``)
            and ``enable_trace`` (also for ``ppe.profiler``'s tracer); others raise
            :class:`~ppe_core.errors.ArgumentTypeError` naming the closest argument.
    """
    from ppe_core.training._trainer import Trainer, manager_arguments

    handled = {"optimizers", "max_epochs", "extensions", "out_dir", "writer", "stop_trigger"}
    handled |= {"transform_model", "state_objects"}
    _reject_unknown(create_trainer, kwargs, [k for k in manager_arguments() if k not in handled])
    _check_trainer_arguments(max_epochs, extensions, out_dir, transform_model)

    _check_profile(profile)
    model_dict = named_models(models)
    optimizer_dict = _as_dict(
        optimizers,
        torch.optim.Optimizer,
        "torch.optim.Optimizer",
        "optimizers",
        "torch.optim.SGD(model.parameters(), lr=0.1)",
    )
    if transform_model is None:  # ppe-core's earlier spelling of "no transform"
        transform_model = identity_transform_model
    remaining, runtime_dict = _split_runtime_options(options, runtime_options)
    state_objects = _collect_state_objects(remaining, runtime_dict)
    handler = _build_handler(
        logic, device, handler_class, remaining, runtime_dict, model_dict, True
    )
    if state_objects:
        kwargs["state_objects"] = state_objects
    return Trainer(
        handler,
        evaluator=evaluator,
        models=model_dict,
        optimizers=optimizer_dict,
        max_epochs=max_epochs,
        extensions=extensions,
        out_dir=out_dir,
        writer=writer,
        stop_trigger=stop_trigger,
        transform_model=transform_model,
        profile=profile,
        **kwargs,
    )


def create_evaluator(
    models: torch.nn.Module | Mapping[str, torch.nn.Module],
    *,
    progress_bar: bool = False,
    device: DeviceLike = "cpu",
    metrics: Sequence[Metric] | None = None,
    logic: BaseLogic | str | None = None,
    handler_class: type[Handler] | None = None,
    options: Mapping[str, Any] | None = None,
    runtime_options: Mapping[str, Any] | None = None,
    profile: Any = None,
    distributed: bool = False,
) -> Evaluator:
    """Create an :class:`~ppe_core.training.Evaluator` (arguments as in ``create_trainer``).

    Args:
        models: A module (named ``"main"``) or a dict of modules, usually the trainer's.
        progress_bar: Show a progress bar during each evaluation.
        device: As in ``create_trainer``.
        metrics: Callables ``metric(batch, outputs) -> dict`` whose values are reported like
            outputs (``val/<name>``).
        logic: As in ``create_trainer``; its ``eval_step`` runs each batch.
        handler_class: As in ``create_trainer``.
        options: As in ``create_trainer``.
        runtime_options: As in ``create_trainer``.
        profile: A ``torch.profiler.profile`` entered for each evaluation, stepped per batch.
        distributed: Return a :class:`~ppe_core.training.DistributedEvaluator`, whose means
            cover every rank's batches (``torch.distributed`` must be initialised).
    """
    from ppe_core.training._evaluator import DistributedEvaluator, Evaluator

    _check_profile(profile)
    model_dict = named_models(models)
    remaining, runtime_dict = _split_runtime_options(options, runtime_options)
    handler = _build_handler(
        logic, device, handler_class, remaining, runtime_dict, model_dict, False
    )
    evaluator_class = DistributedEvaluator if distributed else Evaluator
    return evaluator_class(
        handler,
        model_dict,
        progress_bar=progress_bar,
        metrics=metrics,
        profile=profile,
    )
