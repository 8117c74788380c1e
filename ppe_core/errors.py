"""The exception and warning classes ppe-core raises, under one base class each."""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ConfigurationError",
    "DuplicateRegistrationError",
    "PPEError",
    "PPEWarning",
    "PluginLoadError",
    "PluginLoadWarning",
    "RegistryLookupError",
    "RuntimeNotFoundError",
]


class PPEError(Exception):
    """Base class of every error ppe-core raises on purpose."""


class PPEWarning(UserWarning):
    """Base class of every warning ppe-core emits."""


class ConfigurationError(PPEError, ValueError):
    """The user passed an argument or option the framework cannot use.

    Subclasses ``ValueError`` so code written against PyTorch-style APIs keeps catching it.
    """


class ArgumentTypeError(ConfigurationError, TypeError):
    """An argument has a type the framework cannot use.

    Subclasses both ``ValueError`` (through :class:`ConfigurationError`) and ``TypeError`` (what
    Python raises for a wrong type), so code catching either keeps working.
    """


class DuplicateRegistrationError(PPEError, ValueError):
    """A name was registered twice without ``replace=True``."""


class RegistryLookupError(PPEError, KeyError):
    """A name was looked up in a registry that does not hold it."""

    def __str__(self) -> str:
        # KeyError quotes its argument; a multi-line message reads better unquoted.
        return str(self.args[0]) if self.args else ""


class RuntimeNotFoundError(RegistryLookupError):
    """No runtime is registered for the requested device type."""


class PluginLoadError(PPEError, RuntimeError):
    """A plugin failed to import or register (raised only in strict mode)."""


class PluginLoadWarning(PPEWarning):
    """A plugin failed to import or register and was skipped."""


class TeardownHookWarning(PPEWarning):
    """A teardown hook raised while a run was already failing; the run's error is kept."""
