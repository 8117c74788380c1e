"""A snapshot's arguments checked when it is made, and its filename template before training.

PPE takes any target, filename and ``n_retains`` and fails (or names files oddly) only at the
first snapshot, an epoch or more into training; ppe-core raises at once, saying what to pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ppe_core.errors import ArgumentTypeError, ConfigurationError

__all__ = ["check_arguments", "check_template"]


def check_arguments(
    target: Any, filename: str | Callable[[Any], str], n_retains: object, autoload: bool
) -> None:
    """Raises unless the snapshot's target, filename and ``n_retains`` can work together."""
    if not (callable(filename) or (isinstance(filename, str) and filename)):
        raise ArgumentTypeError(
            f"filename must be a non-empty str template (e.g. 'snapshot_iter_{{.iteration}}')"
            f" or a callable taking the manager, got {filename!r}"
        )
    if autoload and not isinstance(filename, str):
        raise ConfigurationError(
            "autoload=True needs a str filename template to find earlier snapshots; a "
            "callable filename cannot be matched against the files in out_dir"
        )
    if isinstance(target, Mapping):
        bad = [k for k, v in target.items() if not hasattr(v, "state_dict")]
        if bad:
            raise ArgumentTypeError(
                f"snapshot target values must have state_dict()/load_state_dict(); {bad} do not"
            )
    elif target is not None and not hasattr(target, "state_dict"):
        raise ArgumentTypeError(
            f"snapshot target must have state_dict()/load_state_dict() (a model, an "
            f"optimizer, ...) or be a dict of such objects, got {type(target).__name__}"
        )
    if isinstance(n_retains, bool) or not isinstance(n_retains, int):
        raise ArgumentTypeError(f"n_retains must be an int (-1 keeps all), got {n_retains!r}")


def check_template(filename: str | Callable[[Any], str], manager: Any) -> None:
    """Formats a str ``filename`` template with the manager, so that a misspelt field raises
    before training, not after an epoch of it."""
    if isinstance(filename, str):
        try:
            filename.format(manager)
        except (AttributeError, KeyError, IndexError, ValueError) as exc:
            raise ConfigurationError(
                f"snapshot filename template {filename!r} cannot be formatted with "
                f"the manager ({type(exc).__name__}: {exc}); use fields of the manager "
                "such as '{.iteration}' or '{.epoch}', e.g. 'snapshot_iter_{.iteration}'"
            ) from None
