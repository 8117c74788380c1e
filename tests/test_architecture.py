"""The shape of the package: no import circle, errors at the bottom, the runtime contract below
the plugin layer, device plugins on public names only.

Imports are read from the source (``ast``), so the checks cover modules no test imports. The
import graph counts every import a module can run: module-level ones, those inside functions
(an import that runs later is still a dependency), and modules named by a string that is
imported lazily (``importlib.import_module("ppe_core.x")``, the ``"module"`` / ``"module:attr"``
values of lazy-export tables and plugin tables, a package ``__init__``'s table of its own
submodule names). Imports under ``if TYPE_CHECKING:`` are left out: they never run, and a
type-only reference is how a lower layer names a higher layer's type. Importing ``a.b.c`` also
runs the ``__init__`` of ``a.b``: that package is an edge too, unless it encloses the importing
module (then it is already running or done). The top-level ``ppe_core/__init__`` is aside: it
is the face that composes the layers (it binds the plugin host into the layers below it) and
nothing inside the package imports it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

import ppe_core
from ppe_core import _compat

ROOT = Path(ppe_core.__file__).resolve().parent


@cache
def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The ppe_core modules an import statement names."""
    modules = _modules()
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if modules[module].name != "__init__.py":
            package.pop()
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    found = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            found.add(f"{base}.{alias.name}")  # a submodule
        elif base in modules:
            found.add(base)
    return found


def _imports(module: str, *, at_import_time: bool) -> set[str]:
    """What ``module`` imports: at import time only, or anywhere (functions, TYPE_CHECKING)."""
    tree = ast.parse(_modules()[module].read_text())
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_targets(module, node))
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    if at_import_time:
        visit(tree.body)
    else:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_targets(module, node))
    found.discard(module)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


_NAMEISH = re.compile(r"^[A-Za-z_][\w.]*(:[\w.]+)?$")


def _string_target(module: str, value: str) -> str | None:
    """The ppe_core module a string names (``"ppe_core.x"``, ``"ppe_core.x:attr"``, or in a
    package ``__init__`` the name of one of its submodules), if any."""
    if not _NAMEISH.match(value):
        return None
    name = value.partition(":")[0]
    modules = _modules()
    if name.startswith("ppe_core.") and name in modules:
        return name
    if modules[module].name == "__init__.py" and f"{module}.{value}" in modules:
        return f"{module}.{value}"
    return None


@cache
def _edges(module: str) -> frozenset[str]:
    """The ppe_core modules ``module`` imports anywhere but under ``if TYPE_CHECKING:``, by
    statement or by a string naming the module."""
    tree = ast.parse(_modules()[module].read_text())
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }

    def string(node: ast.AST) -> str | None:
        # A literal, a module-level string constant, or their concatenation (``_EXT + "x:y"``).
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = string(node.left), string(node.right)
            return None if left is None or right is None else left + right
        return None

    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.JoinedStr):
            return  # an f-string's pieces are messages, not module names
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_targets(module, node))
        elif (
            isinstance(node, (ast.Constant, ast.BinOp))
            and (value := string(node))
            and (target := _string_target(module, value))
        ):
            found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return frozenset(found)


def _graph() -> dict[str, set[str]]:
    """Module -> the modules importing it runs first: its edges and their parent packages."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module in modules:
        if module == "ppe_core":
            continue  # the face, aside (see the module docstring)
        edges: set[str] = set()
        for target in _edges(module):
            edges.add(target)
            parts = target.split(".")
            for i in range(2, len(parts)):  # from 2: the top-level face is aside
                package = ".".join(parts[:i])
                if package in modules and not module.startswith(package + "."):
                    edges.add(package)  # its __init__ runs first
        edges.discard(module)
        edges.discard("ppe_core")
        graph[module] = edges
    return graph


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One circle through the first module of ``component``, to print."""
    members, start = set(component), component[0]
    parents: dict[str, str] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for succ in sorted(graph[node] & members):
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if succ not in parents:
                parents[succ] = node
                queue.append(succ)
    return component  # pragma: no cover - a component always has a circle


