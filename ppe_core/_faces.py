"""Faces: ppe_core module paths whose names an installed package provides.

PPE's import paths of the standard extensions (``ppe_core.training.extensions.log_report``,
``...accumulate.average_accumulate``, the background writers of ``ppe_core.writing``) stay
files in the core, so scripts keep importing them and type checkers see the classes (each face
imports its provider under ``if TYPE_CHECKING:``). At run time the classes come from the
package that registered the path through the ``ppe_register_modules`` hook (ppe-extensions
for the standard set), found through the plugin host like any plugin: the core imports no
plugin package by name. Without a provider, a face's names raise an
:class:`~ppe_core.errors.OptionalDependencyError` that names the package and the install
command.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from ppe_core._not_provided import module_getattr
from ppe_core._plugins import get_plugin_host
from ppe_core.errors import OptionalDependencyError

__all__ = ["forward", "missing_provider_error", "provider_modules", "replace_with_provider"]

#: The distribution of the standard extensions, and the line that installs it.
STANDARD = ("ppe-extensions", "pip install 'ppe-core[standard]'")


def missing_provider_error(path: str, name: str | None = None) -> OptionalDependencyError:
    """The error for a name of face ``path`` when no installed package provides the path."""
    what = f"{path}.{name}" if name else path
    package, install = STANDARD
    return OptionalDependencyError(
        f"{what} is provided by the {package} package, which is not installed, is disabled "
        f"(PPE_DISABLED_PLUGINS) or failed to load (`python -m ppe_core plugins` says which). "
        f"Install it with `{install}` (or `pip install {package}`)."
    )


def provider_modules(path: str, name: str | None = None) -> list[ModuleType]:
    """The modules registered for face ``path``, imported, in their registered order."""
    modules = get_plugin_host().modules
    if path not in modules:
        raise missing_provider_error(path, name)
    return [importlib.import_module(module) for module in modules.get(path)]


def forward(
    path: str,
    names: Sequence[str],
    *,
    aliases: Mapping[str, str] | None = None,
    not_provided: bool = False,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of face ``path``: each of ``names`` is read from the
    first provider module that has it (under its ``aliases`` name, if one is given) and cached
    in the face; with ``not_provided``, PPE's names left out here raise what
    docs/migration.md says instead of ``AttributeError``."""
    face = sys.modules[path]
    wanted = frozenset(names)
    sources = dict(aliases or {})
    missing = module_getattr(path) if not_provided else None

    def __getattr__(name: str) -> Any:
        if name in wanted:
            source = sources.get(name, name)
            for module in provider_modules(path, name):
                if hasattr(module, source):
                    value = getattr(module, source)
                    setattr(face, name, value)  # later reads skip this function
                    return value
        if missing is not None:
            return missing(name)
        raise AttributeError(f"module {path!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(face)) | wanted)

    return __getattr__, __dir__


def replace_with_provider(path: str, aliases: dict[str, str] | None = None) -> None:
    """Make face ``path`` its first provider module in ``sys.modules`` (PPE's tests patch
    helpers through some paths, which must reach the code that calls them), adding
    ``aliases`` (name here -> name in the provider) to the provider."""
    provider = provider_modules(path)[0]
    for name, source in (aliases or {}).items():
        setattr(provider, name, getattr(provider, source))
    if not hasattr(provider, "__getattr__"):
        setattr(provider, "__getattr__", module_getattr(path))  # noqa: B010 (a module hook)
    sys.modules[path] = provider
