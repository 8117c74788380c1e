"""The ExtensionsManager's checks that PPE's manager does not make, with their messages.

PPE's manager takes a non-integer ``iters_per_epoch``, a negative ``max_epochs``, any
writer, state object, extension, priority and ignite engine (it fails when saving or running
them), explains a model that is not a module only for a single one, fails with a bare
``KeyError`` on an unknown ``step_optimizers`` name, ignores ``extend()``'s extra keyword
arguments in silence, and names neither the registered extensions nor a close match for an
unknown extension name. ppe-core raises at once, saying what to pass instead; the manager
calls these where the check belongs. Some errors here are PPE's own with more said (an
``iters_per_epoch`` below 1, a finalized manager, models read outside
``needs_model_state``, a protected member of PPE's manager that ppe-core lacks): kept with the
rest so the messages live in one place. A Trainer's manager
arguments are checked when the Trainer is made (PPE: a ``TypeError`` when ``run()`` builds
the manager), and so are ``make_extension``'s keyword arguments (PPE has none).
"""

from __future__ import annotations

import difflib
import operator
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    ExtensionNameError,
    IgniteNotInstalledError,
    IgnoredArgumentWarning,
    ManagerStateError,
    MissingExtensionStateWarning,
    ModelStateUnavailableError,
    NotProvidedError,
    UnknownOptimizerError,
)

__all__ = [
    "check_engine",
    "check_iters_per_epoch",
    "check_make_extension_kwargs",
    "check_manager_kwargs",
    "check_max_epochs",
    "check_priority",
    "check_state_object",
    "check_step_optimizers",
    "check_writer",
    "described",
    "finalized_error",
    "import_ignite",
    "integer_iters_per_epoch",
    "missing_attribute_error",
    "missing_max_epochs_error",
    "model_unavailable_error",
    "not_a_model_error",
    "not_an_extension_error",
    "unknown_extension_error",
    "unknown_optimizer_error",
    "warn_ignored_arguments",
    "warn_missing_extension_states",
    "warn_missing_stop_trigger_state",
]


def check_iters_per_epoch(iters_per_epoch: object) -> None:
    """Raises ``ConfigurationError`` unless ``iters_per_epoch`` is an integer
    (:func:`integer_iters_per_epoch`) >= 1."""
    if integer_iters_per_epoch(iters_per_epoch) < 1:
        raise ConfigurationError(
            f"iters_per_epoch must be >= 1, got {iters_per_epoch}; pass the number of "
            "iterations per epoch, usually len(loader) (an empty loader gives 0)"
        )


def integer_iters_per_epoch(iters_per_epoch: object) -> int:
    """``iters_per_epoch``, refused with a ``ConfigurationError`` unless an integer (PPE
    compares whatever it is given with 1)."""
    if isinstance(iters_per_epoch, bool) or not isinstance(iters_per_epoch, int):
        raise ConfigurationError(
            f"iters_per_epoch must be an integer >= 1, got {iters_per_epoch!r}"
        )
    return iters_per_epoch


def described(value: object) -> str:
    """What an argument of the wrong type is, for a message: its type's name, or for a class
    passed where an instance belongs, ``the class X, not an instance``."""
    if isinstance(value, type):
        return f"the class {value.__name__}, not an instance"
    return type(value).__name__


def not_a_model_error(argument: str, name: str, model: object) -> ArgumentTypeError:
    """What a models argument (``argument``) whose entry ``name`` is not a module raises."""
    got = described(model)
    return ArgumentTypeError(
        f"{argument} must be a torch.nn.Module or a dict of them (each model must be "
        f"an instance of torch.nn.Module), but {argument}[{name!r}] is {got}; pass "
        f"e.g. {argument}=MyModel() or {argument}={{'main': MyModel()}}"
    )


def check_engine(engine: object) -> None:
    """Raises unless pytorch-ignite is installed (:func:`import_ignite`) and ``engine`` is its
    ``Engine``.

    Raises:
        ArgumentTypeError: ``engine`` is not an ignite ``Engine``.
    """
    if not isinstance(engine, import_ignite().engine.Engine):
        raise ArgumentTypeError(
            f"engine must be an ignite.engine.Engine, got {type(engine).__name__}; pass "
            "e.g. ignite.engine.create_supervised_trainer(model, optimizer, loss_fn)"
        )


def import_ignite() -> Any:
    """The ``ignite`` package, its ``engine`` module imported.

    Raises:
        IgniteNotInstalledError: pytorch-ignite is not installed (an ``ImportError``; PPE's
            manager module fails to import without it).
    """
    try:
        import ignite.engine
    except ModuleNotFoundError as exc:
        raise IgniteNotInstalledError(
            "IgniteExtensionsManager needs pytorch-ignite: pip install pytorch-ignite "
            "(or use ExtensionsManager with your own loop)"
        ) from exc
    return ignite


