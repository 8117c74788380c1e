"""Reporting's explained errors: what PPE leaves to Python's or PyTorch's bare errors.

PPE raises a bare ``KeyError`` for an observer never registered, an ``IndexError`` from an
empty list when no reporter is current, a ``ZeroDivisionError`` for the mean of nothing,
a ``ValueError`` naming only the key for a malformed ``(value, weight)`` entry; it lets
arithmetic fail (or succeed on a vector) when ``Summary.add`` gets a non-number or a tensor
of several elements. ppe-core raises the same types, saying what to do instead. The
conditions are tested where they belong (most on per-step paths); these build the errors.
"""

from __future__ import annotations

import numbers

import torch

from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    EmptySummaryError,
    NoCurrentReporterError,
    UnknownObserverError,
)


def unknown_observer(observer: object, registered: int) -> UnknownObserverError:
    """``Reporter.report``'s observer was never registered (``registered`` observers are)."""
    return UnknownObserverError(
        f"{type(observer).__name__} object at {id(observer):#x} is not registered "
        f"with this Reporter ({registered} observers are); register it "
        "first with reporter.add_observer(name, observer)"
    )


def no_current_reporter() -> NoCurrentReporterError:
    """An operation needed the current reporter and none is."""
    return NoCurrentReporterError(
        "no Reporter is current in this thread; enter one first with `with reporter:` or "
        "`with reporter.scope(observation):`"
    )


def is_host_number(value: object) -> bool:
    """Whether ``value`` is a Python or NumPy number or array (what PPE's arithmetic takes)."""
    if isinstance(value, numbers.Number):
        return True
    return hasattr(value, "ndim") and hasattr(value, "__mul__") and hasattr(value, "dtype")


def not_a_number(value: object, weight: object) -> ArgumentTypeError:
    """``Summary.add`` got a value or weight that is neither a number nor a tensor."""
    return ArgumentTypeError(
        f"Summary.add() takes a number or a one-element tensor as value and weight, "
        f"got {type(value).__name__} {value!r} (weight {weight!r}); add numbers, "
        "e.g. summary.add(loss) or summary.add(accuracy, weight=batch_size)"
    )


def not_a_scalar(value: torch.Tensor) -> ConfigurationError:
    """``Summary.add`` got a tensor of more than one element."""
    return ConfigurationError(
        f"Summary.add() takes a scalar, got a tensor of shape {tuple(value.shape)}; "
        "reduce it first, e.g. report({'loss': loss.mean()})"
    )


def empty_summary() -> EmptySummaryError:
    """A mean of numbers whose total weight is 0."""
    return EmptySummaryError(
        "the summary is empty (total weight 0); add() values before computing a mean"
    )


def malformed_weighted_entry(key: str, entry: object) -> ConfigurationError:
    """A ``DictSummary`` entry is a tuple that is not ``(value, scalar weight)``."""
    return ConfigurationError(
        f"DictSummary entry {key!r} is a tuple, which means (value, weight), "
        f"but got {entry!r}; pass a scalar or a (value, scalar weight) pair"
    )