def test_the_graph_reader_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # The reader itself: statements at module level and in functions ...
    assert "ppe_core._plugins" in _imports("ppe_core.plugins", at_import_time=True)
    assert "ppe_core._plugins" in _edges("ppe_core.engine._factories")
    assert "ppe_core._plugins" not in _imports("ppe_core.engine._factories", at_import_time=True)
    assert "ppe_core._plugins" in _function_imports("ppe_core.engine._factories")
    # ... strings: a lazy-export table, a concatenated plugin table, a package's submodule names
    assert "ppe_core.training._trainer" in _edges("ppe_core.training")
    assert "ppe_core.handler" in _edges("ppe_core._builtin.logics")
    assert "ppe_core.training.extensions.log_report" in _edges("ppe_core.training.extensions")
    # ... not TYPE_CHECKING blocks, nor f-string pieces
    assert "ppe_core._plugins" not in _edges("ppe_core.hookspecs")
    assert "ppe_core.distributed" not in _edges("ppe_core.distributed._env")
    # ... and the packages an import runs: the builtin plugin table runs ppe_core.handler.
    assert "ppe_core.handler" in _graph()["ppe_core._builtin.logics"]


def test_no_import_circles() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    described = [
        f"{len(c)} modules, e.g. " + " -> ".join(_a_cycle(graph, c)) + f"\n    all: {c}"
        for c in cycles
    ]
    assert not cycles, f"{len(cycles)} import circle(s):\n" + "\n".join(described)


def test_errors_imports_no_ppe_core_module() -> None:
    # The bottom layer: every module may import its classes at import time. Counted strictly:
    # TYPE_CHECKING blocks and string names too.
    assert _imports("ppe_core.errors", at_import_time=False) == set()
    assert _edges("ppe_core.errors") == frozenset()
    source = _modules()["ppe_core.errors"].read_text()
    assert "import_module" not in source and "__getattr__" not in source


# The runtime contract is the bottom layer: what a runtime is, and resolving one with a
# registry passed in. Anywhere in its modules (functions and TYPE_CHECKING blocks included) it
# imports only itself, the errors and the generic registry; the plugin host hands it the active
# registry (``set_registry_source``), so it never reaches up for it.
_RUNTIME_MAY_IMPORT = ("ppe_core.runtime", "ppe_core.errors", "ppe_core._registry")
# ``ppe.runtime._map`` only keeps PPE's path of ``ppe.map`` (which builds a code block with the
# handler): a compatibility shim (ppe_core/_compat.py), exempt because it defines nothing.
_PPE_PATH_SHIMS = {m for m in _compat.SHIMS if m.startswith("ppe_core.runtime.")}


def _runtime_modules() -> list[str]:
    return [m for m in _modules() if m == "ppe_core.runtime" or m.startswith("ppe_core.runtime.")]


def _function_imports(module: str) -> list[str]:
    """The ppe_core modules ``module`` imports inside functions, by statement or by name
    (``importlib.import_module("ppe_core....")``), one entry per import."""
    found: list[str] = []
    for func in ast.walk(ast.parse(_modules()[module].read_text())):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(func):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.extend(sorted(_targets(module, node)))
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.split(":")[0] in _modules()
            ):
                found.append(node.value.split(":")[0])  # a module named by a string
    return found


def test_runtime_contract_imports_no_higher_layer() -> None:
    offending = {}
    for module in _runtime_modules():
        if module in _PPE_PATH_SHIMS:
            continue
        above = {
            target
            for target in _imports(module, at_import_time=False)
            if not any(target == p or target.startswith(p + ".") for p in _RUNTIME_MAY_IMPORT)
        }
        if above:
            offending[module] = sorted(above)
    assert not offending, f"the runtime contract imports layers above it: {offending}"


