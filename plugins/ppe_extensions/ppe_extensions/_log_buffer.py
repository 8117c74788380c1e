"""PPE's ``_LogBuffer`` and ``_LogLooker``: log entries shared by several readers, each with
its own looker. Code written on PPE imports them from ``training.extensions.log_report``; feed
one with ``LogReport.add_entry_listener``."""

from __future__ import annotations

from typing import Any

__all__ = ["_LogBuffer", "_LogLooker"]


class _LogBuffer:
    """Log entries kept until every looker has cleared them (PPE's ``_LogBuffer``).

    A looker made by :meth:`emit_new_looker` sees the entries appended since it was made or
    last cleared; an entry is dropped once every looker has cleared past it.
    """

    def __init__(self) -> None:
        self._entries: list[dict[str, Any]] = []
        self._first = 0  # the index, counted from the first entry ever appended, of _entries[0]
        self._starts: dict[int, int] = {}  # looker id -> index of its first entry

    def append(self, entry: dict[str, Any]) -> None:
        """Adds an entry for every looker."""
        self._entries.append(entry)

    def size(self) -> int:
        """The number of entries kept (those some looker has not cleared)."""
        return len(self._entries)

    def emit_new_looker(self) -> _LogLooker:
        """A new looker; it sees only the entries appended from now on."""
        looker_id = len(self._starts)
        self._starts[looker_id] = self._first + len(self._entries)
        return _LogLooker(self, looker_id)

    def _get(self, looker_id: int) -> list[dict[str, Any]]:
        return self._entries[self._starts[looker_id] - self._first :]

    def _clear(self, looker_id: int) -> None:
        if looker_id not in self._starts:
            raise ValueError(f"looker {looker_id} does not belong to this _LogBuffer")
        self._starts[looker_id] = self._first + len(self._entries)
        oldest = min(self._starts.values())
        if oldest > self._first:
            del self._entries[: oldest - self._first]
            self._first = oldest


class _LogLooker:
    """One reader's view of a :class:`_LogBuffer` (PPE's ``_LogLooker``)."""

    def __init__(self, log_buffer: _LogBuffer, looker_id: int) -> None:
        self._log_buffer = log_buffer
        self._looker_id = looker_id

    def get(self) -> list[dict[str, Any]]:
        """The entries appended since this looker was made or last cleared."""
        return self._log_buffer._get(self._looker_id)

    def clear(self) -> None:
        """Marks every entry seen so far as read by this looker."""
        self._log_buffer._clear(self._looker_id)
