"""The ExtensionsManager's checks that PPE's manager does not make, with their messages.

PPE's manager takes any ``iters_per_epoch`` (0 divides by zero later), any writer and any
state object (it fails when saving), fails with a bare ``KeyError`` on an unknown
``step_optimizers`` name, and lets a finalized manager or a model read outside
``needs_model_state`` (a ppe-core feature) go on. ppe-core raises at once, saying what to
pass instead; the manager calls these where the check belongs. A Trainer's manager
arguments are checked when the Trainer is made (PPE: a ``TypeError`` when ``run()`` builds
the manager).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence

from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    ManagerStateError,
    ModelStateUnavailableError,
)

__all__ = [
    "check_iters_per_epoch",
    "check_manager_kwargs",
    "check_state_object",
    "check_step_optimizers",
    "check_writer",
    "finalized_error",
    "model_unavailable_error",
]


def check_iters_per_epoch(iters_per_epoch: object) -> None:
    """Raises ``ConfigurationError`` unless ``iters_per_epoch`` is an integer >= 1."""
    if isinstance(iters_per_epoch, bool) or not isinstance(iters_per_epoch, int):
        raise ConfigurationError(
            f"iters_per_epoch must be an integer >= 1, got {iters_per_epoch!r}"
        )
    if iters_per_epoch < 1:
        raise ConfigurationError(
            f"iters_per_epoch must be >= 1, got {iters_per_epoch}; pass the number of "
            "iterations per epoch, usually len(loader) (an empty loader gives 0)"
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


def model_unavailable_error(iteration: int) -> ModelStateUnavailableError:
    """What reading the models raises where no ``needs_model_state`` extension runs."""
    return ModelStateUnavailableError(
        f"models cannot be read by extensions at iteration {iteration}: no extension "
        "declaring needs_model_state runs in this iteration. Set `needs_model_state = True` "
        "on the extension (or make_extension(needs_model_state=True)) that reads them."
    )
