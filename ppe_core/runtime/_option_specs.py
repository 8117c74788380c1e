"""Declarative runtime options (name, accepted types, default, doc) and their validation.

Device runtimes declare their options once with :class:`OptionSpec` and validate what a user
passes with :class:`RuntimeOptions`, so every runtime gives the same errors: an unknown option
lists the accepted ones, a wrong type names the type wanted (PPE's runtimes take an untyped
dict).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from ppe_core.errors import ConfigurationError, RuntimeOptionError, RuntimeOptionTypeError

__all__ = ["OptionSpec", "RuntimeOptions", "positive_int", "reject_undeclared", "reject_unknown"]


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One runtime option: what it accepts, its default and what it does.

    Args:
        name: The option's key in ``options`` / ``runtime_options``.
        types: Accepted types. ``bool`` is accepted only when listed (not as an ``int``).
            ``None`` is always accepted and means "the default".
        default: The value used when the option is absent or ``None``.
        doc: One line for error messages and the docs' option tables.
        example: A valid value written as Python, shown in error messages.
        check: ``fn(value) -> problem or None`` for checks beyond the type (ranges, choices).
        on_move: The option acts on the module the runtime moves (``ppe.to``): its forward
            (``autocast``), weights (``channels_last``), compilation (``compile``) or hooks
            installed on it (``report_memory``). ``create_trainer``/``create_evaluator``
            refuse it in ``runtime_options`` whose value differs from that of the runtime the
            model was moved with: their runtime never moves the model, so it would be ignored.
    """

    name: str
    types: tuple[type, ...]
    default: Any = None
    doc: str = ""
    example: str = "True"
    check: Callable[[Any], str | None] | None = None
    on_move: bool = False

    def type_names(self) -> str:
        """The accepted types in words, e.g. ``"bool, torch.dtype or dict"``."""
        names = [_type_name(t) for t in self.types]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]

    def accepts_type(self, value: Any) -> bool:
        """Whether ``value`` has one of the accepted types."""
        if isinstance(value, bool) and bool not in self.types:
            return False
        return isinstance(value, self.types)


class RuntimeOptions:
    """The options one runtime accepts, and the validator of what a user passes.

    Args:
        owner: The runtime's name, used in error messages (e.g. ``"CPURuntime"``).
        specs: The accepted options.

    Example:
        >>> spec = RuntimeOptions("MyRuntime", OptionSpec("fast", (bool,), False, "Go fast."))
        >>> spec.validate({"fast": True})
        {'fast': True}
    """

    def __init__(self, owner: str, *specs: OptionSpec) -> None:
        self.owner = owner
        self.specs: dict[str, OptionSpec] = {s.name: s for s in specs}
        if len(self.specs) != len(specs):
            raise ValueError(f"{owner}: an option is declared twice")

    @property
    def names(self) -> frozenset[str]:
        """The accepted option names (for ``BaseRuntime.accepted_options``)."""
        return frozenset(self.specs)

    def __iter__(self) -> Iterator[OptionSpec]:
        return iter(self.specs.values())

    def validate(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """Check ``options`` and return every declared option, defaults filled in.

        Raises:
            RuntimeOptionError: an unknown option, or a value the option's check rejects.
            RuntimeOptionTypeError: a value of the wrong type.
        """
        given = dict(options or {})
        listing = ", ".join(f"{s.name} ({s.type_names()})" for s in self)
        reject_unknown(self.owner, given, self.specs, listing)
        resolved: dict[str, Any] = {}
        for name, spec in self.specs.items():
            value = given.get(name)
            if value is None:
                resolved[name] = spec.default
                continue
            if not spec.accepts_type(value):
                raise RuntimeOptionTypeError(
                    f"{self.owner} option {name!r} must be {spec.type_names()}, got "
                    f"{type(value).__name__} {value!r}; e.g. options={{{name!r}: {spec.example}}}"
                )
            problem = spec.check(value) if spec.check is not None else None
            if problem is not None:
                raise RuntimeOptionError(
                    f"{self.owner} option {name!r} {problem}, got {value!r}; e.g. "
                    f"options={{{name!r}: {spec.example}}}"
                )
            resolved[name] = value
        return resolved

    def markdown_table(self) -> str:
        """The options as a Markdown table (option, types, default, meaning) for docs."""
        rows = ["| option | accepts | default | meaning |", "|---|---|---|---|"]
        rows += [f"| `{s.name}` | {s.type_names()} | `{s.default!r}` | {s.doc} |" for s in self]
        return "\n".join(rows)


def reject_unknown(
    owner: str,
    options: Mapping[str, Any],
    accepted: Iterable[str],
    listing: str,
    error: type[ConfigurationError] = RuntimeOptionError,
) -> None:
    """Raise ``error`` naming the keys of ``options`` not in ``accepted``, with ``listing``
    (the accepted options in words) and the fix."""
    unknown = sorted(set(options) - set(accepted), key=str)
    if unknown:
        raise error(
            f"{owner} does not understand the runtime option(s) "
            f"{', '.join(map(repr, unknown))}; accepted options: {listing or '(none)'}. "
            "Remove them from ppe.to(options=...) / runtime_options, or fix the spelling."
        )


def reject_undeclared(runtime_class: type, options: Mapping[str, Any]) -> None:
    """Raise :class:`~ppe_core.errors.ConfigurationError` for the keys of ``options`` outside
    the ``accepted_options`` declared in ``runtime_class``'s own body (none declared: any key
    is accepted, as in PPE)."""
    accepted = runtime_class.__dict__.get("accepted_options")
    if accepted is not None:
        listing = ", ".join(sorted(accepted))
        reject_unknown(runtime_class.__name__, options, accepted, listing, ConfigurationError)


def _type_name(t: type) -> str:
    # torch.dtype needs no entry: its module is "torch".
    if t is torch.amp.GradScaler:
        return "torch.amp.GradScaler"
    if issubclass(t, Mapping):
        return "dict"
    if t.__module__ in ("builtins", ""):
        return t.__name__
    return f"{t.__module__}.{t.__qualname__}"


def positive_int(value: Any) -> str | None:
    """An :attr:`OptionSpec.check`: the value must be an int >= 1 (bools pass as flags)."""
    if isinstance(value, bool):
        return None
    return None if value >= 1 else "must be >= 1"
