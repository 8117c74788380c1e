"""``ppe.nn.ensure`` / ``ppe.nn.Ensure``: assert a tensor's shape and dtype inside a model."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ppe_core.errors import ConfigurationError, TensorCheckError

__all__ = ["Ensure", "ensure"]


def _broadcastable(actual: list[int], expected: list[int]) -> bool:
    """Whether two shapes broadcast together (missing leading dimensions count as 1).

    Written with indices only so that TorchScript compiles it, as PPE's ``Ensure`` scripts.
    """
    n_actual, n_expected = len(actual), len(expected)
    for i in range(1, min(n_actual, n_expected) + 1):
        a, b = actual[n_actual - i], expected[n_expected - i]
        if a != b and a != 1 and b != 1:
            return False
    return True


class Ensure(torch.nn.Module):
    """A pass-through module that raises when its input has an unexpected shape or dtype.

    Put it between layers to fail at the first wrong tensor with a message naming both shapes,
    instead of an opaque error (or a silent broadcast) further down.

    Args:
        shape: Expected shape; ``None`` in a dimension accepts any size there (and turns on
            broadcast matching, as in PPE).
        dtype: Expected dtype.
        broadcastable: Accept any shape that broadcasts with ``shape`` instead of only an equal
            one.
        can_cast: Accept any dtype that ``torch.can_cast`` converts to ``dtype``.

    Raises:
        ConfigurationError: Neither ``shape`` nor ``dtype`` is given (a ``ValueError``).
    """

    def __init__(
        self,
        *,
        shape: Sequence[int | None] | None = None,
        dtype: torch.dtype | None = None,
        broadcastable: bool = False,
        can_cast: bool = False,
    ) -> None:
        super().__init__()
        if shape is None and dtype is None:
            raise ConfigurationError("Ensure needs something to check: pass shape=, dtype= or both")
        self._dtype = dtype
        self._can_cast = can_cast
        self._broadcastable = broadcastable
        self._shape: list[int] | None = None
        if shape is not None:
            # A free dimension is a size-1 dimension under broadcasting, which is how it is
            # matched: a wildcard implies broadcast matching for the whole shape, as in PPE.
            self._shape = [1 if size is None else int(size) for size in shape]
            if any(size is None for size in shape):
                self._broadcastable = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Return ``input`` unchanged after checking it.

        Raises:
            TensorCheckError: The shape or dtype does not match (a ``ValueError``).
        """
        expected = self._shape
        actual = list(input.shape)
        if expected is not None and actual != expected:
            if not self._broadcastable:
                raise TensorCheckError(
                    f"expected a tensor of shape {expected}, got {actual}; fix the producer of "
                    "this tensor, or pass broadcastable=True (or None for a free dimension) to "
                    "accept broadcastable shapes"
                )
            if not _broadcastable(actual, expected):
                raise TensorCheckError(
                    f"shape {actual} does not broadcast with the expected {expected} (None "
                    "dimensions shown as 1)"
                )
        if self._dtype is not None and input.dtype != self._dtype:
            if not self._can_cast:
                raise TensorCheckError(
                    f"expected a tensor of dtype {self._dtype}, got {input.dtype}; convert it "
                    "with .to(dtype), or pass can_cast=True to accept dtypes that cast safely"
                )
            if not torch.can_cast(input.dtype, self._dtype):
                raise TensorCheckError(
                    f"dtype {input.dtype} cannot be cast to {self._dtype} safely "
                    "(torch.can_cast is False); convert it explicitly with .to(dtype)"
                )
        return input

    def extra_repr(self) -> str:
        return (
            f"shape={self._shape}, dtype={self._dtype}, broadcastable={self._broadcastable}, "
            f"can_cast={self._can_cast}"
        )


def ensure(
    tensor: torch.Tensor,
    shape: Sequence[int | None] | None = None,
    dtype: torch.dtype | None = None,
    broadcastable: bool = False,
    can_cast: bool = False,
) -> None:
    """Check ``tensor``'s shape and dtype as :class:`Ensure` does, returning nothing.

    Raises:
        ConfigurationError: Neither ``shape`` nor ``dtype`` is given.
        TensorCheckError: The tensor does not match.
    """
    Ensure(shape=shape, dtype=dtype, broadcastable=broadcastable, can_cast=can_cast)(tensor)
