"""Plain line counts of ppe-core's packages, with pytorch-pfn-extras beside them when installed.

Every ``.py`` file is counted the same way, with no classification: ``lines`` is every line,
``code`` the lines that hold a token other than a comment or a docstring (blank lines,
comment lines and docstring lines are not code). The ``loaded`` row counts the modules of the
package that a short training run imports (three batches, ``LogReport`` and ``snapshot``).

Run: ``python -m benchmarks.line_count`` (``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The distributions of this repository: a package folder each.
PACKAGES = {
    "ppe-core": ROOT / "ppe_core",
    **{
        f"ppe-{p.name.removeprefix('ppe_')}": p / p.name
        for p in sorted((ROOT / "plugins").iterdir())
        if (p / p.name / "__init__.py").is_file()
    },
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers of every module, class and function docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                end = body[0].end_lineno or body[0].lineno
                lines.update(range(body[0].lineno, end + 1))
    return lines


def count_source(text: str) -> tuple[int, int]:
    """``(lines, code)`` of one Python source (see the module docstring)."""
    lines = len(text.splitlines())
    docstrings = _docstring_lines(ast.parse(text))
    not_code = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT}
    not_code |= {tokenize.DEDENT, tokenize.ENDMARKER}
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in not_code:
            code.update(range(token.start[0], token.end[0] + 1))
    return lines, len(code - docstrings)


def count_tree(folder: Path) -> tuple[int, int, int]:
    """``(files, lines, code)`` of every ``.py`` file below ``folder`` (tests excluded)."""
    files = lines = code = 0
    for path in sorted(folder.rglob("*.py")):
        if "tests" in path.relative_to(folder).parts:
            continue
        file_lines, file_code = count_source(path.read_text(encoding="utf-8"))
        files, lines, code = files + 1, lines + file_lines, code + file_code
    return files, lines, code


_LOADED = """
import sys, tempfile, torch, {pkg} as ppe
model = torch.nn.Linear(2, 1)
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l = model
    def forward(self, x):
        return {{"loss": self.l(x).pow(2).mean()}}
m = M()
ppe.to(m, "cpu")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader([{{"x": torch.ones(2)}}] * 3, batch_size=1)
with tempfile.TemporaryDirectory() as out:
    trainer = ppe.engine.create_trainer(m, opt, 1, out_dir=out, extensions=[
        ppe.training.extensions.LogReport(), ppe.training.extensions.snapshot()])
    trainer.run(loader)
print("\\n".join(f for n, mod in sys.modules.items()
                if n.split(".")[0] in {prefixes} and (f := getattr(mod, "__file__", None))))
"""


def count_loaded(package: str, prefixes: tuple[str, ...]) -> tuple[int, int, int]:
    """``(modules, lines, code)`` of the modules of ``prefixes`` a short run imports."""
    script = _LOADED.format(pkg=package, prefixes=set(prefixes))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    ).stdout
    modules = lines = code = 0
    for name in sorted(set(out.split())):
        if name.endswith(".py"):
            file_lines, file_code = count_source(Path(name).read_text(encoding="utf-8"))
            modules, lines, code = modules + 1, lines + file_lines, code + file_code
    return modules, lines, code


def ppe_folder() -> Path | None:
    """pytorch-pfn-extras' package folder, or None when it is not installed."""
    try:
        import pytorch_pfn_extras
    except ImportError:
        return None
    return Path(pytorch_pfn_extras.__file__).parent


def collect() -> dict[str, dict[str, int]]:
    """Every row: each distribution, PPE's package, and the loaded rows."""
    rows = {}
    for name, folder in PACKAGES.items():
        files, lines, code = count_tree(folder)
        rows[name] = {"files": files, "lines": lines, "code": code}
    plugin_prefixes = tuple(folder.name for folder in PACKAGES.values())
    modules, lines, code = count_loaded("ppe_core", plugin_prefixes)
    rows["ppe-core + plugins run, loaded"] = {"files": modules, "lines": lines, "code": code}
    ppe = ppe_folder()
    if ppe is not None:
        files, lines, code = count_tree(ppe)
        rows["pytorch-pfn-extras"] = {"files": files, "lines": lines, "code": code}
        modules, lines, code = count_loaded("pytorch_pfn_extras", ("pytorch_pfn_extras",))
        rows["pytorch-pfn-extras run, loaded"] = {"files": modules, "lines": lines, "code": code}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = collect()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'':32}{'files':>8}{'lines':>9}{'code':>9}")
    for name, row in rows.items():
        print(f"{name:32}{row['files']:>8,}{row['lines']:>9,}{row['code']:>9,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
