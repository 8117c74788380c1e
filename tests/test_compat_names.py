"""Every public name of every PPE 0.9 module exists in ppe-core, or migration.md says why.

Every top-level module of PPE is swept (``cuda``, ``dataset``, ``ops``, ``onnx``, ``utils``, ...),
with the subpackages and modules below them that scripts import. For each namespace, the PPE
names counted are the public names of ``pytorch_pfn_extras.<ns>``
that PPE itself defines: classes, functions and aliases defined in the module, names imported
from another ``pytorch_pfn_extras`` module (re-exports) and PPE submodules. Imports of the
standard library, typing or torch are not counted. A counted name missing from
``ppe_core.<ns>`` must have a row ``| `ns.Name` | reason |`` in docs/migration.md's "Names not
provided" table (a leading dot for the top level); a row for a name ppe-core does provide is
stale and fails too. Names PPE binds only when an optional package imports (``ppe.onnx.export``
needs ``onnx``) count whether or not that package is installed.

The table is ``ppe_core._not_provided.NOT_PROVIDED`` written out: the same table makes each of
those names raise an error naming the PPE module and what to use instead, which is tested here
in the attribute and import forms.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import ppe_core
from ppe_core._not_provided import NOT_PROVIDED
from ppe_core.errors import NotProvidedError, NotProvidedModuleError, PPEError

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
    "nn.parallel.distributed",
    "config",
    "config_types",
    "dataloaders",
    "dataloaders.utils",
    "engine",
    "testing",
    # Modules ppe-core does not provide: every name they hold needs a row.
    "cuda",
    "dataset",
    "dataset.shared_dataset",
    "dataset.tabular",
    "nn.modules",
    "onnx",
    "ops",
    "ops.register",
    "torchscript",
    "utils",
    "utils.checkpoint",
    "utils.comparer",
    # Private PPE paths that scripts import type aliases from.
    "training._trigger_util",
    "training._manager_protocol",
]
# Packages whose public submodules are compared too, counting only what each submodule defines.
SUBMODULE_PARENTS = [
    "training.extensions",
    "training.extensions.accumulate",
    "training.triggers",
    "nn.parallel",
]
# Type aliases PPE scripts import from private paths for annotations: same path in ppe-core.
PRIVATE_ALIASES = {
    "training._trigger_util": ["TriggerLike", "TriggerFunc", "UnitLiteral", "Trigger"],
    "training._manager_protocol": ["ExtensionsManagerProtocol", "StateObjectProtocol"],
    "runtime._runtime": ["DeviceLike"],
}

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
    # Names PPE imports from itself where an optional package is installed (``ppe.onnx`` binds
    # ``export`` only with ``onnx``) count here too, so the rows hold with and without it.
    names |= {name for name in _optional_imports(module) if not name.startswith("_")}
    return frozenset(names)


def _optional_imports(module: types.ModuleType) -> set[str]:
    """Names ``module`` imports from PPE inside a module-level ``try:`` (bound only where an
    optional package imports), whether or not that package is installed here."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Try):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and PPE in (statement.module or ""):
                    names |= {alias.asname or alias.name for alias in statement.names}
                elif isinstance(statement, ast.Import):
                    names |= {a.asname for a in statement.names if a.asname and PPE in a.name}
    return names


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
        if (
            not hasattr(ppe_module, name)
            and not _is_submodule(ppe_module, name)
            and name not in _optional_imports(ppe_module)  # bound where an optional package is
        ):
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


def _row_name(path: str) -> str:
    """The migration.md row name of a NOT_PROVIDED path (a leading dot for the top level)."""
    return path if "." in path else f".{path}"


def test_every_top_level_ppe_module_is_swept() -> None:
    ppe = importlib.import_module(PPE)
    top_level = {info.name for info in pkgutil.iter_modules(ppe.__path__)}
    swept = {ns.split(".", 1)[0] for ns in NAMESPACES}
    assert {"cuda", "dataset", "ops", "onnx", "utils", "torchscript"} <= top_level
    assert not {m for m in top_level if not m.startswith("_")} - swept


def test_migration_table_is_the_not_provided_table() -> None:
    """docs/migration.md's rows are exactly ppe_core._not_provided's, reasons included: the
    errors users meet and the page they are sent to say the same thing."""
    expected = {
        _row_name(path): f"{why}; {instead}" for path, (why, instead) in NOT_PROVIDED.items()
    }
    rows = _rows()
    assert sorted(set(expected) - set(rows)) == [], "rows missing from docs/migration.md"
    assert sorted(set(rows) - set(expected)) == [], "rows not in ppe_core/_not_provided.py"
    differing = {name: (rows[name], text) for name, text in expected.items() if rows[name] != text}
    assert not differing


def _first_missing(path: str) -> tuple[str, str]:
    """(parent, name) of the first component of ``ppe_core.<path>`` that is not there."""
    obj: object = ppe_core
    parts = path.split(".")
    for i, part in enumerate(parts):
        parent = ".".join(parts[:i])
        if not hasattr(obj, part):
            return parent, part
        obj = getattr(obj, part)
    raise AssertionError(f"ppe_core.{path} exists; remove it from NOT_PROVIDED")


