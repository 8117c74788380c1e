"""Loading a manager's state with what is missing or does not fit explained.

PPE indexes the state (a bare ``KeyError`` for a missing model, optimizer or iteration), hands
each part to ``load_state_dict`` and lets torch's error speak. ppe-core checks every required
entry before loading anything and says which is missing; for a part that does not fit it
names the model or optimizer, lists the missing and unexpected keys, recognises a
data-parallel ``module.`` prefix, torch.compile's ``_orig_mod.`` prefix and a state saved from
another optimizer type, and says how to fix it. A state another PPE format version or a newer
ppe-core wrote loads with a warning saying so (PPE's own check compares the version strings
only). The manager's state loads through these functions.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ppe_core._version import __version__, release
from ppe_core.errors import StateDictKeyError, StateDictMismatchError, StateVersionWarning
from ppe_core.training._resume import VERSION_KEY
from ppe_core.training._state import PPE_CORE_STATE_KEY

__all__ = [
    "check_loadable",
    "load_model_state",
    "load_optimizer_state",
    "model_mismatch_error",
    "optimizer_mismatch_explained",
    "require_iteration",
    "require_states",
    "warn_other_version",
]

_MAX_KEYS = 8  # keys listed in a mismatch message; the rest are counted
_COMPILED = "_orig_mod."  # what torch.compile's wrapper (OptimizedModule) adds to each key


def require_states(
    to_load: Mapping[str, Any], key: str, registered: Iterable[str]
) -> Mapping[str, Any]:
    """``to_load[key]``, checked to be a mapping holding every name in ``registered``.

    Raises:
        StateDictKeyError: ``to_load[key]`` is missing or not a mapping, or lacks a name.
    """
    states = to_load.get(key)
    if not isinstance(states, Mapping):
        raise StateDictKeyError(
            f"the state has no {key!r} mapping (its keys: {sorted(map(str, to_load))}); pass "
            "what trainer.state_dict() or manager.state_dict() returned, not a model's own "
            "state_dict (load that with model.load_state_dict)"
        )
    missing = [name for name in registered if name not in states]
    if missing:
        raise StateDictKeyError(
            f"the state's {key!r} lacks {missing} (it holds {sorted(states)}); register "
            f"the {key} under the names they were saved with"
        )
    return states


def require_iteration(to_load: Mapping[str, Any]) -> None:
    """Raises ``StateDictKeyError`` unless ``to_load`` holds the iteration count."""
    if "_start_iteration" not in to_load:
        raise StateDictKeyError(
            "the state has no '_start_iteration' entry; pass what trainer.state_dict() or "
            "manager.state_dict() returned (or a snapshot file loaded with torch.load)"
        )


def check_loadable(
    to_load: Mapping[str, Any],
    models: Iterable[str],
    optimizers: Iterable[str],
    objects: Collection[str],
    optional: Collection[str],
) -> None:
    """Checks, before anything loads, that ``to_load`` holds the iteration and a state for
    every model and optimizer, and (when it has ``'state_objects'``) for every state object
    of ``objects`` that is not ``optional``.

    Raises:
        StateDictKeyError: An entry is missing (see :func:`require_states`).
    """
    require_states(to_load, "models", models)
    require_states(to_load, "optimizers", optimizers)
    require_iteration(to_load)
    if "state_objects" in to_load and objects:
        require_states(to_load, "state_objects", [n for n in objects if n not in optional])


# PPE releases whose states load without a StateVersionWarning (the format is the same).
_COMPATIBLE_PPE_VERSIONS = ("0.9.",)


def _version_problem(to_load: Mapping[str, Any]) -> str | None:
    """Why a state's versions may not load as saved, or None: PPE's format field is another
    release's than 0.9, or ppe-core's own version (``'_ppe_core'``) is newer than this one."""
    saved = to_load.get("ppe_version")
    if saved != __version__ and not (
        isinstance(saved, str) and saved.startswith(_COMPATIBLE_PPE_VERSIONS)
    ):
        written = "an unknown version" if saved is None else f"version {saved}"
        return (
            f"the loaded state was written by {written} (ppe-core is {__version__}, "
            "compatible with PPE 0.9); it loads, but states from other versions may differ"
        )
    internal = to_load.get(PPE_CORE_STATE_KEY)
    core = internal.get(VERSION_KEY) if isinstance(internal, Mapping) else None
    if core is None or core == __version__:
        return None  # PPE's state (no ppe-core version), or this version's
    saved_release, own = release(core), release(__version__)
    if saved_release is not None and own is not None and saved_release <= own:
        return None  # an older ppe-core's: this one reads what it wrote
    if saved_release is None:
        return (
            f"the loaded state was written by ppe-core {core!r}, which this ppe-core "
            f"({__version__}) cannot compare with its own version: it loads, but states from "
            "other versions may differ"
        )
    return (
        f"the loaded state was written by ppe-core {core}, newer than this ppe-core "
        f"({__version__}): it loads, but what that version added to the state is ignored and "
        f"what it changed may load differently; upgrade ppe-core to {core} to resume it exactly"
    )


def warn_other_version(to_load: Mapping[str, Any]) -> None:
    """Warns, before a manager state loads, when another version wrote it
    (:func:`_version_problem`): it loads, but may differ from what was saved."""
    problem = _version_problem(to_load)
    if problem is not None:
        warnings.warn(StateVersionWarning(problem), stacklevel=3)


def _key_list(keys: Sequence[str]) -> str:
    listed = ", ".join(repr(k) for k in keys[:_MAX_KEYS])
    more = len(keys) - _MAX_KEYS
    return f"[{listed}{f', ... {more} more' if more > 0 else ''}]"


def load_model_state(name: str, module: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """``module.load_state_dict(state)``; a mismatch raises :func:`model_mismatch_error`.

    Raises:
        StateDictMismatchError: The state does not fit.
    """
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise model_mismatch_error(name, module, state, exc) from exc


def model_mismatch_error(
    name: str, module: torch.nn.Module, state: Mapping[str, Any], exc: RuntimeError
) -> StateDictMismatchError:
    """Explains torch's ``exc`` for the state of model ``name`` by model name and keys: the
    missing and unexpected keys, size mismatches, a ``module.`` prefix from a data-parallel
    wrapper and an ``_orig_mod.`` one from torch.compile's."""
    expected = list(module.state_dict())
    known = set(expected)
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in known]
    lines = [f"the loaded state of model {name!r} does not fit {type(module).__name__}:"]
    if missing:
        lines.append(f"  missing keys (in the model, not in the state): {_key_list(missing)}")
    if unexpected:
        lines.append(f"  unexpected keys (in the state, not in the model): {_key_list(unexpected)}")
    lines.extend(f"  {line.strip()}" for line in str(exc).splitlines() if "size mismatch" in line)
    if not missing and not unexpected and len(lines) == 1:
        lines.append(f"  {exc}")
    compiled = _compile_mismatch(expected, list(state))
    prefix = "module."
    if compiled is not None:
        lines.append(compiled)
    elif unexpected and all(k.startswith(prefix) for k in unexpected):
        lines.append(
            "The state's keys start with 'module.': it was saved from a DataParallel/"
            "DistributedDataParallel wrapper. Pass transform_model="
            "ppe.training.manager.default_transform_model when saving, or strip the prefix."
        )
    elif missing and all(k.startswith(prefix) for k in missing):
        lines.append(
            "The model's keys start with 'module.': unwrap it when loading with "
            "transform_model=ppe.training.manager.default_transform_model."
        )
    if compiled is None:
        lines.append(
            f"Load a snapshot saved from the same architecture under the name {name!r}, or "
            f"load the weights yourself with model.load_state_dict(state['models'][{name!r}], "
            "strict=False) to keep the matching part."
        )
    return StateDictMismatchError("\n".join(lines))


