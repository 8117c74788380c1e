"""Evaluation means over samples, not batches: each batch's observation is weighted by its
number of samples, so a smaller last batch counts for the samples it holds (PPE averages the
batches, the last as much as a full one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ppe_core.reporting import DictSummary

__all__ = ["add_per_sample", "batch_size", "weighted"]


def add_per_sample(
    summary: DictSummary, batch_idx: int, batch: Any, observation: dict[str, Any], unit: int
) -> int:
    """Adds a batch's observation to ``summary``, weighted by the batch's number of samples;
    returns the unit of the weights (the first batch's size, taken at ``batch_idx`` 0, else
    ``unit``).

    Every reported value is taken as a mean over its batch, so the run's mean is the mean over
    all samples: ``sum(n_b * v_b) / sum(n_b)``. Weights are relative to the first batch's size:
    batches of that size take the unweighted path (the same arithmetic as PPE when all batches
    are full) and only a smaller last batch is weighted.
    """
    size = batch_size(batch)
    if batch_idx == 0:
        unit = size or 1
    if size == unit:
        summary.add(observation)
        return unit
    summary.add(weighted(observation, size / unit))
    return unit


def weighted(observation: dict[str, Any], scale: float) -> dict[str, Any]:
    """``observation`` with every value's weight multiplied by ``scale`` (a plain value
    weighs 1, a ``(value, weight)`` pair its weight)."""
    return {
        key: (value[0], value[1] * scale)
        if isinstance(value, tuple) and len(value) == 2
        else (value, scale)
        for key, value in observation.items()
    }


def batch_size(batch: Any) -> int:
    """The number of samples in ``batch``: the leading dimension of its first tensor.

    Tensors are searched depth-first through dicts, lists and tuples (a ``(x, t)`` pair, a
    ``{"x": x, "t": t}`` dict, a namedtuple). A batch without a tensor of at least one
    dimension counts as one sample.
    """
    cls = type(batch)  # fast path for the usual dict or tuple of tensors (~1 us per batch)
    first: Any = None
    if cls is dict:
        first = next(iter(batch.values()), None)
    elif cls is tuple or cls is list:
        first = batch[0] if batch else None
    if type(first) is torch.Tensor and first.ndim:
        return int(first.shape[0])
    size = _leading_dim(batch)
    return 1 if size is None else size


def _leading_dim(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else None
    if isinstance(batch, Mapping):
        batch = batch.values()
    elif not isinstance(batch, (list, tuple)):
        return None
    for item in batch:
        size = _leading_dim(item)
        if size is not None:
            return size
    return None
