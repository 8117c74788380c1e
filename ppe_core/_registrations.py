"""What a registration carries beyond PPE's plain dict of runtime classes: who made it (a
plugin, with its distribution, or user code), a lazy ``"module:attribute"`` target, the entry
it replaced; first-party names kept from other plugins; duplicates and failed lookups
explained."""

from __future__ import annotations

import difflib
import importlib
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ppe_core.errors import ArgumentTypeError, DuplicateRegistrationError, PluginConflictWarning

__all__ = [
    "LazyTarget",
    "Registrant",
    "RegistryEntry",
    "admit",
    "describe",
    "not_found_message",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Registrant:
    """Who made a registration: a plugin (with its distribution) or user code.

    ``first_party`` is set by the plugin host from the distribution that provides the plugin
    (never from a name the plugin chooses); a name a first-party registrant holds stays with it
    unless the newcomer passes ``replace=True`` and ``may_override`` is true (user code, or a
    distribution the user allowed with ``PPE_ALLOW_OVERRIDE``).
    """

    plugin: str
    distribution: str | None = None
    version: str | None = None
    first_party: bool = False
    may_override: bool = True

    @classmethod
    def of_caller(cls, depth: int = 1) -> Registrant:
        """User code outside any plugin: the module ``depth`` frames above the caller."""
        try:
            module = sys._getframe(depth + 1).f_globals.get("__name__", "?")
        except ValueError:  # pragma: no cover - stack shallower than expected
            module = "?"
        return cls(plugin=f"<code in module {module}>")

    def __str__(self) -> str:
        if self.distribution is None:
            return f"plugin {self.plugin!r}"
        return f"plugin {self.plugin!r} ({self.distribution} {self.version or '?'})"


class LazyTarget:
    """A registered ``"package.module:attribute"`` imported only when first looked up.

    Registering names this way keeps plugin discovery cheap: ``import ppe_core`` plus the first
    registry lookup imports no extension or training module until one is asked for by name.
    """

    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        module, sep, attribute = target.partition(":")
        if not (module and sep and attribute):
            raise ArgumentTypeError(
                f"a lazy registration target must read 'package.module:attribute', got "
                f"{target!r}; e.g. register_lazy('MyExt', 'my_plugin._ext:MyExt')"
            )
        self.target = target

    def resolve(self) -> object:
        """Import the module and return the attribute."""
        module, _, attribute = self.target.partition(":")
        obj: object = importlib.import_module(module)
        for part in attribute.split("."):
            obj = getattr(obj, part)
        return obj

    def __repr__(self) -> str:
        return f"<lazy {self.target}>"


@dataclass(frozen=True)
class RegistryEntry(Generic[T]):
    """One registered object, who registered it, and what it replaced (if anything)."""

    name: str
    obj: T
    registrant: Registrant
    replaced: RegistryEntry[T] | None = None


def admit(
    previous: RegistryEntry[Any] | None,
    kind: str,
    name: str,
    described: str,
    replace: bool,
    current: Registrant | None,
) -> tuple[Registrant, RegistryEntry[Any] | None] | None:
    """The registrant of a new entry ``name`` and the entry it replaces (``previous``, the one
    registered now); raises on a duplicate unless ``replace``; ``None`` when a plugin's
    registration over a first-party entry is skipped. ``current`` is the plugin whose hook
    runs, ``None`` for user code (found three frames up: the registry's public method's caller).
    """
    registrant = current or Registrant.of_caller(3)
    if previous is None:
        return registrant, None
    held = previous.registrant
    # Inside a plugin's hook, any installed package could be the caller: a first-party
    # entry stays unless the user allowed this one to replace it.
    if (
        current is not None
        and held.first_party
        and not registrant.first_party
        and not (replace and registrant.may_override)
    ):
        _warn_skipped(kind, name, described, held, registrant, replace)
        return None
    if not replace:
        raise DuplicateRegistrationError(
            f"{kind} {name!r} is already registered by {previous.registrant} "
            f"as {describe(previous.obj)}; {registrant} tried to register "
            f"{described} under the same name. Use another name, or pass "
            f"replace=True to override it on purpose."
        )
    return registrant, previous


def _warn_skipped(
    kind: str, name: str, described: str, held: Registrant, registrant: Registrant, replace: bool
) -> None:
    if replace:
        fix = (
            f"It passed replace=True, which over a first-party {kind} needs your "
            f"consent: set PPE_ALLOW_OVERRIDE={registrant.distribution or registrant.plugin} "
            "if you want it to win."
        )
    else:
        fix = (
            "If that is not what you want, uninstall it or block it with "
            f"PPE_DISABLED_PLUGINS={registrant.distribution or registrant.plugin}."
        )
    warnings.warn(
        PluginConflictWarning(
            f"{registrant} tried to register {kind} {name!r} ({described}), which the "
            f"first-party {held} serves; the registration is skipped and {name!r} stays "
            f"with {held.distribution or held.plugin}. {fix}"
        ),
        stacklevel=5,
    )


def not_found_message(kind: str, name: str, names: list[str], failures: str, hint: str = "") -> str:
    """The lookup error's message: the name, close matches, what is registered, plugins that
    failed to load (``failures``), and ``hint`` or the usual fixes."""
    lines = [f"No {kind} is registered under {name!r}."]
    close = difflib.get_close_matches(name, names, n=3)
    if close:
        lines.append(f"Did you mean: {', '.join(close)}?")
    lines.append(f"Registered {kind}s: {', '.join(names) or '(none)'}.")
    if failures:
        lines.append(failures)
    lines.append(
        hint
        or (
            f"Check the spelling, install the plugin that provides it, or register it from a "
            f"plugin's ppe_register_{kind}s(registry) hook (see docs/plugins.md)."
        )
    )
    return "\n".join(lines)


def describe(obj: object) -> str:
    """``module.QualName`` of a class or function, else its ``repr`` (for messages)."""
    qualname = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if qualname and module:
        return f"{module}.{qualname}"
    return repr(obj)
