"""The simulated device's "driver": its memory is the host's, and it counts copies into it.

A real plugin would call its device library here; the counters play the part of statistics
such as ``torch.cuda.memory_allocated``.
"""

from __future__ import annotations

__all__ = ["bytes_copied", "record_copy", "reset_stats"]

_COPIED: dict[int, int] = {}


def record_copy(index: int, nbytes: int) -> None:
    """Count ``nbytes`` copied onto device ``index``."""
    _COPIED[index] = _COPIED.get(index, 0) + nbytes


def bytes_copied(index: int = 0) -> int:
    """Bytes copied onto device ``index`` since the last :func:`reset_stats`."""
    return _COPIED.get(index, 0)


def reset_stats() -> None:
    """Zero every device's counters."""
    _COPIED.clear()