def test_runtime_package_imports_nothing_inside_functions() -> None:
    # Lazy imports inside functions are how a layer hides a reach upwards (and an import
    # circle): the runtime package has none outside itself, counted statement by statement.
    counted = {
        module: [t for t in _function_imports(module) if not t.startswith("ppe_core.runtime")]
        for module in _runtime_modules()
    }
    assert sum(map(len, counted.values())) == 0, {m: t for m, t in counted.items() if t}


def _compat_layer() -> set[str]:
    return {"ppe_core._compat", *_compat.SHIMS, *_compat.FACES, *_compat.ADAPTERS}


def _shim_problems(module: str, sources: tuple[str, ...]) -> list[str]:
    """How the shim ``module`` departs from its row: it may import its row's modules (and the
    not-provided helper), list exactly the names it imports in ``__all__``, and define nothing."""
    problems: list[str] = []
    imported: set[str] = set()
    exported: list[str] | None = None
    tree = ast.parse(_modules()[module].read_text())
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and node.module in ("__future__", "typing"):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "ppe_core._not_provided":
            continue
        if isinstance(node, ast.ImportFrom) and node.module in sources:
            imported.update(alias.asname or alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["__all__"]
            and isinstance(node.value, ast.List)
        ):
            exported = [ast.literal_eval(e) for e in node.value.elts]
        elif isinstance(node, ast.If) and ast.unparse(node).startswith(
            "if not TYPE_CHECKING:\n    __getattr__ = module_getattr(__name__)"
        ):
            continue  # PPE names left out here say what to use instead
        else:
            problems.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    if exported is None or set(exported) != imported:
        problems.append(f"__all__ {exported} is not what it imports {sorted(imported)}")
    return problems


def test_the_shim_check_sees_a_definition() -> None:
    assert (
        _shim_problems(
            "ppe_core.training.triggers.interval_trigger",
            _compat.SHIMS["ppe_core.training.triggers.interval_trigger"],
        )
        == []
    )
    problems = _shim_problems("ppe_core.training._manager", ("ppe_core.errors",))
    assert any("class ExtensionsManager" in p for p in problems)


@pytest.mark.parametrize("module", sorted(_compat.SHIMS))
def test_ppe_path_shims_only_re_export_what_the_table_says(module: str) -> None:
    assert module in _modules(), f"{module} is in ppe_core/_compat.py but has no file"
    assert not _shim_problems(module, _compat.SHIMS[module])
    importlib.import_module(module)  # and it imports


def _face_problems(module: str) -> list[str]:
    """How the face ``module`` departs from its shape: ``__all__``, the provider's imports under
    ``if TYPE_CHECKING:`` naming exactly ``__all__``, and in its ``else:`` only the import of
    ``ppe_core._faces`` and the call that forwards (``forward`` or ``replace_with_provider``)."""
    problems: list[str] = []
    exported: list[str] | None = None
    typed: set[str] = set()
    tree = ast.parse(_modules()[module].read_text())
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom) and node.module in ("__future__", "typing"):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            exported = [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom):
                    typed.update(alias.asname or alias.name for alias in sub.names)
                else:
                    problems.append(f"line {sub.lineno}: {ast.unparse(sub).splitlines()[0]}")
            for sub in node.orelse:
                text = ast.unparse(sub)
                if not (
                    text.startswith("from ppe_core._faces import")
                    or "forward(__name__" in text
                    or text.startswith("replace_with_provider(__name__")
                ):
                    problems.append(f"line {sub.lineno}: {text.splitlines()[0]}")
        else:
            problems.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    if exported is None or set(exported) != typed:
        problems.append(f"__all__ {exported} is not what type checkers see {sorted(typed)}")
    return problems


