"""``create_trainer`` / ``create_evaluator``: resolve device, runtime, logic and handler."""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError
from ppe_core.handler import BaseLogic, Handler, Logic
from ppe_core.runtime import BaseRuntime, DeviceLike

if TYPE_CHECKING:
    from ppe_core.training._evaluator import Evaluator, Metric
    from ppe_core.training._trainer import EvaluatorSpec, Trainer

__all__ = ["create_evaluator", "create_trainer"]


def _as_dict(value: Any, kind: type, kind_name: str, argument: str, example: str) -> dict[str, Any]:
    items = dict(value) if isinstance(value, Mapping) else {"main": value}
    for name, item in items.items():
        if not isinstance(item, kind):
            got = (
                f"the class {item.__name__}, not an instance"
                if isinstance(item, type)
                else type(item).__name__
            )
            raise ArgumentTypeError(
                f"{argument} must be a {kind_name} or a dict of them, but {argument}[{name!r}] "
                f"is {got}; pass e.g. {example}"
            )
    return items


def _reject_unknown(function: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    if not kwargs:
        return
    known = list(inspect.signature(function).parameters)
    hints = []
    for key in sorted(kwargs):
        close = difflib.get_close_matches(key, known, n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise ConfigurationError(
        f"{function.__name__} got unexpected argument(s) {', '.join(hints)}; its arguments are "
        f"{', '.join(k for k in known if k != 'kwargs')}."
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


def _resolve_runtime(device: DeviceLike, runtime_options: Mapping[str, Any] | None) -> BaseRuntime:
    from ppe_core._plugins import get_plugin_host

    host = get_plugin_host()
    if device == "auto":
        device = host.default_device()
    runtime_class = host.runtimes.get_runtime_class_for_device_spec(device)
    return runtime_class(device, runtime_options)


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


def _build_handler(
    logic: BaseLogic | str | None,
    device: DeviceLike,
    handler_class: type[Handler] | None,
    options: Mapping[str, Any] | None,
    runtime_options: Mapping[str, Any] | None,
) -> Handler:
    _check_mapping(options, "options")
    _check_mapping(runtime_options, "runtime_options")
    _check_handler_class(handler_class)
    remaining = dict(options or {})
    runtime = _resolve_runtime(device, runtime_options)
    resolved = _resolve_logic(logic)
    handler = (handler_class or Handler)(resolved, runtime, remaining)
    resolved.consume_options(remaining)  # the handler took its options first
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
    out_dir: str = "result",
    stop_trigger: Any = None,
    writer: Any = None,
    evaluator: EvaluatorSpec | None = None,
    device: DeviceLike = "cpu",
    logic: BaseLogic | str | None = None,
    transform_model: Callable[[str, torch.nn.Module], torch.nn.Module] | None = None,
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
        transform_model: ``fn(name, model)`` applied when saving models (e.g. unwrap DDP).
        handler_class: A :class:`~ppe_core.handler.Handler` subclass.
        options: Options for the handler, then the logic; leftovers raise.
        runtime_options: Options for the device runtime.
        profile: A ``torch.profiler.profile`` stepped after every iteration.
        **kwargs: Rejected with a clear error (reserved for compatibility).
    """
    _reject_unknown(create_trainer, kwargs)
    _check_trainer_arguments(max_epochs, extensions, out_dir, transform_model)
    from ppe_core.training._trainer import Trainer

    _check_profile(profile)
    model_dict = _as_dict(models, torch.nn.Module, "torch.nn.Module", "models", "MyModel()")
    optimizer_dict = _as_dict(
        optimizers,
        torch.optim.Optimizer,
        "torch.optim.Optimizer",
        "optimizers",
        "torch.optim.SGD(model.parameters(), lr=0.1)",
    )
    handler = _build_handler(logic, device, handler_class, options, runtime_options)
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
    )


def create_evaluator(
    models: torch.nn.Module | Mapping[str, torch.nn.Module],
    *,
    progress_bar: bool = False,
    device: DeviceLike = "cpu",
    metrics: list[Metric] | None = None,
    logic: BaseLogic | str | None = None,
    handler_class: type[Handler] | None = None,
    options: Mapping[str, Any] | None = None,
    runtime_options: Mapping[str, Any] | None = None,
    profile: Any = None,
    distributed: bool = False,
) -> Evaluator:
    """Create an :class:`~ppe_core.training.Evaluator` (arguments as in ``create_trainer``)."""
    from ppe_core.training._evaluator import Evaluator

    _check_profile(profile)
    model_dict = _as_dict(models, torch.nn.Module, "torch.nn.Module", "models", "MyModel()")
    handler = _build_handler(logic, device, handler_class, options, runtime_options)
    return Evaluator(
        handler,
        model_dict,
        progress_bar=progress_bar,
        metrics=metrics,
        profile=profile,
        distributed=distributed,
    )
