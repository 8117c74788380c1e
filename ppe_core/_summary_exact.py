"""A Summary's unmerged accumulators in its snapshot state, so a resumed run sums bit-exactly.

PPE's Summary state is the merged sums (``_x``, ``_x2``, ``_n``); a run resumed from them
re-accumulates on top of sums rounded differently from the uninterrupted run's, so its later
means differ in the last bits. ppe-core also writes the device accumulators and the host sums
as they are, under one more key that PPE readers ignore, and a load takes them back when
present: the resumed summary goes on summing bit for bit like the uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ppe_core.errors import ConfigurationError

#: The extra Summary state entry holding the unmerged accumulators (PPE ignores it).
EXACT_KEY = "_ppe_core_exact"


def exact_entry(dev: Sequence[Any], host: list[Any], dtype: torch.dtype) -> dict[str, Any]:
    """The entry under :data:`EXACT_KEY`: ``dev`` (``(shift, sum w*d, sum w*d*d, weight)``)
    copied to the host, the host sums ``[x, x2, n]`` and the results' ``dtype``, by name."""
    host_parts = (p.cpu() if isinstance(p, torch.Tensor) else p for p in dev)
    return dict(
        zip(("shift", "sum", "sum_sq", "n"), host_parts, strict=True),
        host=host,
        dtype=str(dtype).removeprefix("torch."),
    )


def read_exact(
    exact: Mapping[str, Any],
) -> tuple[list[Any], tuple[Any, Any, Any, Any], torch.dtype]:
    """The host sums, device accumulators and dtype that :func:`exact_entry` wrote.

    Raises:
        ConfigurationError: The entry names a dtype torch does not have.
    """
    dtype = getattr(torch, str(exact["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigurationError(
            f"a Summary state names an unknown dtype {exact['dtype']!r}; it was not written "
            "by this ppe-core version, drop its '_ppe_core_exact' entry to load the merged sums"
        )
    # "n_tensor": the tensor part of the weight in states written before it joined "n".
    n = exact["n"] + exact.get("n_tensor", 0)
    return exact["host"], (exact["shift"], exact["sum"], exact["sum_sq"], n), dtype
