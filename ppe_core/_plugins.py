"""Plugin discovery and the plugin host: the pluggy manager plus the registries it fills."""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from typing import TYPE_CHECKING, Any, Literal

import pluggy

from ppe_core import hookspecs
from ppe_core._registry import Registrant, Registry
from ppe_core._version import __version__
from ppe_core.errors import (
    ConfigurationError,
    PluginAPIVersionError,
    PluginConflictWarning,
    PluginHookError,
    PluginLoadError,
    PluginLoadWarning,
    TeardownHookWarning,
)
from ppe_core.runtime._registry import RuntimeRegistry

if TYPE_CHECKING:
    #: The first-party distributions, read from installed metadata on each access
    #: (:func:`first_party_distributions`).
    FIRST_PARTY_DISTRIBUTIONS: frozenset[str]

__all__ = [
    "BUILTIN_PLUGINS",
    "DEVICE_ENTRY_POINT_GROUP",
    "ENTRY_POINT_GROUP",
    "ENV_ALLOW_OVERRIDE",
    "ENV_DISABLED_PLUGINS",
    "ENV_DISABLE_PLUGIN_AUTOLOAD",
    "ENV_PLUGINS",
    "ENV_STRICT_PLUGINS",
    "ENV_TRACE_PLUGINS",
    "FIRST_PARTY_DISTRIBUTIONS",
    "PluginHost",
    "PluginRecord",
    "PluginSettings",
    "first_party_distributions",
    "get_plugin_host",
    "set_plugin_host",
]

#: Entry-point group scanned for plugins.
ENTRY_POINT_GROUP = hookspecs.PROJECT_NAME
#: Entry-point group in which a distribution declares the device types its plugin serves
#: (``cpu = "ppe_cpu.plugin"``), read in the same metadata scan: a device that finds no runtime
#: because that plugin failed or is blocked names it.
DEVICE_ENTRY_POINT_GROUP = f"{ENTRY_POINT_GROUP}.devices"
#: ``1``: skip the entry-point scan (built-in plugins and ``PPE_PLUGINS`` still load).
ENV_DISABLE_PLUGIN_AUTOLOAD = "PPE_DISABLE_PLUGIN_AUTOLOAD"
#: Comma-separated modules or entry-point names to load explicitly.
ENV_PLUGINS = "PPE_PLUGINS"
#: Comma-separated plugin names (entry point, module or distribution) never to load.
ENV_DISABLED_PLUGINS = "PPE_DISABLED_PLUGINS"
#: ``1``: a plugin that fails to load raises :class:`PluginLoadError` instead of warning.
ENV_STRICT_PLUGINS = "PPE_STRICT_PLUGINS"
#: ``1``: print pluggy's hook-call trace to stderr.
ENV_TRACE_PLUGINS = "PPE_TRACE_PLUGINS"
#: Comma-separated distributions whose plugins may replace (``replace=True``) a name that a
#: first-party plugin registered; without it such a registration is skipped with a warning.
ENV_ALLOW_OVERRIDE = "PPE_ALLOW_OVERRIDE"