def _compile_mismatch(expected: Sequence[str], saved: Sequence[str]) -> str | None:
    """The explanation when the model's and the state's keys differ only by torch.compile's
    ``_orig_mod.`` (one side compiled with ``torch.compile(model)``, the other not), else
    None."""
    if set(expected) == set(saved):
        return None
    if {k.replace(_COMPILED, "") for k in expected} != {k.replace(_COMPILED, "") for k in saved}:
        return None
    in_place = (
        "compile in place (model.compile(), or the runtime option {'compile': True}), which "
        "keeps the keys as they are"
    )
    if any(_COMPILED in k for k in saved):
        return (
            f"The state's keys carry {_COMPILED!r}: it was saved from a model wrapped by "
            "torch.compile (torch.compile(model) and ppe.compile return a wrapper that adds "
            "it), and this model is not wrapped. Resume with the model compiled as when it was "
            "saved (torch.compile(model) before handing it over), or strip the prefix from "
            "the saved model state: "
            f"{{k.replace({_COMPILED!r}, ''): v for k, v in state.items()}}. To compile from "
            f"now on, {in_place}."
        )
    return (
        f"The model's keys carry {_COMPILED!r} and the state's do not: this model is wrapped "
        "by torch.compile (torch.compile(model) or ppe.compile) and the state was saved from "
        "an uncompiled one. Resume with the same compile choice as when it was saved: hand "
        f"over the uncompiled module (compiled._orig_mod) and, to compile it, {in_place}."
    )


def load_optimizer_state(name: str, optimizer: Any, state: Mapping[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``; a torch optimizer's mismatch is explained
    (:func:`optimizer_mismatch_explained`).

    Raises:
        StateDictMismatchError: The state is another optimizer type's or has other groups.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        # Anything with load_state_dict (PPE does not type-check optimizers either).
        optimizer.load_state_dict(state)
        return
    with optimizer_mismatch_explained(name, optimizer):
        optimizer.load_state_dict(dict(state))


@contextlib.contextmanager
def optimizer_mismatch_explained(name: str, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Around loading the state of optimizer ``name``: torch's ``ValueError``/``KeyError`` and
    a state without some of the groups' hyperparameters (another optimizer type's) raise a
    :class:`StateDictMismatchError` naming the optimizer and the fix."""
    fix = (
        f"Create optimizer {name!r} as when the snapshot was saved (same type, the same "
        "parameters in the same groups), or restore only the weights with "
        "model.load_state_dict(state['models'][<name>])."
    )
    # Hyperparameters each group has now; a state from another optimizer type lacks some.
    before = [set(group) - {"params", "param_names"} for group in optimizer.param_groups]
    try:
        yield
    except (ValueError, KeyError) as exc:
        raise StateDictMismatchError(
            f"the loaded state of optimizer {name!r} ({type(optimizer).__name__}) does not fit "
            f"it: {exc}. {fix}"
        ) from exc
    for index, (keys, group) in enumerate(zip(before, optimizer.param_groups, strict=False)):
        lacking = sorted(keys - set(group))
        if lacking:
            raise StateDictMismatchError(
                f"the loaded state of optimizer {name!r} ({type(optimizer).__name__}) lacks the "
                f"hyperparameters {lacking} in param group {index}: it was saved from a "
                f"different optimizer type. {fix}"
            )
