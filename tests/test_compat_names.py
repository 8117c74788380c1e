"""Every public name of PPE's training namespaces exists in ppe-core, or migration.md says why.

For each namespace, the PPE names counted are the public names of ``pytorch_pfn_extras.<ns>``
that PPE itself defines: classes, functions and aliases defined in the module, names imported
from another ``pytorch_pfn_extras`` module (re-exports) and PPE submodules. Imports of the
standard library, typing or torch are not counted. A counted name missing from
``ppe_core.<ns>`` must have a row ``| `ns.Name` | reason |`` in docs/migration.md's "Names not
provided" table (a leading dot for the top level); a row for a name ppe-core does provide is
stale and fails too.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PPE = "pytorch_pfn_extras"
MIGRATION = Path(__file__).resolve().parents[1] / "docs" / "migration.md"

# Namespaces compared name by name ("" is the top level).
NAMESPACES = [
    "",
    "training",
    "training.extensions",
    "training.triggers",
    "training.trigger",
    "training.extension",
    "training.manager",
    "training.metrics",
    "reporting",
    "runtime",
    "handler",
    "writing",
    "profiler",
    "logging",
    "distributed",
    "nn",
    "nn.parallel",
    "config",
    "dataloaders",
    "dataloaders.utils",
]
# Packages whose public submodules are compared too, counting only what each submodule defines.
SUBMODULE_PARENTS = ["training.extensions", "training.triggers"]

_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


def _qualified(ns: str, name: str) -> str:
    return f"{ns}.{name}" if ns else f".{name}"


def _import(package: str, ns: str) -> types.ModuleType:
    return importlib.import_module(f"{package}.{ns}" if ns else package)


def _source_bindings(module: types.ModuleType) -> dict[str, str | None]:
    """Module-level names bound in ``module``'s source: name -> source module of an import
    (``from x import name``), or None for names the module defines (def, class, assignment)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return {}
    bindings: dict[str, str | None] = {}
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bindings[node.name] = None
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bindings[target.id] = None
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bindings[node.target.id] = None
            elif isinstance(node, ast.ImportFrom):
                origin = node.module or ""
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    origin = f"{base}.{origin}" if origin else base
                for alias in node.names:
                    bindings[alias.asname or alias.name] = origin
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for part in getattr(node, block, []):
                        visit(part.body if isinstance(part, ast.ExceptHandler) else [part])

    visit(ast.parse(source).body)
    return bindings