_CORE = "ppe-core"
# A Requires-Dist line of an extra pinning one version: 'ppe-cpu==0.1.0; extra == "cpu"'.
_PINNED_IN_EXTRA = re.compile(
    r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*[^,;*]+;\s*extra\s*==\s*['\"](?P<extra>[^'\"]+)['\"]"
)

#: The core's own plugins, registered exactly like external ones: (name, module).
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (("ppe_core.logics", "ppe_core._builtin.logics"),)

Status = Literal["loaded", "failed", "blocked"]
Source = Literal["builtin", "entry point", "PPE_PLUGINS", "register()"]


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _names(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in environ.get(name, "").split(",") if part.strip())


def _normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _distribution_key(name: str | None) -> str | None:
    """A distribution name normalised as PEP 503 does (``PPE_Cpu`` -> ``ppe-cpu``)."""
    return None if name is None else re.sub(r"[-_.]+", "-", name).lower()


def _pinned_in_extras() -> dict[str, frozenset[str]]:
    """Extra -> the distributions ppe-core's installed metadata pins in it at one exact
    version (PEP 503 names); empty without installed ppe-core metadata (a source checkout)."""
    try:
        requires = distribution(_CORE).requires or []
    except PackageNotFoundError:
        requires = []
    pinned: dict[str, set[str]] = {}
    for req in requires:
        match = _PINNED_IN_EXTRA.match(req)
        if match:
            name = _distribution_key(match.group(1)) or ""
            pinned.setdefault(match.group("extra"), set()).add(name)
    return {extra: frozenset(names) for extra, names in pinned.items()}


def first_party_distributions() -> frozenset[str]:
    """The distributions whose plugins are first-party (PEP 503 names), read from metadata.

    ppe-core itself, and each distribution ppe-core's own installed metadata requires in an
    extra at one exact version (``cpu = ["ppe-cpu==0.1.0"]``: released with ppe-core). Only
    ppe-core's release writes that; nothing a plugin declares about itself adds to it. Without
    installed ppe-core metadata (a source checkout) only the built-ins are first-party.
    """
    return frozenset({_CORE}.union(*_pinned_in_extras().values()))


def standard_distributions() -> frozenset[str]:
    """The distributions of ppe-core's ``standard`` extra (ppe-extensions: the standard
    extensions), read from the same metadata as :func:`first_party_distributions`."""
    return _pinned_in_extras().get("standard", frozenset())


def __getattr__(name: str) -> Any:
    if name == "FIRST_PARTY_DISTRIBUTIONS":  # the former constant, now read from metadata
        return first_party_distributions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _entry_point_distribution(ep: EntryPoint) -> tuple[str | None, str | None]:
    dist = ep.dist
    return (dist.metadata["Name"], dist.version) if dist is not None else (None, None)


@dataclass(frozen=True)
class PluginSettings:
    """How a :class:`PluginHost` discovers plugins; :meth:`from_env` reads the PPE_* switches."""

    autoload: bool = True
    plugins: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    strict: bool = False
    trace: bool = False
    allow_override: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginSettings:
        """Settings from the environment (read now, not at import time)."""
        env = os.environ if environ is None else environ
        return cls(
            autoload=not _flag(env, ENV_DISABLE_PLUGIN_AUTOLOAD),
            plugins=_names(env, ENV_PLUGINS),
            disabled=_names(env, ENV_DISABLED_PLUGINS),
            strict=_flag(env, ENV_STRICT_PLUGINS),
            trace=_flag(env, ENV_TRACE_PLUGINS),
            allow_override=_names(env, ENV_ALLOW_OVERRIDE),
        )

    def is_disabled(self, *names: str | None) -> bool:
        """Whether any of ``names`` (entry point, module, distribution) is blocked."""
        blocked = {_normalize(n) for n in self.disabled}
        return any(n is not None and _normalize(n) in blocked for n in names)

    def may_override(self, distribution: str | None) -> bool:
        """Whether the user let ``distribution``'s plugins replace first-party registrations."""
        allowed = {_distribution_key(n) for n in self.allow_override}
        return distribution is not None and _distribution_key(distribution) in allowed


@dataclass
class PluginRecord:
    """What happened to one plugin: where it came from and whether it loaded."""

    name: str
    module: str | None
    source: Source
    status: Status = "loaded"
    distribution: str | None = None
    version: str | None = None
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    #: Whether a first-party distribution provides it (set by the host from installed
    #: metadata; objects passed to ``register()`` never are).
    first_party: bool = False

    @property
    def builtin(self) -> bool:
        """Whether the plugin ships inside ppe-core itself."""
        return self.source == "builtin"

    @property
    def registrant(self) -> Registrant:
        return Registrant(self.name, self.distribution, self.version, self.first_party)

    def describe(self) -> str:
        """One line naming the plugin, its origin and distribution."""
        where = f"module {self.module}" if self.module else "inline object"
        dist = f", distribution {self.distribution} {self.version}" if self.distribution else ""
        return f"plugin {self.name!r} ({self.source}: {where}{dist})"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view for ``python -m ppe_core plugins --json``."""
        return {
            "name": self.name,
            "module": self.module,
            "source": self.source,
            "builtin": self.builtin,
            "status": self.status,
            "distribution": self.distribution,
            "version": self.version,
            "error": self.error,
        }


class PluginHost:
    """A pluggy plugin manager and the runtime, logic and extension registries it fills.

    One host is active per process (:func:`get_plugin_host`); tests build their own isolated
    host and activate it with :func:`set_plugin_host` or :func:`ppe_core.testing.plugin_host`.

    Args:
        settings: Discovery settings; defaults to :meth:`PluginSettings.from_env`.
        load: Load built-in plugins, entry points and ``settings.plugins`` now.
        builtins: Register the core's built-in plugins when loading.
    """

    def __init__(
        self,
        settings: PluginSettings | None = None,
        *,
        load: bool = True,
        builtins: bool = True,
        standard: bool = True,
    ) -> None:
        self.settings = settings if settings is not None else PluginSettings.from_env()
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        if self.settings.trace:
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self.records: dict[str, PluginRecord] = {}
        self._first_party: frozenset[str] = frozenset({_CORE})
        # Device type -> distributions that declare it (DEVICE_ENTRY_POINT_GROUP).
        self._device_providers: dict[str, set[str]] = {}
        self.runtimes = RuntimeRegistry(
            self._describe_failures, self._provider_failure, self.default_device
        )
        self.logics: Registry[Any] = Registry("logic", self._describe_failures)
        self.extensions: Registry[Any] = Registry("extension", self._describe_failures)
        #: ppe_core module path (a face, see ``ppe_register_modules``) -> provider modules.
        self.modules: Registry[tuple[str, ...]] = Registry("module path", self._describe_failures)
        self._registries: tuple[Registry[Any], ...] = (
            self.runtimes,
            self.logics,
            self.extensions,
            self.modules,
        )
        # Historic calls: every plugin registered from now on receives its registries.
        self.pm.hook.ppe_register_runtimes.call_historic(kwargs={"registry": self.runtimes})
        self.pm.hook.ppe_register_logics.call_historic(kwargs={"registry": self.logics})
        self.pm.hook.ppe_register_extensions.call_historic(kwargs={"registry": self.extensions})
        self.pm.hook.ppe_register_modules.call_historic(kwargs={"registry": self.modules})
        if load:
            self.load(builtins=builtins, standard=standard)

    # Loading ------------------------------------------------------------------------------
    def load(self, *, builtins: bool = True, standard: bool = True) -> None:
        """Register built-ins, then entry points (unless autoload is off), then ``PPE_PLUGINS``.

        First-party entry points load before any other, so what they register is theirs
        whatever order ``sys.path`` lists the distributions in. With ``standard`` (the default)
        and autoload off, the entry points of the ``standard`` extra's distributions (the
        standard extensions, built-ins before they became a package) load all the same;
        ``PPE_DISABLED_PLUGINS=ppe-extensions`` disables them.
        """
        if builtins:
            for name, module in BUILTIN_PLUGINS:
                record = PluginRecord(name, module, "builtin", "loaded", _CORE, __version__)
                record.first_party = True
                self._load(record, functools.partial(_import, module))
        pinned = _pinned_in_extras()  # one metadata read for both uses
        self._first_party = frozenset({_CORE}.union(*pinned.values()))
        eps = self._discover()
        if self.settings.autoload:
            for ep in eps.values():
                self._load_entry_point(ep, "entry point")
        elif standard:
            wanted = pinned.get("standard", frozenset())
            for ep in eps.values():
                if _distribution_key(_entry_point_distribution(ep)[0]) in wanted:
                    self._load_entry_point(ep, "entry point")
        items = self.settings.plugins
        first = [item for item in items if item in eps and self._ep_first_party(eps[item])]
        for item in [*first, *(item for item in items if item not in first)]:
            if item in self.records:
                continue
            if item in eps:
                self._load_entry_point(eps[item], "PPE_PLUGINS")
            else:
                record = PluginRecord(item, item, "PPE_PLUGINS")
                self._load(record, functools.partial(_import, item))

    def register(self, plugin: object, name: str | None = None) -> PluginRecord:
        """Register an in-process plugin object (a module, class instance or namespace).

        Unlike discovered plugins, failures always raise: the caller is right here.
        """
        name = name or self.pm.get_canonical_name(plugin)
        module = getattr(plugin, "__name__", None) or type(plugin).__module__
        record = PluginRecord(name, module, "register()")
        self._load(record, lambda: plugin, raise_errors=True)
        return record

    def unregister(self, name: str) -> None:
        """Remove a plugin and everything it registered."""
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        for registry in self._registries:
            registry.remove_registrant(name)
        self.records.pop(name, None)

    def _ep_first_party(self, ep: EntryPoint) -> bool:
        return _distribution_key(_entry_point_distribution(ep)[0]) in self._first_party

    def _discover(self) -> dict[str, EntryPoint]:
        """The plugins' entry points by name, first-party distributions first, and (from the
        same metadata scan) which distributions declare which device types.

        Entry-point names are chosen by each plugin, so one may claim a first-party plugin's
        name: the first-party one keeps it and the other is skipped with a warning naming it.
        """
        found = entry_points()
        for ep in found.select(group=DEVICE_ENTRY_POINT_GROUP):
            dist = _entry_point_distribution(ep)[0]
            if dist is not None:
                self._device_providers.setdefault(ep.name, set()).add(dist)
        plugins = found.select(group=ENTRY_POINT_GROUP)
        eps: dict[str, EntryPoint] = {}
        for ep in sorted(plugins, key=lambda ep: not self._ep_first_party(ep)):
            kept = eps.setdefault(ep.name, ep)
            if kept is not ep:
                dist, version = _entry_point_distribution(ep)
                kept_dist, kept_version = _entry_point_distribution(kept)
                warnings.warn(
                    PluginConflictWarning(
                        f"ppe-core plugin entry point {ep.name!r} of {dist} {version} "
                        f"({ep.value}) is skipped: {kept_dist} {kept_version} provides an entry "
                        f"point of that name ({kept.value}). Rename one of them, or uninstall "
                        "the one you do not want."
                    ),
                    stacklevel=4,
                )
        return eps

    def _load_entry_point(self, ep: EntryPoint, source: Source) -> None:
        dist_name, version = _entry_point_distribution(ep)
        record = PluginRecord(ep.name, ep.value.split(":")[0], source, "loaded", dist_name, version)
        record.first_party = self._ep_first_party(ep)
        self._load(record, ep.load)

    def _load(
        self, record: PluginRecord, obtain: Callable[[], object], *, raise_errors: bool = False
    ) -> None:
        if record.name in self.records:
            if raise_errors:
                raise ConfigurationError(
                    f"a plugin named {record.name!r} is already registered "
                    f"({self.records[record.name].describe()}); pass another name"
                )
            return  # the same entry point seen twice on sys.path
        self.records[record.name] = record
        if self.settings.is_disabled(record.name, record.module, record.distribution):
            record.status = "blocked"
            self.pm.set_blocked(record.name)
            return
        try:
            with self._registering(record):
                plugin = obtain()
                _check_hook_api(plugin, record)  # before its historic hooks run
                self.pm.register(plugin, name=record.name)
                _check_hook_names(self.pm, plugin, record)
        except (Exception, SystemExit) as exc:
            self._rollback(record)
            record.status = "failed"
            record.exception = exc
            record.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            if raise_errors:
                del self.records[record.name]  # nothing of it remains; the caller may retry
                raise
            message = (
                f"ppe-core {record.describe()} failed to load and was skipped: {record.error}\n"
                f"Fix or uninstall it, block it with {ENV_DISABLED_PLUGINS}={record.name}, "
                f"or set {ENV_STRICT_PLUGINS}=1 to make this an error."
            )
            if self.settings.strict:
                raise PluginLoadError(message) from exc
            warnings.warn(PluginLoadWarning(message), stacklevel=2)

    @contextmanager
    def _registering(self, record: PluginRecord) -> Iterator[None]:
        """Attribute registrations made while ``record``'s plugin loads to that plugin."""
        registrant = record.registrant
        if record.source in ("entry point", "PPE_PLUGINS") and not record.first_party:
            # An installed package: it may replace a first-party name only with the user's
            # consent (ENV_ALLOW_OVERRIDE); objects passed to register() are the user's own.
            may = self.settings.may_override(record.distribution)
            registrant = replace(registrant, may_override=may)
        with ExitStack() as stack:
            for registry in self._registries:
                stack.enter_context(registry.registering(registrant))
            yield

    def _rollback(self, record: PluginRecord) -> None:
        plugin = self.pm.get_plugin(record.name)
        if plugin is not None:
            self.pm.unregister(plugin)
        for registry in self._registries:
            registry.remove_registrant(record.name)

    # Queries ------------------------------------------------------------------------------
    @property
    def failures(self) -> list[PluginRecord]:
        """Plugins that failed to load, in load order."""
        return [r for r in self.records.values() if r.status == "failed"]

    def _describe_failures(self) -> str:
        lines = [f"  - {r.describe()}: {r.error}" for r in self.failures]
        lines += [
            f"  - {r.describe()}: blocked by {ENV_DISABLED_PLUGINS}"
            for r in self.records.values()
            if r.status == "blocked"
        ]
        if not lines:
            return ""
        return "Plugins that did not load and may have provided it:\n" + "\n".join(lines)

    def _provider_failure(self, device_type: str) -> str | None:
        """Why the plugin that declares ``device_type`` is unavailable, if it failed/blocked."""
        providers = self._device_providers.get(device_type, set())
        for record in self.records.values():
            if record.status != "loaded" and record.distribution in providers:
                reason = record.error if record.status == "failed" else "it is blocked"
                return f"Its plugin {record.describe()} did not load: {reason}"
        return None

    def default_device(self) -> str:
        """What ``device="auto"`` means here, as answered by the ``ppe_default_device`` hook."""
        answer = self.pm.hook.ppe_default_device()
        if not answer:
            raise ConfigurationError(
                "device='auto' needs a plugin that names a default device, and none answered. "
                "Install one (pip install ppe-cpu) or pass an explicit device such as 'cpu'."
            )
        return str(answer)

    def trainer_setup(self, trainer: Any) -> None:
        """Calls every ``ppe_trainer_setup`` hook (once per ``Trainer.run()``)."""
        self._setup("ppe_trainer_setup", {"trainer": trainer})

    def trainer_teardown(self, trainer: Any, exception: BaseException | None) -> None:
        """Calls every ``ppe_trainer_teardown`` hook; see :meth:`_teardown` for errors."""
        self._teardown("ppe_trainer_teardown", {"trainer": trainer, "exception": exception})

    def evaluator_setup(self, evaluator: Any) -> None:
        """Calls every ``ppe_evaluator_setup`` hook (once per ``Evaluator.run()``)."""
        self._setup("ppe_evaluator_setup", {"evaluator": evaluator})

    def evaluator_teardown(self, evaluator: Any, exception: BaseException | None) -> None:
        """Calls every ``ppe_evaluator_teardown`` hook; see :meth:`_teardown` for errors."""
        self._teardown("ppe_evaluator_teardown", {"evaluator": evaluator, "exception": exception})

    def _setup(self, name: str, kwargs: dict[str, Any]) -> None:
        """Calls a setup hook through pluggy (wrappers included); an implementation's error is
        re-raised as :class:`~ppe_core.errors.PluginHookError` naming its plugin."""
        caller = getattr(self.pm.hook, name)
        try:
            caller(**kwargs)
        except Exception as exc:
            impl = _raising_impl(caller.get_hookimpls(), exc)
            if impl is None:  # raised by pluggy itself (e.g. a malformed wrapper)
                raise
            raise PluginHookError(self._hook_failure(name, impl.plugin_name, exc)) from exc

    def _hook_failure(self, hook: str, plugin: str, exc: BaseException) -> str:
        """Names the plugin whose ``hook`` raised ``exc`` and how to disable it."""
        record = self.records.get(plugin)
        if record is None:
            who, disable = f"plugin {plugin!r}", f"unregister it with pm.unregister({plugin!r})"
        elif record.source == "register()":
            who = record.describe()
            disable = f"unregister it: ppe_core.plugins.get_plugin_host().unregister({plugin!r})"
        elif record.builtin:
            who, disable = record.describe(), "this is a ppe-core bug: please report it"
        else:
            who = record.describe()
            disable = (
                f"disable it with {ENV_DISABLED_PLUGINS}={record.distribution or record.name}"
                + (f" or uninstall {record.distribution}" if record.distribution else "")
                + (f" (and drop it from {ENV_PLUGINS})" if record.source == "PPE_PLUGINS" else "")
            )
        return f"{hook} of {who} raised {exc!r}. Fix the plugin, or {disable}."

    def _teardown(self, name: str, kwargs: dict[str, Any]) -> None:
        """Runs each teardown implementation, even when an earlier one raised.

        The hook contract: a teardown error never replaces the run's error. While a run is
        failing (``exception`` given), each teardown error becomes a
        :class:`~ppe_core.errors.TeardownHookWarning` naming the plugin, and the caller re-raises
        the run's error. After a successful run the first teardown error is raised (once every
        implementation has run) as :class:`~ppe_core.errors.PluginHookError`, since nothing
        else reports it.

        Wrapper implementations (``wrapper=True`` or ``hookwrapper=True``) run around the
        others: their code before ``yield`` first, their code after it last, receiving the
        plain implementations' results (a new-style wrapper must return them). The others'
        errors are not thrown into them: each is reported by the contract above.
        """
        failing = kwargs["exception"] is not None
        errors: list[tuple[str, Exception]] = []
        wrappers: list[tuple[str, Any, bool]] = []  # (plugin, generator, old-style)
        results: list[Any] = []
        for impl in reversed(getattr(self.pm.hook, name).get_hookimpls()):
            try:
                out = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
                if impl.wrapper or impl.hookwrapper:
                    next(out)  # run the wrapper up to its yield
                    wrappers.append((impl.plugin_name, out, impl.hookwrapper))
                else:
                    results.append(out)
            except Exception as exc:
                errors.append((impl.plugin_name, exc))
        for plugin, generator, old_style in reversed(wrappers):
            try:
                generator.send(pluggy.Result(results, None) if old_style else results)
            except StopIteration:
                continue
            except Exception as exc:
                errors.append((plugin, exc))
                continue
            generator.close()
            errors.append((plugin, RuntimeError("the wrapper yielded more than once")))
        for plugin, error in errors:
            if failing:
                warnings.warn(
                    f"{name} of plugin {plugin!r} raised {error!r} while the run was "
                    f"already failing with {kwargs['exception']!r}; the run's error is "
                    "re-raised. Fix the hook so that it tolerates failed runs.",
                    TeardownHookWarning,
                    stacklevel=3,
                )
        if errors and not failing:
            plugin, error = errors[0]
            raise PluginHookError(self._hook_failure(name, plugin, error)) from error

    def environment_info(self) -> list[str]:
        """Lines from every plugin's ``ppe_environment_info`` hook."""
        lines: list[str] = []
        for result in reversed(self.pm.hook.ppe_environment_info()):
            lines.extend(result or [])
        return lines


