"""Evaluator metrics (PPE's ``training.metrics``): per-batch values computed from outputs.

A metric is a callable ``metric(batch, outputs) -> {name: value}``; ``create_evaluator``
(and ``ppe.training.Evaluator``) reports each value as ``val/<name>`` and averages it over
the batches.

Beyond PPE (which calls whatever it is given, to fail at the first batch), an evaluator's
metrics are checked where they are given, the extension Evaluator's metrics of two arguments
told apart from PPE's three (``last_iteration``), and AccuracyMetric's inputs explained: a
missing key, an empty batch, labels and predictions that do not pair.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import torch

from ppe_core.errors import ArgumentTypeError, MetricInputError, MetricKeyError

__all__ = [
    "AccuracyMetric",
    "Batch",
    "MetricInputError",
    "MetricKeyError",
    "MetricType",
    "check_metric",
    "check_metrics",
    "takes_last_iteration",
]

#: A batch or the outputs of a model: names to tensors.
Batch: TypeAlias = Mapping[str, Any]
#: ``metric(batch, outputs) -> {name: value}``.
MetricType: TypeAlias = Callable[[Batch, Batch], Mapping[str, Any]]
#: A metric: ``metric(batch, outputs)`` (the engine Evaluator's, and the extension's alternative)
#: or ``metric(batch, outputs, last_iteration)`` (PPE's extension signature).
MetricFn = Callable[..., Any]


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


def check_metrics(
    metrics: Any, signature: str = "metric(batch, outputs) -> dict"
) -> list[MetricFn]:
    """An evaluator's ``metrics``: a list of callables (``None``: none); ``signature`` is the
    call the messages show (the engine Evaluator's by default).

    Raises:
        ArgumentTypeError: ``metrics`` is a single callable, a string, a dict or not iterable,
            or holds something not callable.
    """
    if metrics is None:
        return []
    if (
        callable(metrics)
        or isinstance(metrics, (str, Mapping))
        or not isinstance(metrics, Iterable)
    ):
        raise ArgumentTypeError(
            f"metrics must be a list of callables {signature}, got "
            f"{type(metrics).__name__}; wrap a single metric in a list: metrics=[metric]"
        )
    return [check_metric(metric, signature) for metric in metrics]


def check_metric(
    metric: object, signature: str = "metric(batch, outputs, last_iteration)"
) -> MetricFn:
    """One metric, checked to be callable (``signature``: as for :func:`check_metrics`; the
    extension Evaluator's by default)."""
    if not callable(metric):
        raise ArgumentTypeError(
            f"every metric must be a callable {signature}, got {type(metric).__name__} {metric!r}"
        )
    return metric


def takes_last_iteration(metric: MetricFn) -> bool:
    """Whether ``metric`` takes PPE's third argument ``last_iteration``."""
    try:
        parameters = inspect.signature(metric).parameters.values()
    except (TypeError, ValueError):  # no signature (some builtins): assume PPE's
        return True
    kinds = [parameter.kind for parameter in parameters]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Parameter.VAR_POSITIONAL in kinds or sum(k in positional for k in kinds) >= 3


def missing_metric_key_error(values: Any, key: str, where: str) -> MetricKeyError:
    """What AccuracyMetric raises for ``key`` missing from the batch or the outputs (``where``)
    (PPE: a bare ``KeyError``)."""
    keys = sorted(values) if isinstance(values, Mapping) else type(values).__name__
    return MetricKeyError(
        f"AccuracyMetric found no {key!r} in the {where} (it has: {keys}); pass the "
        f"{where}'s key, e.g. AccuracyMetric(label_key='t', output_key='y')"
    )


def check_accuracy_labels(label_key: str, count: int) -> None:
    """Refuses a batch of no labels (PPE: a ``ZeroDivisionError``)."""
    if count == 0:
        raise MetricInputError(
            f"AccuracyMetric got an empty batch of labels ({label_key!r}); the "
            "loader yielded a batch with no examples"
        )


def check_accuracy_inputs(
    label_key: str, output_key: str, labels: torch.Tensor, predictions: torch.Tensor
) -> None:
    """Refuses labels and predictions of other numbers of elements (PPE: ``view_as``'s
    error)."""
    if labels.numel() != predictions.numel():
        raise MetricInputError(
            f"AccuracyMetric needs one predicted label per label: {label_key!r} "
            f"has shape {tuple(labels.shape)} but {output_key!r} has "
            f"{tuple(predictions.shape)}; for class scores, report "
            "scores.argmax(dim=1) as the prediction"
        )
