"""``_compare_states``: PPE's helper comparing two nested states (state dicts, their lists)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["_compare_states"]


def _compare_states(s1: Any, s2: Any, strict: bool = False) -> bool:
    """Whether two nested states hold the same keys, structure and values.

    Dicts must have the same keys, lists and tuples the same length (a list equals a tuple of
    the same items, as in PPE); tensors are compared with :func:`torch.allclose`, or exactly
    when ``strict`` (which, unlike PPE, applies at every depth); other values with ``==``.
    A tensor against a non-tensor, or tensors of other shapes or dtypes, are unequal (PPE
    raises).
    Useful to check that a snapshot restores what was saved, e.g.
    ``assert _compare_states(model.state_dict(), restored.state_dict())``.
    """
    if isinstance(s1, Mapping):
        if not isinstance(s2, Mapping) or set(s1) != set(s2):
            return False
        return all(_compare_values(s1[k], s2[k], strict) for k in s1)
    if isinstance(s1, (list, tuple)):
        if not isinstance(s2, (list, tuple)) or len(s1) != len(s2):
            return False
        return all(_compare_values(a, b, strict) for a, b in zip(s1, s2, strict=True))
    return _compare_values(s1, s2, strict)


def _compare_values(a: Any, b: Any, strict: bool) -> bool:
    if isinstance(a, (Mapping, list, tuple)):
        return isinstance(b, (Mapping, list, tuple)) and _compare_states(a, b, strict)
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        return torch.equal(a, b) if strict else torch.allclose(a, b)
    return bool(a == b)
