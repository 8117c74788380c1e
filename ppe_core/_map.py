"""``ppe.map``: apply a module (or its method) to many inputs through its runtime."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["map"]


def map(
    func: Callable[..., Any],
    iterable: Iterable[Any],
    out_keys: set[str] | None = None,
    device: Any = "cpu",
) -> Iterable[Any]:
    """Apply ``func`` to every item of ``iterable`` with the runtime of ``func``'s module.

    The items are passed like batches (a dict as keyword arguments). The runtime's
    :meth:`~ppe_core.runtime.BaseRuntime.map` decides how: the generic runtimes run one item
    after another, lazily; a device runtime may overlap transfers and compute.

    Args:
        func: A module moved with ``ppe.to``, a bound method of one, or a code block.
        iterable: The inputs.
        out_keys: Keep only these keys of each (dict) output.
        device: Where the outputs' tensors are moved (default ``"cpu"``).

    Returns:
        An iterable of outputs (a generator for the generic runtimes).

    Raises:
        NoRuntimeError: ``func``'s module was not moved with ``ppe.to``.
    """
    from ppe_core.handler import forward

    block = forward(func)
    return block.runtime.map(block, iterable, out_keys, device)