def missing_max_epochs_error() -> ConfigurationError:
    """What a Trainer made without ``max_epochs`` raises when it starts."""
    return ConfigurationError(
        "the trainer needs max_epochs (the number of epochs to train); pass "
        "Trainer(..., max_epochs=10) or use ppe.engine.create_trainer"
    )


def check_make_extension_kwargs(kwargs: Mapping[str, Any], flags: Collection[str]) -> None:
    """Raises ``ArgumentTypeError`` for a ``make_extension`` keyword argument not in ``flags``."""
    unknown = sorted(set(kwargs) - set(flags))
    if unknown:
        raise ArgumentTypeError(
            f"make_extension() got unexpected keyword arguments {unknown}; it accepts trigger, "
            "default_name, priority, finalizer, initializer, on_error, needs_model_state, "
            "is_async and runs_last (set other attributes on the function yourself)"
        )


def check_max_epochs(max_epochs: object) -> None:
    """Raises ``ConfigurationError`` for a negative integer ``max_epochs``."""
    if isinstance(max_epochs, int) and not isinstance(max_epochs, bool) and max_epochs < 0:
        raise ConfigurationError(
            f"max_epochs must be >= 0, got {max_epochs}; pass the number of epochs to "
            "train (0 only for a manager that just loads a state)"
        )


def check_priority(priority: object) -> int:
    """Returns ``priority`` as an int, or raises naming the problem.

    Raises:
        ArgumentTypeError: ``priority`` is not an integer.
    """
    try:
        return operator.index(priority)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"an extension priority must be an int, got {type(priority).__name__} "
            f"{priority!r}; use e.g. ppe.training.PRIORITY_READER (higher runs first)"
        ) from None


def not_an_extension_error(ext: object) -> ArgumentTypeError:
    """What registering ``ext``, neither an Extension instance nor a callable, raises."""
    if isinstance(ext, type):
        got = f"the class {ext.__name__}; pass an instance, e.g. {ext.__name__}()"
    elif isinstance(ext, (list, tuple)):
        # Most often PPE-style ``(extension, trigger)``: a trigger is given where the
        # extension is registered, never in a tuple.
        got = (
            f"a {type(ext).__name__}; to register an extension with a trigger (or a priority, "
            "a name), wrap it: ExtensionEntry(extension, trigger=trigger, priority=priority) "
            "in extensions=[...] (ExtensionEntry is ppe.training.ExtensionEntry), or call "
            "manager.extend(extension, trigger=trigger, priority=priority); to register "
            "several extensions, list or extend each one"
        )
    else:
        got = f"{type(ext).__name__} {ext!r}"
    return ArgumentTypeError(
        f"an extension must be a ppe.training.extension.Extension or a callable taking the "
        f"manager, got {got}"
    )