def _assert_clear(exc: BaseException, missing: str) -> None:
    text = str(exc)
    assert isinstance(exc, PPEError)
    assert f"pytorch_pfn_extras.{missing} " in text, text  # names the PPE module
    assert "Instead: " in text and "install pytorch-pfn-extras beside ppe-core" in text
    assert "docs/migration.md" in text


@pytest.mark.parametrize("path", sorted(NOT_PROVIDED))
def test_each_name_not_provided_raises_the_clear_error_on_access(path: str) -> None:
    parent, name = _first_missing(path)
    missing = f"{parent}.{name}" if parent else name
    assert missing in NOT_PROVIDED, f"ppe_core.{missing} is missing but not in NOT_PROVIDED"
    module = _import("ppe_core", parent)
    with pytest.raises(NotProvidedError) as info:
        getattr(module, name)
    assert isinstance(info.value, AttributeError)  # hasattr() stays False
    assert info.value.name == name
    _assert_clear(info.value, missing)


@pytest.mark.parametrize("path", sorted(NOT_PROVIDED))
def test_each_name_not_provided_raises_the_clear_error_on_import(path: str) -> None:
    parent, name = _first_missing(path)
    missing = f"{parent}.{name}" if parent else name
    parent_module = _import("ppe_core", parent)
    if not hasattr(parent_module, "__path__"):
        # ``from <plain module> import name``: Python turns every AttributeError into its own
        # "cannot import name" ImportError; only the attribute form can say more.
        with pytest.raises(ImportError, match=f"cannot import name '{name}'"):
            exec(f"from {parent_module.__name__} import {name}", {})
        return
    for statement in (f"import ppe_core.{path}", f"from {parent_module.__name__} import {name}"):
        with pytest.raises(NotProvidedModuleError) as info:
            exec(statement, {})
        assert isinstance(info.value, ModuleNotFoundError)
        assert info.value.name == f"pytorch_pfn_extras.{missing}"
        _assert_clear(info.value, missing)


def test_unknown_names_keep_python_s_errors() -> None:
    with pytest.raises(AttributeError) as info:
        ppe_core.no_such_name  # noqa: B018
    assert not isinstance(info.value, NotProvidedError)
    with pytest.raises(ModuleNotFoundError) as missing:
        importlib.import_module("ppe_core.no_such_module")
    assert not isinstance(missing.value, NotProvidedModuleError)
    assert missing.value.name == "ppe_core.no_such_module"
    with pytest.raises(ModuleNotFoundError) as other:
        importlib.import_module("cuda_not_a_ppe_core_module")  # other packages: untouched
    assert not isinstance(other.value, NotProvidedModuleError)


def test_feature_detection_sees_names_not_provided_as_absent() -> None:
    assert not hasattr(ppe_core, "cuda")
    assert getattr(ppe_core, "get_xp", None) is None
    assert not hasattr(ppe_core.nn, "modules")
    assert not hasattr(ppe_core.training.manager, "record")
    with pytest.raises(NotProvidedModuleError):  # a spec would claim the module exists
        importlib.util.find_spec("ppe_core.cuda")
    try:  # the usual optional-import pattern
        importlib.import_module("ppe_core.utils")
    except ImportError:
        available = False
    else:
        available = True
    assert not available


def test_the_finder_is_installed_once_and_loads_nothing() -> None:
    code = (
        "import importlib, json, sys\n"
        "import ppe_core\n"
        "importlib.reload(ppe_core)\n"
        "before = set(sys.modules)\n"
        "try:\n"
        "    import ppe_core.cuda\n"
        "except ModuleNotFoundError:\n"
        "    pass\n"
        "finders = [type(f).__name__ for f in sys.meta_path]\n"
        "print(json.dumps({'new': sorted(set(sys.modules) - before), 'finders': finders}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["finders"].count("_NotProvidedFinder") == 1
    assert result["finders"][-1] == "_NotProvidedFinder"  # consulted only when all others fail
    assert result["new"] == []  # raising the error loads nothing
    # The module itself imports only the standard library and ppe_core.errors.
    source = Path(ppe_core.__file__).with_name("_not_provided.py").read_text(encoding="utf-8")
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.parse(source).body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert {m for m in imported if m and m.split(".")[0] not in sys.stdlib_module_names} == {
        "ppe_core.errors"
    }


@pytest.mark.parametrize("ns", sorted(PRIVATE_ALIASES))
def test_type_aliases_resolve_under_ppe_s_private_paths(ns: str) -> None:
    ours = _import("ppe_core", ns)
    theirs = _import(PPE, ns)
    for name in PRIVATE_ALIASES[ns]:
        assert hasattr(theirs, name), f"PPE has no {ns}.{name}"
        assert hasattr(ours, name), f"ppe_core.{ns}.{name} is missing"


def test_trigger_like_from_the_private_path_annotates_and_accepts_ppe_s_forms() -> None:
    from ppe_core.training import triggers
    from ppe_core.training._trigger_util import TriggerLike, get_trigger

    def every(trigger: TriggerLike) -> object:
        return get_trigger(trigger)

    assert isinstance(every((2, "epoch")), triggers.IntervalTrigger)
    assert isinstance(every(triggers.IntervalTrigger(1, "iteration")), triggers.IntervalTrigger)
    args = typing.get_args(TriggerLike)
    assert type(None) in args and tuple[float, str] in args
