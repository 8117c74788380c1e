"""``CollateAsDict``: name the fields of a batch so a model's ``forward`` gets keyword inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import default_collate

__all__ = ["CollateAsDict"]


class CollateAsDict:
    """A ``collate_fn`` that returns ``{name: field}`` for the fields ``collate_fn`` produces.

    ppe-core's handler passes a dict batch to ``forward`` as keyword arguments, so the names
    are usually ``forward``'s parameter names. As in PPE, the fields and names are paired with
    ``zip``: extra fields or extra names are dropped.

    Args:
        names: Key of each field, in the order the collated batch holds them.
        collate_fn: Collates the samples first (PyTorch's ``default_collate`` by default).
    """

    def __init__(
        self,
        names: Sequence[str],
        collate_fn: Callable[..., Any] = default_collate,
    ) -> None:
        self.names = names
        self.collate_fn = collate_fn

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Collate with ``collate_fn`` and key the resulting fields by ``names``."""
        batch = self.collate_fn(*args, **kwargs)
        return dict(zip(self.names, batch, strict=False))