def unknown_extension_error(name: str, registered: Collection[str]) -> ExtensionNameError:
    """What ``get_extension(name)`` raises when no extension has that name."""
    close = difflib.get_close_matches(name, list(registered), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ExtensionNameError(
        f"no extension named {name!r} is registered (registered: "
        f"{sorted(registered) or 'none'}); {hint}register it first with "
        f"extend(..., name={name!r}) or ask for one of the registered names"
    )


def warn_ignored_arguments(kwargs: Mapping[str, Any]) -> None:
    """Warns that ``extend()`` ignores ``kwargs`` (PPE accepts and ignores them in silence)."""
    if kwargs:
        warnings.warn(
            IgnoredArgumentWarning(
                f"extend() ignores the keyword arguments {sorted(kwargs)} (accepted for PPE "
                "compatibility only)"
            ),
            stacklevel=3,
        )


def warn_missing_extension_states(registered: Iterable[str], states: Mapping[str, Any]) -> None:
    """Warns, after a state loaded, of the ``registered`` extensions it had no entry for in
    ``states`` (its ``'extensions'``): they keep their state (PPE: a bare ``KeyError``)."""
    missing = [name for name in registered if name not in states]
    if missing:
        warnings.warn(
            MissingExtensionStateWarning(
                f"the loaded state has no entry for the extensions {missing}; they keep "
                "their current state (the state was saved without them, or under other names)"
            ),
            stacklevel=4,
        )


def warn_missing_stop_trigger_state(trigger: object) -> None:
    """Warns, after a state loaded, that it had nothing for the stateful stop ``trigger``,
    which keeps its current state: PPE's states (and ppe-core's saved with a stateless stop
    trigger) have none."""
    warnings.warn(
        MissingExtensionStateWarning(
            f"the loaded state has no state for the stop trigger {trigger!r} (PPE does not save "
            "it; or the state was saved with another stop trigger). The trigger keeps its "
            "current state, so a new one starts afresh (an EarlyStoppingTrigger's best value "
            "and count of checks without improvement start again) and training may stop at "
            "another iteration than the saved run would have."
        ),
        stacklevel=4,
    )


def check_manager_kwargs(given: Collection[str], known: Collection[str]) -> None:
    """Raises ``ArgumentTypeError`` naming the arguments of ``given`` a Trainer does not take
    (``known``: the manager's it forwards), each with the closest known one."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
        raise ArgumentTypeError(
            f"Trainer got unexpected argument(s) {', '.join(hints)}; besides handler, evaluator, "
            f"models and profile it takes ExtensionsManager's: {', '.join(sorted(known))}"
        )


def unknown_optimizer_error(name: str, optimizers: Collection[str]) -> UnknownOptimizerError:
    """What ``trainer.get_optimizer(name)`` raises when no optimizer has that name (PPE: a
    bare ``KeyError``)."""
    return UnknownOptimizerError(
        f"no optimizer named {name!r}; the trainer has {sorted(optimizers)}"
    )


def check_writer(writer: object) -> None:
    """Raises ``ArgumentTypeError`` unless ``writer`` has ``initialize()`` and ``finalize()``."""
    if not all(callable(getattr(writer, m, None)) for m in ("initialize", "finalize")):
        raise ArgumentTypeError(
            f"writer must be a ppe_core.writing writer (with initialize() and finalize()), "
            f"got {type(writer).__name__}; pass e.g. ppe.writing.SimpleWriter(out_dir=...), "
            "or leave it out to write to out_dir"
        )


def check_state_object(name: str, obj: object) -> None:
    """Raises ``ArgumentTypeError`` unless ``obj`` has ``state_dict`` and ``load_state_dict``."""
    if not all(callable(getattr(obj, m, None)) for m in ("state_dict", "load_state_dict")):
        raise ArgumentTypeError(
            f"state object {name!r} must have state_dict() and load_state_dict(), got "
            f"{type(obj).__name__}"
        )


def check_step_optimizers(names: Sequence[str], optimizers: Collection[str]) -> None:
    """Raises ``ConfigurationError`` when a name in ``names`` is not a registered optimizer."""
    unknown = [name for name in names if name not in optimizers]
    if unknown:
        raise ConfigurationError(
            f"step_optimizers names unknown optimizers {unknown}; registered: {sorted(optimizers)}"
        )


def finalized_error() -> ManagerStateError:
    """What running an iteration of a finalized manager raises."""
    return ManagerStateError(
        "cannot run a finalized manager: the manager is finalized when training ends "
        "(or a trainer fails); create a new manager (and load_state_dict) to train further"
    )


#: PPE 0.9's protected ExtensionsManager members that ppe-core keeps no equivalent of ->
#: the public way to do what a subclass used them for (docs/migration.md lists them).
_PPE_PROTECTED = {
    "_extensions": "`manager.extensions` ((name, entry) pairs) or `manager.get_extension(name)`",
    "_state_objects": "the `state_objects` argument of the manager (and `state_dict()`)",
    "_internal_stop_trigger": "`manager.stop_trigger` (and the `stop_trigger` argument)",
    "_start_extensions_called": "`manager.start_extensions()`, which runs once by itself",
    "_run_on_error": "an extension's `on_error(manager, exc, tb)`",
    "_finalize_extensions": "`manager.finalize()`",
    "_check_model_available": "`manager.models` (it raises when the models are not available)",
}


def missing_attribute_error(cls: str, name: str) -> AttributeError:
    """What reading the attribute ``name`` that a manager (of class ``cls``) lacks raises: a
    :class:`NotProvidedError` saying what to use for one of PPE's protected members (both
    are ``AttributeError``, so ``hasattr`` stays False)."""
    replacement = _PPE_PROTECTED.get(name)
    if replacement is None:
        return AttributeError(f"{cls!r} object has no attribute {name!r}")
    return NotProvidedError(
        f"ExtensionsManager.{name} (a protected member of PPE 0.9's manager) is not "
        f"provided by ppe-core; use {replacement} instead"
    )


def model_unavailable_error(iteration: int) -> ModelStateUnavailableError:
    """What reading the models raises where no ``needs_model_state`` extension runs."""
    return ModelStateUnavailableError(
        f"models cannot be read by extensions at iteration {iteration}: no extension "
        "declaring needs_model_state runs in this iteration. Set `needs_model_state = True` "
        "on the extension (or make_extension(needs_model_state=True)) that reads them."
    )
