"""Evaluators' metrics, checked where they are given (PPE calls whatever it is given, to fail
at the first batch), and the extension Evaluator's metrics of two arguments ``(batch,
outputs)`` told apart from PPE's three ``(batch, outputs, last_iteration)``. A Trainer's
evaluators are checked likewise when given. AccuracyMetric's inputs are explained too: a
missing key, an empty batch, labels and predictions that do not pair (PPE: Python's or torch's
error)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ppe_core.errors import ArgumentTypeError, MetricInputError, MetricKeyError

__all__ = [
    "MetricFn",
    "check_accuracy_inputs",
    "check_accuracy_labels",
    "check_metric",
    "check_metrics",
    "metric_result_error",
    "missing_metric_key_error",
    "not_an_evaluator_error",
    "takes_last_iteration",
]

#: A metric: ``metric(batch, outputs)`` (the engine Evaluator's, and the extension's alternative)
#: or ``metric(batch, outputs, last_iteration)`` (PPE's extension signature).
MetricFn = Callable[..., Any]


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


def metric_result_error(metric: MetricFn, values: object) -> ArgumentTypeError:
    """The error for an engine Evaluator's metric that returned ``values``, not a dict."""
    name = getattr(metric, "__qualname__", None) or type(metric).__name__
    return ArgumentTypeError(
        f"metric {name} returned {type(values).__name__} {values!r}, but a metric must return a "
        "dict of names to values (reported as val/<name>); return e.g. {'accuracy': acc}"
    )


def takes_last_iteration(metric: MetricFn) -> bool:
    """Whether ``metric`` takes PPE's third argument ``last_iteration``."""
    try:
        parameters = inspect.signature(metric).parameters.values()
    except (TypeError, ValueError):  # no signature (some builtins): assume PPE's
        return True
    kinds = [parameter.kind for parameter in parameters]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Parameter.VAR_POSITIONAL in kinds or sum(k in positional for k in kinds) >= 3


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


def not_an_evaluator_error(name: str, evaluator: object) -> ArgumentTypeError:
    """What a Trainer given ``evaluator`` (not an engine Evaluator) under ``name`` raises."""
    return ArgumentTypeError(
        f"evaluator {name!r} must be created with ppe.engine.create_evaluator, "
        f"got {type(evaluator).__name__}"
    )


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
