"""The ppe-core version; the first-party plugins move in lockstep with it."""

from __future__ import annotations

import re

__version__ = "0.1.0"

_RELEASE = re.compile(r"v?(\d+(?:\.\d+)*)")


def release(version: object) -> tuple[int, ...] | None:
    """The release numbers of a version string (``'0.2.0rc1'`` -> ``(0, 2)``, trailing zeros
    dropped so that ``0.2`` equals ``0.2.0``); None when ``version`` is not one.

    For comparing the ppe-core version that wrote a state with this one: only a newer
    release can have written what this one does not read.
    """
    match = _RELEASE.match(version) if isinstance(version, str) else None
    if match is None:
        return None
    numbers = tuple(int(part) for part in match.group(1).split("."))
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers = numbers[:-1]
    return numbers
