"""The code-size counter (``python -m benchmarks.code_size``) counts what it says it counts.

It backs the size claims of docs/architecture.md: lines are counted exactly as documented,
every ppe_core file is either classified or listed as not counted (so a new module cannot go
uncounted), and the script runs end to end. Nothing here asserts what the counts are.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from ppe_core import _compat

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def code_size() -> Iterator[ModuleType]:
    """``benchmarks/code_size.py``, loaded from its file (benchmarks/ is not a package)."""
    path = ROOT / "benchmarks" / "code_size.py"
    spec = importlib.util.spec_from_file_location("code_size", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


# Line by line: D docstring, C comment, B blank, K code. The multi-line string assigned to
# ``y`` is not a docstring: its three lines are code. Line 25 holds a docstring between code
# tokens; the docstring on lines 28-29 follows code on its first line, after non-ASCII
# identifiers (ast's byte columns differ from tokenize's character columns there).
SOURCE = '''\
"""Module docstring,
on two lines."""

# A comment line.
import os  # a trailing comment


def f(x):
    """One-line docstring."""
    y = """a multi-line
string that is not
a docstring"""
    return (x,
            y)  # the call spans two lines


class C:
    """Class docstring.

    With a blank line inside."""

    attribute = 1
    """An attribute docstring."""

    def g(self): """Inline docstring."""; return "é"


größe = 1; """Über: a docstring after code,
over two lines."""
'''
# Code lines: 5, 8, 10, 11, 12, 13, 14, 17, 22, 25, 28.
# Logical lines (statements ending at a NEWLINE token): 5, 8, 10-12, 13-14, 17, 22, 25, 28.


def test_the_counter_counts_a_known_source_exactly(code_size: ModuleType) -> None:
    count = code_size.count_source(SOURCE)
    assert count == code_size.Count(lines=29, code=11, logical=8)


def test_the_counter_edge_cases(code_size: ModuleType) -> None:
    count = code_size.count_source
    assert count("") == code_size.Count(0, 0, 0)
    assert count("x = 1") == code_size.Count(1, 1, 1)  # no final newline
    assert count('"""Only a docstring."""\n\n# and a comment\n') == code_size.Count(3, 0, 0)
    # A string that is an argument, not a statement, is code; so is an f-string statement.
    assert count('print(\n    """two\nlines"""\n)\n') == code_size.Count(4, 4, 1)
    assert count('f"""{1}\nx"""\n') == code_size.Count(2, 2, 1)
    # Line continuations: both physical lines hold code, one statement.
    assert count("x = 1 + \\\n    2\n") == code_size.Count(2, 2, 1)


def test_count_file_reads_the_declared_encoding(code_size: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(b'# -*- coding: latin-1 -*-\nname = "\xe9t\xe9"\n')
    assert code_size.count_file(path) == code_size.Count(2, 1, 1)


def test_every_ppe_core_file_is_classified_or_not_counted(code_size: ModuleType) -> None:
    assert code_size.problems() == []
    for path in code_size.counted_files():
        cls, why = code_size.FILES[path]
        assert cls in code_size.CLASSES and why, path


def test_a_new_or_removed_file_is_an_error(code_size: ModuleType, tmp_path: Path) -> None:
    # A copy of the tree's shape: every classified and not-counted path exists, empty.
    for path in [*code_size.FILES, *code_size.NOT_COUNTED]:
        target = tmp_path / path
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            (target / "__init__.py").touch()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
    assert code_size.problems(tmp_path) == []
    (tmp_path / "ppe_core/training/_new_part.py").touch()
    (tmp_path / "ppe_core/_new_top_level.py").touch()
    (tmp_path / "ppe_core/handler/_logic.py").unlink()
    found = code_size.problems(tmp_path)
    assert len(found) == 3, found
    assert found[0].startswith("ppe_core/training/_new_part.py: counted but not classified")
    assert found[1].startswith("ppe_core/handler/_logic.py: classified in FILES but not")
    assert found[2].startswith("ppe_core/_new_top_level.py: neither counted nor in NOT_COUNTED")
    with pytest.raises(ValueError, match="do not match the tree"):
        code_size.report(tmp_path)


def test_compat_files_only_re_export(code_size: ModuleType) -> None:
    # The class means what it says: no class or function of its own (a module __getattr__
    # that says where a left-out PPE name went, or loads a lazy one, is allowed) ...
    for path, (cls, _) in code_size.FILES.items():
        if cls != code_size.COMPAT:
            continue
        tree = ast.parse((ROOT / path).read_text())
        defined = [
            node.name
            for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name != "__getattr__"
        ]
        assert defined == [], f"{path} defines {defined}: it is not a compat shim"
    # ... and every shim of the compat table that lies in the counted parts is counted as one.
    shims = {module.replace(".", "/") + ".py" for module in _compat.SHIMS} | {
        module.replace(".", "/") + "/__init__.py" for module in _compat.SHIMS
    }
    for path in set(code_size.counted_files()) & shims:
        assert code_size.FILES[path][0] == code_size.COMPAT, path


def test_the_script_runs_and_prints_the_totals() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.code_size"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for heading in ("same: ", "beyond-ppe: ", "compat: ", "By part", "Totals", "Not counted"):
        assert heading in out.stdout, heading
    totals = out.stdout.split("\nTotals\n")[1].split("\nNot counted")[0]
    for row in ("ppe_core same", "ppe_core beyond-ppe", "ppe_core compat", "ppe_core all"):
        assert f"| {row} " in totals, row
    if importlib.util.find_spec("pytorch_pfn_extras") is None:
        assert "pytorch_pfn_extras is not installed" in out.stdout
    else:
        assert "| PPE 0.9" in totals


# Definitions counted apart ------------------------------------------------------------------


def test_a_definition_spans_its_decorators_and_counts_like_the_file(code_size: ModuleType) -> None:
    assert code_size.symbol_span(SOURCE, "f") == (8, 14)
    assert code_size.symbol_span(SOURCE, "C") == (17, 25)
    assert code_size.symbol_span(SOURCE, "C.g") == (25, 25)
    assert code_size.symbol_span(SOURCE, "C.attribute") == (22, 22)
    assert code_size.symbol_span(SOURCE, "größe") == (28, 28)
    assert code_size.symbol_span(SOURCE, "C.missing") is None
    assert code_size.symbol_span(SOURCE, "f.inner") is None  # only classes hold members
    # f: code lines 8, 10-14; statements starting at 8, 10 and 13. C: 17, 22, 25 (the
    # docstrings are not code). The spans add up to the file's count of those lines.
    assert code_size.count_source(SOURCE, (8, 14)) == code_size.Count(7, 6, 3)
    assert code_size.count_source(SOURCE, (17, 25)) == code_size.Count(9, 3, 3)
    decorated = "import functools\n\n\n@functools.cache\n@staticmethod\ndef g():\n    return 1\n"
    assert code_size.symbol_span(decorated, "g") == (4, 7)
    # each decorator ends its own logical line, as tokenize sees it
    assert code_size.count_source(decorated, (4, 7)) == code_size.Count(4, 4, 4)


def test_wrong_entries_are_named(code_size: ModuleType) -> None:
    entry = code_size.Symbol
    runtime = "ppe_core/runtime/_runtime.py"
    entries = [
        entry("ppe_core", runtime, "BaseRuntime.peak_flops", "beyond-ppe", "why", "nothing"),
        entry("ppe_core", runtime, "BaseRuntime", "beyond-ppe", "why", "nothing"),  # overlaps
        entry("ppe_core", runtime, "BaseRuntime.gone", "beyond-ppe", "why", "nothing"),
        entry("ppe_core", runtime, "PyTorchRuntime", "same", "why", "nothing"),  # same -> same
        entry("ppe_core", "ppe_core/training/manager.py", "X", "beyond-ppe", "why", "-"),  # compat
        entry("ppe_core", runtime, "tag_module", "beyond-ppe", "", "nothing"),  # no reason
        entry("ppe", "runtime/_runtime.py", "BaseRuntime", "beyond-ppe", "why", "-"),
    ]
    found = code_size.symbol_problems(entries, ROOT, None)
    assert len(found) == 6, found
    assert "BaseRuntime: overlaps BaseRuntime.peak_flops" in found[0]
    assert "BaseRuntime.gone: no such definition" in found[1]
    assert "moves a definition of a same file to 'same'" in found[2]
    assert "moves a definition of a compat file" in found[3]
    assert "tag_module: every entry says why" in found[4]
    assert "side 'ppe' takes to 'not-provided'" in found[5]
    with pytest.raises(ValueError, match=r"code_size_symbols\.json are wrong"):
        code_size.report(symbols=entries)


def test_the_checked_in_entries_match_the_trees(code_size: ModuleType) -> None:
    entries = code_size.load_symbols()
    assert code_size.symbol_problems(entries, ROOT, code_size.ppe_package()) == []
    assert len({(e.side, e.file, e.symbol) for e in entries}) == len(entries)


def _totals(text: str) -> dict[str, int]:
    """The Totals table's code column by row name."""
    table = text.split("\nTotals\n")[1].split("\nNot counted")[0]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ")]
    return {cells[1].strip(): int(cells[4]) for cells in rows[1:]}