def test_the_face_check_sees_a_definition() -> None:
    assert _face_problems("ppe_core.training.extensions.log_report") == []
    problems = _face_problems("ppe_core.training.extensions.snapshot_writers")
    assert any("def __getattr__" in p for p in problems)


@pytest.mark.parametrize("module", sorted(_compat.FACES))
def test_faces_only_forward_to_their_provider(module: str) -> None:
    assert module in _modules(), f"{module} is in ppe_core/_compat.py but has no file"
    assert not _face_problems(module)
    face = importlib.import_module(module)
    # With the provider installed, every name resolves, to the object its provider defines.
    for name in face.__all__:
        assert getattr(face, name) is not None, name


def test_every_module_that_only_re_exports_is_in_the_compat_table() -> None:
    # A new PPE path is added to the table, so the layer stays visible in one place. Package
    # ``__init__`` files are public namespaces (faces), not shims.
    unlisted = [
        module
        for module, path in _modules().items()
        if path.name != "__init__.py"
        and module not in _compat.SHIMS
        and module not in ("ppe_core.profiler", "ppe_core.reporting")  # public faces
        and any(_shim_problems(module, (m,)) == [] for m in _edges(module))
    ]
    assert unlisted == [], f"add these PPE-path shims to ppe_core/_compat.py: {unlisted}"


def test_the_compat_layer_is_an_edge() -> None:
    # It imports the core, never the reverse: only a package's ``__init__`` (its public
    # namespace at PPE's path) names a compat module, lazily; no implementation module does.
    layer = _compat_layer()
    assert layer <= set(_modules())
    reverse = {
        module: sorted(_edges(module) & layer)
        for module, path in _modules().items()
        if module not in layer and path.name != "__init__.py" and _edges(module) & layer
    }
    assert not reverse, f"core modules import the compatibility layer: {reverse}"
    assert not any("ppe_core._compat" in _edges(m) for m in _modules()), "run-time import"


def test_ppe_paths_of_to_are_one_function() -> None:
    import ppe_core._resolve
    import ppe_core.plugins
    import ppe_core.runtime._to

    assert ppe_core.to is ppe_core.runtime.to is ppe_core.runtime._to.to is ppe_core._resolve.to
    assert "to" in dir(ppe_core.runtime) and "runtime_registry" in dir(ppe_core.runtime)
    assert ppe_core.runtime.runtime_registry is ppe_core.plugins.get_plugin_host().runtimes


_EXTENSIONS = ROOT.parent / "plugins" / "ppe_extensions"

