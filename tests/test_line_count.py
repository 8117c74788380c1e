"""benchmarks/line_count.py counts every line and every code line, with no classification."""

from __future__ import annotations

from pathlib import Path

from benchmarks.line_count import count_source, count_tree

SOURCE = '''"""Module docstring,
over two lines."""
import os  # a comment after code is code

# a comment line


class A:
    """Class docstring."""

    x = """not a docstring:
    an assigned string"""

    def f(self) -> int:
        """Function docstring."""
        return (1 +
                2)
'''


def test_docstrings_comments_and_blank_lines_are_not_code() -> None:
    lines, code = count_source(SOURCE)
    assert lines == 17
    # import, class, x = (two lines), def, return (two lines).
    assert code == 7


def test_a_tree_is_the_sum_of_its_files_without_tests(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text(SOURCE)
    (tmp_path / "pkg" / "b.py").write_text("x = 1\n\n")
    (tmp_path / "pkg" / "tests" / "test_a.py").write_text("y = 2\n")
    assert count_tree(tmp_path / "pkg") == (2, 19, 8)
