"""Plugin discovery and the plugin host: the pluggy manager plus the registries it fills."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

import pluggy

from ppe_core import hookspecs
from ppe_core._registry import Registrant, Registry
from ppe_core._version import __version__
from ppe_core.errors import (
    ConfigurationError,
    PluginLoadError,
    PluginLoadWarning,
    TeardownHookWarning,
)
from ppe_core.runtime._registry import FIRST_PARTY_PROVIDERS, RuntimeRegistry

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "ENV_DISABLED_PLUGINS",
    "ENV_DISABLE_PLUGIN_AUTOLOAD",
    "ENV_PLUGINS",
    "ENV_STRICT_PLUGINS",
    "ENV_TRACE_PLUGINS",
    "PluginHost",
    "PluginRecord",
    "PluginSettings",
    "get_plugin_host",
    "set_plugin_host",
]

#: Entry-point group scanned for plugins.
ENTRY_POINT_GROUP = hookspecs.PROJECT_NAME
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

#: The core's own plugins, registered exactly like external ones: (name, module).
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("ppe_core.logics", "ppe_core._builtin.logics"),
    ("ppe_core.extensions", "ppe_core._builtin.extensions"),
)

Status = Literal["loaded", "failed", "blocked"]
Source = Literal["builtin", "entry point", "PPE_PLUGINS", "register()"]


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _names(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in environ.get(name, "").split(",") if part.strip())


def _normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


@dataclass(frozen=True)
class PluginSettings:
    """How a :class:`PluginHost` discovers plugins; :meth:`from_env` reads the PPE_* switches."""

    autoload: bool = True
    plugins: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    strict: bool = False
    trace: bool = False

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
        )

    def is_disabled(self, *names: str | None) -> bool:
        """Whether any of ``names`` (entry point, module, distribution) is blocked."""
        blocked = {_normalize(n) for n in self.disabled}
        return any(n is not None and _normalize(n) in blocked for n in names)


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

    @property
    def builtin(self) -> bool:
        """Whether the plugin ships inside ppe-core itself."""
        return self.source == "builtin"

    @property
    def registrant(self) -> Registrant:
        return Registrant(self.name, self.distribution, self.version)

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
        self, settings: PluginSettings | None = None, *, load: bool = True, builtins: bool = True
    ) -> None:
        self.settings = settings if settings is not None else PluginSettings.from_env()
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        if self.settings.trace:
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self.records: dict[str, PluginRecord] = {}
        self.runtimes = RuntimeRegistry(self._describe_failures, self._provider_failure)
        self.logics: Registry[Any] = Registry("logic", self._describe_failures)
        self.extensions: Registry[Any] = Registry("extension", self._describe_failures)
        self._registries: tuple[Registry[Any], ...] = (self.runtimes, self.logics, self.extensions)
        # Historic calls: every plugin registered from now on receives its registries.
        self.pm.hook.ppe_register_runtimes.call_historic(kwargs={"registry": self.runtimes})
        self.pm.hook.ppe_register_logics.call_historic(kwargs={"registry": self.logics})
        self.pm.hook.ppe_register_extensions.call_historic(kwargs={"registry": self.extensions})
        if load:
            self.load(builtins=builtins)

    # Loading ------------------------------------------------------------------------------
    def load(self, *, builtins: bool = True) -> None:
        """Register built-ins, then entry points (unless autoload is off), then ``PPE_PLUGINS``."""
        if builtins:
            for name, module in BUILTIN_PLUGINS:
                record = PluginRecord(name, module, "builtin", "loaded", "ppe-core", __version__)
                self._load(record, functools.partial(_import, module))
        eps = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        if self.settings.autoload:
            for ep in eps.values():
                self._load_entry_point(ep, "entry point")
        for item in self.settings.plugins:
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
            registry._remove_registrant(name)
        self.records.pop(name, None)

    def _load_entry_point(self, ep: EntryPoint, source: Source) -> None:
        dist = ep.dist
        dist_name = dist.metadata["Name"] if dist is not None else None
        version = dist.version if dist is not None else None
        record = PluginRecord(ep.name, ep.value.split(":")[0], source, "loaded", dist_name, version)
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
        previous = [r._current_registrant for r in self._registries]
        for registry in self._registries:
            registry._current_registrant = registrant
        try:
            yield
        finally:
            for registry, prev in zip(self._registries, previous, strict=True):
                registry._current_registrant = prev

    def _rollback(self, record: PluginRecord) -> None:
        plugin = self.pm.get_plugin(record.name)
        if plugin is not None:
            self.pm.unregister(plugin)
        for registry in self._registries:
            registry._remove_registrant(record.name)

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
        """Why the first-party plugin for ``device_type`` is unavailable, if it failed/blocked."""
        provider = FIRST_PARTY_PROVIDERS.get(device_type)
        if provider is None:
            return None
        for record in self.records.values():
            if record.status != "loaded" and provider in {
                record.distribution,
                record.name.replace("_", "-"),
            }:
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
        self.pm.hook.ppe_trainer_setup(trainer=trainer)

    def trainer_teardown(self, trainer: Any, exception: BaseException | None) -> None:
        """Calls every ``ppe_trainer_teardown`` hook; see :meth:`_teardown` for errors."""
        self._teardown("ppe_trainer_teardown", {"trainer": trainer, "exception": exception})

    def evaluator_setup(self, evaluator: Any) -> None:
        """Calls every ``ppe_evaluator_setup`` hook (once per ``Evaluator.run()``)."""
        self.pm.hook.ppe_evaluator_setup(evaluator=evaluator)

    def evaluator_teardown(self, evaluator: Any, exception: BaseException | None) -> None:
        """Calls every ``ppe_evaluator_teardown`` hook; see :meth:`_teardown` for errors."""
        self._teardown("ppe_evaluator_teardown", {"evaluator": evaluator, "exception": exception})

    def _teardown(self, name: str, kwargs: dict[str, Any]) -> None:
        """Runs each teardown implementation, even when an earlier one raised.

        The hook contract: a teardown error never replaces the run's error. While a run is
        failing (``exception`` given), each teardown error becomes a
        :class:`~ppe_core.errors.TeardownHookWarning` naming the plugin, and the caller re-raises
        the run's error. After a successful run the first teardown error is raised (once every
        implementation has run), since nothing else reports it.
        """
        failing = kwargs["exception"] is not None
        first: BaseException | None = None
        for impl in reversed(getattr(self.pm.hook, name).get_hookimpls()):
            try:
                impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
            except Exception as exc:
                if failing:
                    warnings.warn(
                        f"{name} of plugin {impl.plugin_name!r} raised {exc!r} while the run was "
                        f"already failing with {kwargs['exception']!r}; the run's error is "
                        "re-raised. Fix the hook so that it tolerates failed runs.",
                        TeardownHookWarning,
                        stacklevel=3,
                    )
                elif first is None:
                    first = exc
        if first is not None:
            raise first

    def environment_info(self) -> list[str]:
        """Lines from every plugin's ``ppe_environment_info`` hook."""
        lines: list[str] = []
        for result in reversed(self.pm.hook.ppe_environment_info()):
            lines.extend(result or [])
        return lines


def _import(module: str) -> object:
    return importlib.import_module(module)


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
