"""Named registries of runtimes, logics and extensions that remember who registered what.

Beyond PPE's plain dict of runtime classes, a registration carries who made it (a plugin,
with its distribution, or user code), maybe a lazy ``"module:attribute"`` target, and the
entry it replaced; names a first-party plugin holds stay with it; duplicates and failed
lookups are explained.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar, cast

from ppe_core.errors import (
    ArgumentTypeError,
    DuplicateRegistrationError,
    PluginConflictWarning,
    PluginLoadError,
    RegistryLookupError,
)

__all__ = ["LazyTarget", "Registrant", "Registry", "RegistryEntry", "describe"]

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


class Registry(Generic[T]):
    """A name -> object mapping where duplicates raise and each entry keeps its registrant.

    Plugins receive a registry through a ``ppe_register_*`` hook. Users read it through
    :meth:`entries` (a read-only view) or :meth:`get`. A registry with a
    :attr:`replaced_warning` lets user code (not a plugin hook) register over a taken name: the
    new object replaces the old with that warning, naming both (PPE's runtime registry).

    Args:
        kind: What the registry holds, used in messages ("runtime", "logic", "extension").
        describe_failures: Returns text about plugins that failed to load, appended to lookup
            errors so a missing name can be traced to its cause.
    """

    #: Warned with when user code replaces a taken name (``None``: a duplicate raises).
    replaced_warning: type[Warning] | None = None

    def __init__(self, kind: str, describe_failures: Callable[[], str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, RegistryEntry[T]] = {}
        self._describe_failures = describe_failures
        # Set by the plugin host while a plugin's hooks run, so entries name their plugin.
        self._current_registrant: Registrant | None = None

    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        """Register ``obj`` under ``name`` and return it.

        From a plugin's hook, a name a first-party plugin holds is not taken: the registration
        is skipped with a :class:`~ppe_core.errors.PluginConflictWarning` (docs/plugins.md,
        "Plugin isolation"), and ``obj`` is still returned.

        Raises:
            DuplicateRegistrationError: ``name`` is taken and ``replace`` is false.
            ArgumentTypeError: ``name`` is not a non-empty string or ``obj`` is unsuitable.
        """
        self._check_name(name, "register('mydev', obj)")
        self._validate(name, obj)
        entry = self._admit(name, obj, describe(obj), replace)
        if entry is not None:
            self._entries[name] = entry
        return obj

    def register_lazy(self, name: str, target: str, *, replace: bool = False) -> None:
        """Register ``name`` for ``"package.module:attribute"``, imported at first lookup.

        The object is validated when it is resolved (by :meth:`get` or :meth:`entries`), and
        a target that fails to import raises :class:`~ppe_core.errors.PluginLoadError` naming
        the registrant. Duplicates follow :meth:`register`'s rules.
        """
        lazy = LazyTarget(target)
        self._check_name(name, "register_lazy('mydev', 'pkg.mod:Obj')")
        # The placeholder stands in for T until _resolve replaces it with the real object.
        entry = self._admit(name, cast(T, lazy), target, replace)
        if entry is not None:
            self._entries[name] = entry

    def _check_name(self, name: object, example: str) -> None:
        if not isinstance(name, str) or not name:
            raise ArgumentTypeError(
                f"{self.kind} names must be non-empty strings, got {name!r}; pass the name "
                f"users will ask for, e.g. {example}"
            )

    def _admit(self, name: str, obj: T, described: str, replace: bool) -> RegistryEntry[T] | None:
        """The entry to store for ``obj`` under ``name`` (its registrant and the entry it
        replaces), or ``None`` when nothing changes: :func:`admit`'s
        duplicate policy, and :attr:`replaced_warning` when user code replaces a taken name
        (called directly by the public register methods: the caller's frame is found by
        depth)."""
        previous = self._entries.get(name)
        if (
            self.replaced_warning is not None
            and self._current_registrant is None  # user code, not a plugin's hook
            and previous is not None
            and not replace
        ):
            if previous.obj is obj:
                return None  # the same object again (e.g. set-up code run twice): nothing changes
            warnings.warn(
                self.replaced_warning(
                    f"{self.kind} for {name!r} replaced: {described} now serves {name!r} "
                    f"instead of {describe(previous.obj)} (registered by {previous.registrant}). "
                    f"Pass replace=True to replace it without this warning; unregister({name!r}) "
                    f"restores the previous {self.kind}."
                ),
                stacklevel=3,
            )
            replace = True
        admitted = admit(previous, self.kind, name, described, replace, self._current_registrant)
        return None if admitted is None else RegistryEntry(name, obj, *admitted)

    def _resolve(self, entry: RegistryEntry[T]) -> T:
        """The entry's object; a lazy entry's target is imported, validated and stored in place
        of the placeholder."""
        if type(entry.obj) is not LazyTarget:
            return entry.obj
        lazy = cast(LazyTarget, entry.obj)
        try:
            obj = cast(T, lazy.resolve())
        except (ImportError, AttributeError) as exc:
            raise PluginLoadError(
                f"{self.kind} {entry.name!r} (registered by {entry.registrant} as "
                f"{lazy.target}) could not be imported: {exc!r}. Fix or reinstall the plugin "
                f"that registers it, or block it with PPE_DISABLED_PLUGINS."
            ) from exc
        self._validate(entry.name, obj)
        resolved = RegistryEntry(entry.name, obj, entry.registrant, entry.replaced)
        if self._entries.get(entry.name) is entry:
            self._entries[entry.name] = resolved
        return obj

    def unregister(self, name: str) -> T:
        """Remove ``name``, restoring whatever it had replaced, and return its object."""
        entry = self._entries.pop(name, None)
        if entry is None:
            raise RegistryLookupError(self._not_found_message(name))
        if entry.replaced is not None:
            self._entries[name] = entry.replaced
        return self._resolve(entry)

    def get(self, name: str) -> T:
        """Return the object registered under ``name``.

        Raises:
            RegistryLookupError: nothing is registered under ``name``; the message lists what
                is registered and any plugin that failed to load.
        """
        entry = self._entries.get(name)
        if entry is None:
            raise RegistryLookupError(self._not_found_message(name))
        return self._resolve(entry)

    def entries(self) -> Mapping[str, RegistryEntry[T]]:
        """A read-only view of every entry, by name (lazy registrations are imported first)."""
        for entry in list(self._entries.values()):
            self._resolve(entry)
        return MappingProxyType(self._entries)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.kind}s: {', '.join(self.names()) or 'empty'}>"

    @property
    def registrant(self) -> Registrant | None:
        """Who registrations are attributed to now (``None``: user code, not a plugin hook)."""
        return self._current_registrant

    @contextmanager
    def registering(self, registrant: Registrant) -> Iterator[None]:
        """Attribute the registrations made inside the block to ``registrant`` (the plugin
        host wraps each plugin's loading in it)."""
        previous, self._current_registrant = self._current_registrant, registrant
        try:
            yield
        finally:
            self._current_registrant = previous

    def remove_registrant(self, plugin: str) -> None:
        """Undo every registration ``plugin`` made (unregistering it, or a half-loaded one)."""
        for name in [n for n, e in self._entries.items() if e.registrant.plugin == plugin]:
            self.unregister(name)

    def _validate(self, name: str, obj: T) -> None:
        """Reject objects this kind of registry cannot hold; subclasses tighten it."""

    def _not_found_message(self, name: str, hint: str = "") -> str:
        failures = self._describe_failures() if self._describe_failures else ""
        return not_found_message(self.kind, name, self.names(), failures, hint)
