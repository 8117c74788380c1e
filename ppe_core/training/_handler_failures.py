"""Extension handlers that all run: every ``on_error`` and ``finalize`` is called even when one
raises. A failure is raised once the others ran or, while another error is being handled,
reported as an :class:`~ppe_core.errors.ExtensionErrorHandlerWarning`, so that it never masks
that error (PPE: a failing ``finalize`` propagates and the ones after it do not run; a failing
``on_error`` replaces the training error)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

from ppe_core.errors import ExtensionErrorHandlerWarning

__all__ = ["call_each", "warn_failures"]


def call_each(
    kind: str, calls: Iterable[tuple[str, Callable[[], object]]], handling: BaseException | None
) -> None:
    """Calls every handler; then raises the first failure, or warns each while ``handling``.

    Args:
        kind: What the handlers are (``"on_error"``, ``"finalize"``), named in the warnings.
        calls: ``(extension name, handler)`` pairs (``"<writer>"`` for the writer).
        handling: The error being handled; None at a normal end.
    """
    failures: list[tuple[str, Exception]] = []
    for name, call in calls:
        try:
            call()
        except Exception as failure:
            failures.append((name, failure))
    if failures and handling is None:
        raise failures[0][1]
    warn_failures(kind, failures, handling)


def warn_failures(
    kind: str, failures: Iterable[tuple[str, Exception]], handling: BaseException | None
) -> None:
    """Warns of each handler's failure while ``handling`` is handled, instead of raising it
    (see :func:`call_each`)."""
    for name, error in failures:
        warnings.warn(
            ExtensionErrorHandlerWarning(
                f"{kind} of {name!r} raised {type(error).__name__}: {error} while "
                f"handling {type(handling).__name__}"
            ),
            stacklevel=4,
        )