def test_a_definition_counted_apart_moves_its_code_lines(code_size: ModuleType) -> None:
    entry = code_size.Symbol(
        "ppe_core", "ppe_core/runtime/_runtime.py", "BaseRuntime.map", "beyond-ppe", "w", "p"
    )
    moved = code_size.symbol_count(ROOT, entry).code
    assert moved > 5
    before = _totals(code_size.report(symbols=[], follow=False))
    after = _totals(code_size.report(symbols=[entry], follow=False))
    assert after["ppe_core same"] == before["ppe_core same"] - moved
    assert after["ppe_core beyond-ppe"] == before["ppe_core beyond-ppe"] + moved
    assert after["ppe_core same, files whole"] == before["ppe_core same, files whole"]
    assert after["ppe_core without compat"] == before["ppe_core without compat"]


# A same file that reaches for a beyond-ppe module, and the beyond-ppe module with one
# definition counted same. Line numbers matter: the assertions name them.
SAME_FILE = """\
from pkg.extra import Helper, check
from pkg.extra import (
    check as again,
    shared,
)
import json

__all__ = [
    "Helper",
    "f",
]
_EXPORTS = {
    "check": "pkg.extra",
    "f": "pkg.same",
}


def h():
    return 0


def f(x):
    check(x)
    again(x)
    shared(x)
    if x:

        def h():  # a local, not the module-level h counted beyond-ppe
            Helper()

    return x


class C:
    def m(self):
        return json.dumps(self)

    def n(self):
        self.m()
        return 1
"""
BEYOND_FILE = """\
import os

from pkg.same import f


def check(x):
    return x


class Helper:
    pass


def shared(x):
    return f(os.fspath(x))


__all__ = [
    "check",
    "shared",
]
"""


