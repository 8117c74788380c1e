"""docs/architecture.md's walks name functions as ``path.py:Qualname``: each must exist where
the walk says, so that a refactor that moves or renames one also mends the walk."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_REFERENCE = re.compile(r"`((?:plugins/)?[\w/]+\.py):([\w.]+)`")


def _module_name(path: str) -> str:
    """``training/_state.py`` -> ``ppe_core.training._state``; a plugin's path names its own
    package (``plugins/ppe_cpu/ppe_cpu/_runtime.py`` -> ``ppe_cpu._runtime``)."""
    parts = Path(path).with_suffix("").parts
    name = ".".join(parts[2:]) if parts[0] == "plugins" else ".".join(("ppe_core", *parts))
    return name.removesuffix(".__init__")


def _missing(path: str, qualname: str) -> str | None:
    """Why ``path:qualname`` names nothing, or None; a class attribute must be defined by
    that class itself (a walk that names an inherited method points at the wrong file)."""
    target: object = importlib.import_module(_module_name(path))
    for part in qualname.split("."):
        if inspect.isclass(target) and part not in vars(target):
            return f"{target.__name__} does not define {part}"
        if not hasattr(target, part):
            return f"no {part} in {getattr(target, '__name__', target)}"
        target = getattr(target, part)
    return None


def _references(text: str) -> list[tuple[str, str]]:
    return sorted(set(_REFERENCE.findall(text)))


def test_the_reference_check_sees_a_stale_name() -> None:
    text = (
        "`training/_manager.py:ExtensionsManager.state_dict` → "
        "`training/_ignite.py:IgniteExtensionsManager.extend`"
    )
    found = {ref: _missing(*ref) for ref in _references(text)}
    assert found[("training/_manager.py", "ExtensionsManager.state_dict")] is None
    assert found[("training/_ignite.py", "IgniteExtensionsManager.extend")] == (
        "IgniteExtensionsManager does not define extend"
    )
    assert _missing("handler/_logic.py", "no_such_function") is not None


def test_every_function_the_architecture_walks_name_exists_where_they_say() -> None:
    references = _references((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert len(references) > 50  # the four walks and the module rooms
    stale = {f"{path}:{name}": why for path, name in references if (why := _missing(path, name))}
    if stale:
        pytest.fail(f"docs/architecture.md names what is not there: {stale}")
