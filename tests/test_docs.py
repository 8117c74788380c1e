"""The documentation builds without a warning, and every Python snippet in it runs.

Each ```python block of a page under docs/ (and of README.md) is executed in page order, in one
namespace per page, from a temporary working directory, so a page reads as one script. A block
preceded on the line above by ``<!-- snippet: compile-only -->`` (torchrun, a GPU, a
placeholder) is only compiled.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import linecache
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from ppe_testing import enable_emulated_device

# The plugin tutorial's runtime keeps its tensors on the emulated device, which a process can
# enable only before its first backward pass: enabled at collection, as the tutorial tells a
# plugin's test suite to do in pytest_configure.
enable_emulated_device()

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
COMPILE_ONLY = "<!-- snippet: compile-only -->"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\s`]*)")


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One fenced code block: where it starts, its info string and its code."""

    path: Path
    line: int  # 1-based line of the first code line
    language: str
    code: str
    compile_only: bool


def extract_snippets(path: Path) -> list[Snippet]:
    """Returns every fenced block of a Markdown file, in order (indented fences included)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    snippets: list[Snippet] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].lower()
        previous = lines[i - 1].strip() if i else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""
        ):
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        snippets.append(
            Snippet(path, i + 2, info, "\n".join(body) + "\n", previous == COMPILE_ONLY)
        )
        i = j + 1
    return snippets


def pages() -> list[Path]:
    return [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def is_python(snippet: Snippet) -> bool:
    return snippet.language in ("python", "py")


def run_page(path: Path) -> None:
    """Executes the page's Python blocks in order, in one namespace; compiles the others."""
    namespace: dict[str, object] = {"__name__": "__docs__"}
    snippets = [s for s in extract_snippets(path) if is_python(s)]
    # The code is compiled as a file that does not exist, "<page> (python)", whose lines
    # linecache holds: the page's Python lines at their own line numbers, the prose blanked
    # out. Tools that read the source of a function the snippets define (inspect, tracebacks,
    # torch.compile, which tokenizes the file and fails on a Markdown page) see Python.
    filename = f"{path} (python)"
    lines = [""] * len(path.read_text(encoding="utf-8").splitlines())
    for snippet in snippets:
        for offset, line in enumerate(snippet.code.splitlines()):
            lines[snippet.line - 1 + offset] = line
    source = [line + "\n" for line in lines]
    # mtime None: linecache.checkcache keeps the entry instead of looking for the file.
    linecache.cache[filename] = (sum(map(len, source)), None, source, filename)
    try:
        for snippet in snippets:
            where = f"{page_id(path)}:{snippet.line}"
            # Padding with blank lines makes tracebacks point at the Markdown file's own lines.
            code = compile("\n" * (snippet.line - 1) + snippet.code, filename, "exec")
            if snippet.compile_only:
                continue
            try:
                exec(code, namespace)
            except Exception as exc:
                raise AssertionError(f"the snippet at {where} raised {exc!r}") from exc
    finally:
        linecache.cache.pop(filename, None)


PYTHON_PAGES = [p for p in pages() if any(is_python(s) for s in extract_snippets(p))]


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The snippets' models are tiny: one intra-op thread runs them fastest on a busy CI VM."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # a few pages train tiny models for some seconds
@pytest.mark.parametrize("path", PYTHON_PAGES, ids=page_id)
def test_every_python_snippet_of_the_page_runs(path: Path, one_thread: None) -> None:
    # The conftest fixtures run each test in its tmp_path with a fresh plugin host (ppe_cpu
    # and ppe_cuda registered, no entry-point scan), so files a snippet writes land there.
    run_page(path)