def test_lines_that_serve_a_definition_of_the_other_class_follow_it(
    code_size: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "same.py").write_text(SAME_FILE)
    (tmp_path / "pkg" / "extra.py").write_text(BEYOND_FILE)
    files = {"pkg/same.py": "same", "pkg/extra.py": "beyond-ppe"}
    entry = code_size.Symbol
    symbols = [
        entry("ppe_core", "pkg/same.py", "C.m", "beyond-ppe", "w", "p"),
        entry("ppe_core", "pkg/same.py", "h", "beyond-ppe", "w", "p"),
        entry("ppe_core", "pkg/extra.py", "shared", "same", "w", "p"),
    ]
    found = {
        (f.file, f.kind, f.names): (f.to, f.count)
        for f in code_size.followers(tmp_path, files, symbols)
    }
    count = code_size.Count
    assert found == {
        # Both names beyond-ppe: the whole statement (one logical line).
        ("pkg/same.py", "import", ("Helper", "check")): ("beyond-ppe", count(1, 1, 1)),
        # Mixed: only the line of the beyond-ppe name (``shared`` is counted same).
        ("pkg/same.py", "import", ("again", "shared")): ("beyond-ppe", count(1, 1, 0)),
        # Used only inside C.m, which is counted beyond-ppe.
        ("pkg/same.py", "import", ("json",)): ("beyond-ppe", count(1, 1, 1)),
        ("pkg/same.py", "export", ("Helper",)): ("beyond-ppe", count(1, 1, 0)),
        # A lazy export table's entry, named by its key and module.
        ("pkg/same.py", "export", ("check",)): ("beyond-ppe", count(1, 1, 0)),
        # Statements that only call beyond-ppe code; ``shared(x)`` (counted same) stays.
        ("pkg/same.py", "call", ("check",)): ("beyond-ppe", count(1, 1, 1)),
        ("pkg/same.py", "call", ("again",)): ("beyond-ppe", count(1, 1, 1)),
        ("pkg/same.py", "call", ("self.m",)): ("beyond-ppe", count(1, 1, 1)),
        # Inside a local function of f (same code), under an ``if``.
        ("pkg/same.py", "call", ("Helper",)): ("beyond-ppe", count(1, 1, 1)),
        # The beyond-ppe file: the imports only ``shared`` (counted same) uses, its export.
        ("pkg/extra.py", "import", ("os",)): ("same", count(1, 1, 1)),
        ("pkg/extra.py", "import", ("f",)): ("same", count(1, 1, 1)),
        ("pkg/extra.py", "export", ("shared",)): ("same", count(1, 1, 0)),
    }


def test_followers_move_lines_between_classes_only(code_size: ModuleType) -> None:
    plain = _totals(code_size.report(follow=False))
    followed = _totals(code_size.report())
    moved = plain["ppe_core same"] - followed["ppe_core same"]
    assert moved > 0
    assert followed["ppe_core beyond-ppe"] == plain["ppe_core beyond-ppe"] + moved
    for row in ("ppe_core without compat", "ppe_core same, files whole", "ppe_core compat"):
        assert followed[row] == plain[row]


def test_ppe_imports_used_only_by_what_ppe_core_does_not_provide_leave_its_side(
    code_size: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "m.py").write_text(
        "import re\nimport os, sys\n\n\ndef kept():\n    return os.sep\n\n\n"
        "def dropped():\n    return re.escape(sys.argv[0])\n"
    )
    entries = [code_size.Symbol("ppe", "m.py", "dropped", "not-provided", "w", "p")]
    found = code_size.ppe_left_out_imports(tmp_path, entries)
    # ``import re`` leaves; ``import os, sys`` stays (os is used by what is provided).
    assert [(f.names, f.count) for f in found] == [(("re",), code_size.Count(1, 1, 1))]