# Plugins are written against the public contract only ---------------------------------------
#: Every package under plugins/ (found, not listed: a new plugin is checked from its first
#: commit) and the example plugin.
_PLUGIN_SOURCES = (
    *sorted(
        folder / folder.name
        for folder in (ROOT.parent / "plugins").iterdir()
        if (folder / folder.name / "__init__.py").is_file()
    ),
    ROOT.parent / "examples" / "ppe_example_device" / "ppe_example_device",
)
_PLUGIN_PACKAGES = frozenset(source.name for source in _PLUGIN_SOURCES)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _core_private_attributes(cls: type) -> set[str]:
    """Underscore attributes the ppe_core classes in ``cls``'s MRO define or assign."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.partition(".")[0] != "ppe_core":
            continue
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(base)))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if _private(n)}


def _private_core_uses(path: Path, package: str) -> list[str]:
    """``ppe_core`` names with an underscore segment that ``path`` imports or reads: module
    paths, imported names, attributes of imported core objects, and attributes of the core base
    classes its classes inherit."""
    tree = ast.parse(path.read_text())
    parts = list(path.with_suffix("").parts)
    parts = parts[len(parts) - 1 - parts[::-1].index(package) :]  # from the package folder
    if parts[-1] == "__init__":
        parts.pop()
    module = importlib.import_module(".".join(parts))
    found: list[str] = []
    core_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ppe_core"):
            for alias in node.names:
                core_names.add(alias.asname or alias.name)
                dotted = f"{node.module}.{alias.name}"
                if any(_private(part) for part in dotted.split(".")):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ppe_core"):
                    core_names.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value  # ``ppe_core.testing._x``: the chain's root is a core name
            while isinstance(root, ast.Attribute) and not _private(root.attr):
                root = root.value
            if isinstance(root, ast.Name) and root.id in core_names:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.ClassDef) and isinstance(getattr(module, node.name, None), type):
            inherited = _core_private_attributes(getattr(module, node.name))
            found.extend(
                f"line {sub.lineno}: {ast.unparse(sub)} (of a ppe_core base class)"
                for sub in ast.walk(node)
                if isinstance(sub, ast.Attribute) and sub.attr in inherited
            )
    return found


def test_the_private_name_check_sees_a_reach_in() -> None:
    import ppe_cpu._runtime

    source = Path(ppe_cpu._runtime.__file__)
    assert _private_core_uses(source, "ppe_cpu") == []
    assert "_plain_move" in _core_private_attributes(ppe_cpu._runtime.CPURuntime)
    assert "_private" not in _core_private_attributes(ppe_cpu._runtime.CPURuntime)


def test_the_private_name_check_sees_every_form_of_reach_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "ppe_h15_reach" / "sub"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(
        "import ppe_core.testing\n"
        "def f():\n"
        "    from ppe_core._plugins import PluginHost\n"
        "    from ppe_core.training._manager import ExtensionsManager\n"
        "    from ppe_core.testing import _compare_states\n"
        "    import ppe_core._registry\n"
        "    return ppe_core.testing._compare_states, ppe_core.testing.plugin_host\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    uses = _private_core_uses(package / "mod.py", "ppe_h15_reach")
    assert uses == [
        "line 3: from ppe_core._plugins import PluginHost",
        "line 4: from ppe_core.training._manager import ExtensionsManager",
        "line 5: from ppe_core.testing import _compare_states",
        "line 6: import ppe_core._registry",
        "line 7: ppe_core.testing._compare_states",
    ]
    assert "ppe_testing" in _PLUGIN_PACKAGES  # found under plugins/ without being listed


@pytest.mark.parametrize("source", _PLUGIN_SOURCES, ids=lambda p: p.name)
def test_device_plugins_use_public_core_names_only(source: Path) -> None:
    importlib.import_module(source.name)
    offending = {
        str(path.relative_to(source)): uses
        for path in sorted(source.rglob("*.py"))
        if (uses := _private_core_uses(path, source.name))
    }
    assert not offending, f"{source.name} uses private ppe_core names: {offending}"


def _plugin_imports(source: str) -> list[str]:
    """The plugin packages a module's ``source`` imports (statements outside ``if
    TYPE_CHECKING:``, ``importlib.import_module("...")``, ``"package.module:attr"`` targets)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _NAMEISH.match(node.value) and ":" in node.value:
                names = [node.value.partition(":")[0]]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names = [str(node.args[0].value)]
        found.extend(
            f"line {getattr(node, 'lineno', '?')}: {name}"
            for name in names
            if name.partition(".")[0] in _PLUGIN_PACKAGES
        )
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def test_the_plugin_import_check_sees_an_import() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import importlib, ppe_core.runtime\n"
        "if TYPE_CHECKING:  # for type checkers only\n"
        "    from ppe_testing import RuntimeTarget\n"
        "def f():\n"
        "    from ppe_testing._conformance import run_checks\n"
        "    import ppe_cpu.plugin\n"
        "    importlib.import_module('ppe_mlflow._logger')\n"
        "    return 'ppe_wandb._logger:WandbLogger', 'install ppe_cpu', 'ppe_core.x:y'\n"
    )
    assert _plugin_imports(source) == [
        "line 6: ppe_testing._conformance",
        "line 7: ppe_cpu.plugin",
        "line 8: ppe_mlflow._logger",
        "line 9: ppe_wandb._logger",
    ]


