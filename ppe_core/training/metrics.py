"""Evaluator metrics (PPE's ``training.metrics``): per-batch values computed from outputs.

A metric is a callable ``metric(batch, outputs) -> {name: value}``; ``create_evaluator``
(and ``ppe.training.Evaluator``) reports each value as ``val/<name>`` and averages it over
the batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import torch

from ppe_core.errors import MetricInputError, MetricKeyError
from ppe_core.training._metric_checks import (
    check_accuracy_inputs,
    check_accuracy_labels,
    missing_metric_key_error,
)

__all__ = ["AccuracyMetric", "Batch", "MetricInputError", "MetricKeyError", "MetricType"]

#: A batch or the outputs of a model: names to tensors.
Batch: TypeAlias = Mapping[str, Any]
#: ``metric(batch, outputs) -> {name: value}``.
MetricType: TypeAlias = Callable[[Batch, Batch], Mapping[str, Any]]


def _lookup(values: Any, key: str, where: str) -> torch.Tensor:
    try:
        found = values[key]
    except (KeyError, TypeError, IndexError):
        raise missing_metric_key_error(values, key, where) from None
    return torch.as_tensor(found)  # a tensor as it is


class AccuracyMetric:
    """The fraction of predictions equal to the labels, reported as ``accuracy``.

    ``outputs[output_key]`` holds predicted labels (take ``argmax`` in the model or
    ``eval_func`` for scores); predictions beyond the number of labels are ignored, as
    happens when the last batch was padded. The value is a zero-dimensional tensor on the
    predictions' device, so evaluation does not synchronise per batch; the evaluator's mean
    is a float.

    Args:
        label_key: Key of the labels in the batch.
        output_key: Key of the predictions in the outputs.

    Raises:
        MetricKeyError: A key is missing (when called).
        MetricInputError: The batch holds no labels, or labels and predictions do not
            have the same number of elements (when called).
    """

    def __init__(self, label_key: str, output_key: str) -> None:
        self.label_key = label_key
        self.output_key = output_key

    def __call__(self, batch: Batch, out: Batch) -> dict[str, Any]:
        """Returns ``{'accuracy': correct / len(labels)}`` for one batch."""
        with torch.no_grad():
            labels = _lookup(batch, self.label_key, "batch")
            count = labels.shape[0] if labels.ndim else 1
            check_accuracy_labels(self.label_key, count)
            predictions = _lookup(out, self.output_key, "outputs")[:count]
            check_accuracy_inputs(self.label_key, self.output_key, labels, predictions)
            labels = labels.to(predictions.device)  # itself when already there
            correct = (labels.view_as(predictions) == predictions).sum()
            return {"accuracy": correct / count}