@cache
def _loaded_by_import() -> frozenset[str]:
    """PPE modules loaded by importing PPE's namespaces in a fresh interpreter: the submodules
    a user finds as attributes, whatever this test session imported since."""
    code = (
        "import importlib, json, sys\n"
        f"for ns in {NAMESPACES!r}:\n"
        f"    importlib.import_module({PPE!r} + ('.' + ns if ns else ''))\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({PPE!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return frozenset(json.loads(out.stdout))


@cache
def ppe_names(ns: str, own_only: bool = False) -> frozenset[str]:
    """Public names PPE defines in ``pytorch_pfn_extras.<ns>``.

    With ``own_only`` (submodules of a package), names re-exported from other PPE modules
    count only when their object is defined in this module or below it.
    """
    module = _import(PPE, ns)
    bindings = _source_bindings(module)
    imported_from = {origin for origin in bindings.values() if origin}
    names = set()
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        origin = bindings.get(name, "")
        defined_in = getattr(obj, "__module__", None) or ""
        if isinstance(obj, types.ModuleType):
            # Submodules the module itself imports count (not ones some other import happened
            # to load, which would make the result depend on test order); other modules it
            # imports for itself (``import pytorch_pfn_extras``, ``... as extension_module``)
            # do not.
            child = f"{module.__name__}.{name}"
            counted = obj.__name__ == child and (
                name in bindings
                or any(o == child or o.startswith(f"{child}.") for o in imported_from)
                or child in _loaded_by_import()
            )
        elif origin is None:
            counted = True
        elif own_only:
            counted = defined_in.startswith(module.__name__)
        elif origin:
            counted = origin.startswith(PPE)
        else:  # bound some other way (e.g. star import)
            counted = defined_in.startswith(PPE)
        if counted:
            names.add(name)
    return frozenset(names)


def _submodule_namespaces() -> Iterator[str]:
    for parent in SUBMODULE_PARENTS:
        for info in pkgutil.iter_modules(_import(PPE, parent).__path__):
            if not info.name.startswith("_"):
                yield f"{parent}.{info.name}"


SUBMODULES = sorted(_submodule_namespaces())


def not_provided_rows(text: str) -> dict[str, str]:
    """The "Names not provided" rows of migration.md: qualified name -> reason."""
    rows: dict[str, str] = {}
    section = text.split("## Names not provided", 1)[-1].split("\n## ", 1)[0]
    for line in section.splitlines():
        match = _ROW.match(line.strip())
        if match:
            rows[match.group(1).strip()] = match.group(2).strip()
    return rows


@cache
def _rows() -> dict[str, str]:
    return not_provided_rows(MIGRATION.read_text(encoding="utf-8"))


def missing_names(ns: str, own_only: bool) -> list[str]:
    """PPE names of ``ns`` that ppe-core neither provides nor lists as not provided."""
    try:
        ours: types.ModuleType | None = _import("ppe_core", ns)
    except ModuleNotFoundError:
        ours = None
    if ours is None and own_only:
        return []  # the whole submodule is missing: its parent's row covers it
    rows = _rows()
    try:
        names = ppe_names(ns, own_only)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("pytorch_pfn_extras"):
            raise
        # PPE's module needs an optional package that is not installed (the notebook modules
        # import IPython), so its names cannot be listed: ppe-core's module must still exist.
        return [] if ours is not None else [ns]
    return sorted(
        _qualified(ns, name)
        for name in names
        if not _provides(ours, name) and _qualified(ns, name) not in rows
    )


def _is_submodule(package: types.ModuleType, name: str) -> bool:
    path = getattr(package, "__path__", None)
    return path is not None and any(info.name == name for info in pkgutil.iter_modules(path))


def _provides(module: types.ModuleType | None, name: str) -> bool:
    if module is None:
        return False
    try:
        return hasattr(module, name)
    except ImportError:  # a lazily exported name whose module is not there (yet)
        return False


@pytest.mark.parametrize("ns", NAMESPACES, ids=lambda ns: ns or "toplevel")
def test_every_ppe_name_is_provided_or_listed(ns: str) -> None:
    missing = missing_names(ns, own_only=False)
    assert not missing, (
        f"PPE names missing from ppe_core.{ns or ''} and not in docs/migration.md's 'Names not "
        f"provided' table: {missing}"
    )


@pytest.mark.parametrize("ns", SUBMODULES)
def test_every_ppe_submodule_name_is_provided_or_listed(ns: str) -> None:
    missing = missing_names(ns, own_only=True)
    assert not missing, (
        f"PPE names missing from ppe_core.{ns} and not in docs/migration.md's 'Names not "
        f"provided' table: {missing}"
    )


def test_not_provided_rows_have_reasons_and_are_not_stale() -> None:
    problems = []
    for qualified, reason in _rows().items():
        ns, _, name = qualified.rpartition(".")
        if not reason:
            problems.append(f"{qualified}: empty reason")
        try:
            ppe_module = _import(PPE, ns)
        except ModuleNotFoundError:
            problems.append(f"{qualified}: no such PPE namespace")
            continue
        if not hasattr(ppe_module, name) and not _is_submodule(ppe_module, name):
            problems.append(f"{qualified}: PPE has no such name (typo?)")
        try:
            ours = _import("ppe_core", ns)
        except ModuleNotFoundError:
            continue
        if _provides(ours, name):
            problems.append(f"{qualified}: ppe_core provides it now; remove the row")
    assert not problems, problems


def test_the_checks_count_ppe_definitions_and_skip_foreign_imports() -> None:
    # Re-exports, submodules and PPE-defined typing aliases count ...
    assert {"ExtensionsManager", "extensions", "triggers"} <= ppe_names("training")
    assert "IntervalTrigger" in ppe_names("training.trigger")
    assert "TriggerLike" in ppe_names("training.trigger")
    assert {"logging", "training", "to"} <= ppe_names("")
    # ... imports of other libraries do not.
    assert not {"torch", "Any", "Optional", "os", "pytorch_pfn_extras"} & ppe_names(
        "training.manager"
    )
    # Submodules count what they define, not what they import from elsewhere in PPE.
    log_report = ppe_names("training.extensions.log_report", own_only=True)
    assert "LogReport" in log_report
    assert "Extension" not in log_report


def test_the_row_parser_reads_names_and_reasons() -> None:
    text = (
        "## Names not provided\n\n| Name | Why |\n|---|---|\n"
        "| `.cuda` | outside training; use pytorch_pfn_extras |\n"
        "| `training.extensions.Slack` |  |\n<!-- names:x -->\n\n## Other\n| `a.b` | c |\n"
    )
    assert not_provided_rows(text) == {
        ".cuda": "outside training; use pytorch_pfn_extras",
        "training.extensions.Slack": "",
    }