def test_ppe_core_imports_no_plugin_package() -> None:
    offending = {
        module: uses
        for module, path in sorted(_modules().items())
        if (uses := _plugin_imports(path.read_text()))
    }
    assert not offending, f"ppe_core modules import plugin packages: {offending}"


def _foreign_private_reads(path: Path) -> list[str]:
    """``obj._name`` where ``obj`` is neither ``self``/``cls`` nor a module the file imports
    (``os._exit`` is the module's API; dunders aside): another object's fields."""
    tree = ast.parse(path.read_text())
    own = {"self", "cls"} | {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _private(node.attr)
        and not (isinstance(node.value, ast.Name) and node.value.id in own)
    ]


def test_the_foreign_field_check_sees_a_reach_in(tmp_path: Path) -> None:
    source = tmp_path / "reach.py"
    source.write_text(
        "import os\ndef f(tracker):\n    return tracker._counts, self._mine, os._exit, sys._x\n"
    )
    assert _foreign_private_reads(source) == ["line 3: tracker._counts", "line 3: sys._x"]


def test_the_sender_process_drives_a_tracker_through_its_public_methods() -> None:
    """The parent's sender and the child's loop use BaseTracker's worker controls, report
    and run id, and the callbacks the tracker hands them: never its fields."""
    import ppe_extensions.tracking._child
    import ppe_extensions.tracking._sender

    offending = {
        Path(module.__file__).name: uses
        for module in (ppe_extensions.tracking._sender, ppe_extensions.tracking._child)
        if module.__file__ and (uses := _foreign_private_reads(Path(module.__file__)))
    }
    assert not offending, f"the sender reaches into a tracker's fields: {offending}"


@pytest.mark.slow  # a fresh interpreter imports torch
def test_import_ppe_core_loads_neither_the_plugin_host_nor_the_engine() -> None:
    # ``ppe_core.to`` is re-exported eagerly; resolving needs the host only when called.
    code = (
        "import sys, ppe_core\n"
        "print(' '.join(sorted(m for m in ('ppe_core._plugins', 'ppe_core.handler', "
        "'ppe_core.engine', 'ppe_core.training', 'ppe_core.errors') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ppe_core.errors"]


@pytest.mark.slow  # mypy reads torch's stubs once (about a minute)
def test_mypy_sees_the_classes_behind_ppe_paths(tmp_path: Path) -> None:
    # Why the shims stay files: a type checker resolves a PPE path to the core's class (not to
    # Any), so user scripts keep their types. Each line below is a type error only then.
    pytest.importorskip("mypy")
    script = tmp_path / "user.py"
    script.write_text(
        "from ppe_core.training.extensions.log_report import LogReport\n"
        "from ppe_core.training.manager import IgniteExtensionsManager\n"
        "from ppe_core.training.triggers.interval_trigger import IntervalTrigger\n"
        "a: int = LogReport()\n"
        "b: int = IntervalTrigger(1, 'epoch')\n"
        "c: type[int] = IgniteExtensionsManager\n"
    )
    out = subprocess.run(
        # follow-imports=silent: the user's script is checked, not ppe-core's own imports
        # (whose missing stubs the project's mypy settings silence).
        [
            sys.executable,
            "-m",
            "mypy",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # An editable install hides the package from mypy; a wheel in site-packages does not.
        env={**os.environ, "MYPYPATH": os.pathsep.join([str(ROOT.parent), str(_EXTENSIONS)])},
    )
    for line, found in ((4, "LogReport"), (5, "IntervalTrigger"), (6, "IgniteExtensionsManager")):
        assert (
            f'user.py:{line}: error: Incompatible types in assignment (expression has type "'
            in out.stdout
            and found in out.stdout
        ), out.stdout + out.stderr
    assert "Found 3 errors in 1 file" in out.stdout, out.stdout + out.stderr