def _import(module: str) -> object:
    return importlib.import_module(module)


def _raising_impl(impls: list[pluggy.HookImpl], exc: BaseException) -> pluggy.HookImpl | None:
    """The implementation ``exc`` was raised in: the innermost traceback frame running one.

    pluggy does not say which implementation raised, so the traceback's frames are matched to
    the implementations' code objects (innermost, so a wrapper an error passed through is not
    blamed for it).
    """
    codes = {}
    for impl in impls:
        code = getattr(getattr(impl.function, "__func__", impl.function), "__code__", None)
        if code is not None:
            codes[code] = impl
    found = None
    tb = exc.__traceback__
    while tb is not None:
        found = codes.get(tb.tb_frame.f_code, found)
        tb = tb.tb_next
    return found


def _check_hook_api(plugin: object, record: PluginRecord) -> None:
    """Refuse a plugin that declares a hook API version this ppe-core does not provide.

    Undeclared means "any version" (every plugin written before versions existed). The same
    major version with a minor version up to ours is compatible: minor versions only add.
    """
    declared = getattr(plugin, "PPE_CORE_HOOK_API", None)
    if declared is None:
        return
    ours = hookspecs.PPE_CORE_HOOK_API
    ours_text = f"{ours[0]}.{ours[1]}"
    if not (
        isinstance(declared, tuple)
        and len(declared) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in declared)
    ):
        raise PluginAPIVersionError(
            f"{record.describe()} declares PPE_CORE_HOOK_API = {declared!r}, which is not a "
            f"(major, minor) tuple of ints; declare the ppe-core hook API it was written for, "
            f"e.g. PPE_CORE_HOOK_API = {ours!r} for this ppe-core (hook API {ours_text})"
        )
    major, minor = declared
    if major == ours[0] and minor <= ours[1]:
        return
    dist = record.distribution or record.module or record.name
    if (major, minor) > ours:
        fix = (
            f"upgrade ppe-core to a release that provides hook API {major}.{minor} "
            f"(pip install -U ppe-core), or install a release of {dist} written for hook API "
            f"{ours[0]}.x"
        )
    else:
        fix = (
            f"upgrade {dist} to a release written for hook API {ours[0]}.x, or install a "
            f"ppe-core release that provides hook API {major}.{minor}"
        )
    raise PluginAPIVersionError(
        f"{record.describe()} was written for ppe-core hook API {major}.{minor}, but this "
        f"ppe-core {__version__} provides hook API {ours_text}; {fix}"
    )


def _check_hook_names(pm: pluggy.PluginManager, plugin: object, record: PluginRecord) -> None:
    """Reject ``ppe_*`` hook implementations that match no spec (typos never fire silently)."""
    for caller in pm.get_hookcallers(plugin) or []:
        if not caller.has_spec():
            known = sorted(n for n in dir(hookspecs) if n.startswith("ppe_"))
            raise ConfigurationError(
                f"{record.describe()} implements unknown hook {caller.name!r}; "
                f"known hooks: {', '.join(known)}"
            )


_host: PluginHost | None = None
_host_lock = threading.Lock()


def get_plugin_host() -> PluginHost:
    """The active plugin host, created (and plugins loaded) on first use."""
    global _host
    host = _host
    if host is not None:
        return host
    with _host_lock:
        if _host is None:
            # Publish before loading so a plugin that touches ppe_core registries while it
            # loads sees this host instead of recursing into a second one.
            host = PluginHost(load=False)
            _host = host
            try:
                host.load()
            except BaseException:
                _host = None
                raise
        return _host


def set_plugin_host(host: PluginHost | None) -> PluginHost | None:
    """Make ``host`` the active host (``None``: rebuild lazily); returns the previous one."""
    global _host
    previous, _host = _host, host
    return previous