def test_the_extractor_reads_fences_markers_and_line_numbers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n```python\nx = 1\n```\n\n<!-- snippet: compile-only -->\n```python\n"
        "torchrun_only()\n```\n\n- item\n\n    ```py\n    y = x + 1\n    ```\n\n```bash\nls\n```\n",
        encoding="utf-8",
    )
    snippets = extract_snippets(page)
    assert [(s.language, s.line, s.code, s.compile_only) for s in snippets] == [
        ("python", 4, "x = 1\n", False),
        ("python", 9, "torchrun_only()\n", True),
        ("py", 15, "y = x + 1\n", False),
        ("bash", 19, "ls\n", False),
    ]


def test_a_failing_snippet_names_its_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text("```python\na = 1\n```\n\n```python\nb = a + undefined\n```\n")
    with pytest.raises(AssertionError, match=r"broken\.md:6 raised NameError"):
        run_page(page)


def test_compile_only_blocks_are_compiled_but_not_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"{COMPILE_ONLY}\n```python\nraise SystemExit('ran')\n```\n")
    run_page(page)  # not executed
    page.write_text(f"{COMPILE_ONLY}\n```python\ndef broken(:\n```\n")
    with pytest.raises(SyntaxError):
        run_page(page)


@pytest.mark.slow
def test_mkdocs_builds_the_site_with_warnings_as_errors(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    for page in ("index.html", "quickstart/index.html", "api/engine/index.html"):
        assert (site / page).is_file(), page
    # The API reference is generated from the docstrings.
    engine = (site / "api" / "engine" / "index.html").read_text(encoding="utf-8")
    assert "create_trainer" in engine and "max_epochs" in engine
    # Sphinx roles in docstrings are rendered as code, not printed literally.
    for html_file in (site / "api").rglob("*.html"):
        assert ":class:<code>" not in html_file.read_text(encoding="utf-8"), html_file


def test_the_sphinx_role_hook_renders_roles_as_code() -> None:
    spec = importlib.util.spec_from_file_location(
        "sphinx_roles", DOCS / "_hooks" / "sphinx_roles.py"
    )
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    html = "A :class:<code>~ppe_core.training.Evaluator</code> and :func:<code>ppe.to</code>."
    assert hook.on_page_content(html) == "A <code>Evaluator</code> and <code>ppe.to</code>."


def test_the_readme_set_up_commands_are_what_ci_runs() -> None:
    # CI (.ci/run) installs a fresh clone with the README's commands; they must not drift apart.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    commands = [line[4:] for line in section.splitlines() if line.startswith("    ")]
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert len(commands) == 2, commands
    assert commands[1].endswith('&& .venv/bin/python -m pytest -m "not slow"'), commands[1]
    for command in commands:
        assert command in ci_lines, f"README command not run by .ci/run: {command}"
    # The slow scenarios the README names run in CI too: together, the whole suite.
    assert "`.venv/bin/python -m pytest -m slow`" in section
    assert ".venv/bin/python -m pytest -m slow" in ci_lines


# A test file of the core (tests/...) or of a package in the repository (plugins/<name>/tests/...).
_TEST_REFERENCE = re.compile(r"((?:(?:plugins|examples)/\w+/)?tests/[\w/]+\.py)?::(test_\w+)")


def _test_names(path: Path) -> set[str]:
    """Names of the test functions (and test methods) defined in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    }


def test_every_test_named_in_the_docs_exists() -> None:
    """A guarantee table names the test that proves each claim; a renamed or deleted test
    must not leave the claim standing unproven. ``::test_x`` after ``tests/f.py::...`` on
    the same line refers to the same file."""
    pages = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
    missing: list[str] = []
    checked = 0
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            current: str | None = None
            for match in _TEST_REFERENCE.finditer(line):
                current = match[1] or current
                if current is None:
                    continue
                checked += 1
                path = ROOT / current
                if not path.is_file() or match[2] not in _test_names(path):
                    missing.append(f"{page.name}:{number}: {current}::{match[2]}")
    assert checked > 50, "the guarantee tables name their tests as tests/<file>.py::<test>"
    assert not missing, "tests named in the docs that do not exist:\n" + "\n".join(missing)
