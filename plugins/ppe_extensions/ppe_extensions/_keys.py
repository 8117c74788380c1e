"""Observation-key arguments (``LogReport(keys=...)``, ``PrintReport(entries=...)``), checked.

PPE iterates whatever it is given, so a bare string tracks its characters as keys and the
extension silently reports nothing; here it is refused with the fix.
"""

from __future__ import annotations

from collections.abc import Iterable

from ppe_core.errors import ArgumentTypeError

__all__ = ["key_tuple"]


def key_tuple(keys: object, owner: str, argument: str) -> tuple[str, ...]:
    """``keys`` as a tuple of observation keys, rejecting a bare string.

    A string is iterable, so ``LogReport(keys="loss")`` would otherwise track the keys
    ``"l"``, ``"o"``, ``"s"`` and never report anything.

    Raises:
        ArgumentTypeError: ``keys`` is a string, not iterable, or holds a non-string.
    """
    if isinstance(keys, str):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got the string {keys!r}; wrap it in a "
            f"list: {owner}({argument}=[{keys!r}])"
        )
    if not isinstance(keys, Iterable):
        raise ArgumentTypeError(
            f"{owner} {argument} must be a list of keys, got {type(keys).__name__} {keys!r}"
        )
    result = tuple(keys)
    wrong = [key for key in result if not isinstance(key, str)]
    if wrong:
        raise ArgumentTypeError(
            f"{owner} {argument} must hold observation keys (strings) such as 'train/loss', "
            f"got {wrong!r}"
        )
    return result
