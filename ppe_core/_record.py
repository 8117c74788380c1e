"""``ppe.profiler.record`` and friends: name a code section for profilers and ProfileReport."""

from __future__ import annotations

import functools
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

import torch

from ppe_core import _tracing
from ppe_core._time_summary import get_time_summary
from ppe_core.runtime import BaseRuntime, PyTorchRuntime, device_type_of
from ppe_core.runtime._registry import active_registry

__all__ = ["record", "record_function", "record_iterable"]

_T = TypeVar("_T")


class _Notification:
    """What ``with record(...) as ntf`` gives: ``ntf.defer()`` postpones the time report to
    an explicit ``ntf.complete()`` (for work that finishes after the block)."""

    __slots__ = ()

    def defer(self) -> None:
        """Does not report the duration at the end of the block."""

    def complete(self) -> None:
        """Reports the duration up to now (after :meth:`defer`)."""


_NO_NOTIFICATION = _Notification()


class _Disabled:
    """The shared context ``record`` returns when neither timing nor tracing is on."""

    __slots__ = ()

    def __enter__(self) -> _Notification:
        return _NO_NOTIFICATION

    def __exit__(self, *exc: object) -> None:
        return None


_DISABLED = _Disabled()


class _Record(_Notification):
    """One timed section: a ``torch.profiler`` range, a tracer event and a TimeSummary entry."""

    __slots__ = ("_begin", "_deferred", "_event", "_metric", "_range", "_summary", "_tag")

    def __init__(
        self, tag: str, metric: str | None, tracer: _tracing.Tracer | None, device: Any = "cpu"
    ) -> None:
        self._tag = tag
        self._metric = metric
        self._range = _device_range(device, tag)
        self._event = None if tracer is None else tracer.add_event(tag)
        self._summary: Any = None
        self._deferred = False
        self._begin = 0.0

    def __enter__(self) -> _Notification:
        self._range.__enter__()
        if self._event is not None:
            self._event.__enter__()
        if self._metric is not None:
            self._summary = get_time_summary()
        self._begin = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = time.perf_counter()
        try:
            if self._event is not None:
                self._event.__exit__(exc_type, exc, tb)
        finally:
            self._range.__exit__(exc_type, exc, tb)
        if self._summary is not None and not self._deferred:
            self._summary.add(self._metric, end - self._begin)

    def defer(self) -> None:
        """Does not report the duration at the end of the block; call :meth:`complete`."""
        self._deferred = True

    def complete(self) -> None:
        """Reports the duration from the block's start until now."""
        if self._summary is not None:
            self._summary.add(self._metric, time.perf_counter() - self._begin)


def _device_range(device: Any, tag: str) -> AbstractContextManager[Any]:
    """The context that labels ``tag`` for ``device``'s profiler.

    A runtime registered for the device type that overrides ``BaseRuntime.trace`` labels it
    (as in PPE); otherwise, and for the generic runtimes, it is a ``torch.profiler`` range.
    """
    registry = active_registry()
    # The common spelling ("cpu") needs no parsing.
    plain = type(device) is str and ":" not in device
    device_type = device if plain else device_type_of(device)
    if device_type in registry:
        runtime_class = registry.get(device_type)
        custom = _CUSTOM_TRACE.get(runtime_class)
        if custom is None:
            owner = next(c for c in runtime_class.__mro__ if "trace" in c.__dict__)
            custom = _CUSTOM_TRACE[runtime_class] = owner not in (BaseRuntime, PyTorchRuntime)
        if custom:
            return runtime_class.trace(tag, None)
    return torch.profiler.record_function(tag)


#: Runtime class -> whether it overrides ``trace`` (weak: test classes come and go).
_CUSTOM_TRACE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _caller_tag(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    module = os.path.splitext(os.path.basename(frame.f_code.co_filename))[0]
    return f"{module}:{frame.f_lineno}:{frame.f_code.co_name}"


def _tracer_for(trace: _tracing.Tracer | bool) -> _tracing.Tracer | None:
    if isinstance(trace, _tracing.Tracer):
        return trace
    return _tracing.get_tracer() if trace else None


def record(
    tag: str | None,
    metric: str | None = None,
    use_cuda: bool = False,
    enable: bool = True,
    device: Any = "cpu",
    trace: _tracing.Tracer | bool = False,
) -> Any:
    """Times the ``with`` block as section ``tag``.

    The block becomes a ``torch.profiler.record_function`` range named ``tag`` (visible in
    ``torch.profiler`` traces) and, when ``enable`` is true, its host wall-clock duration is
    added to this process's :class:`~ppe_core.profiler.TimeSummary` under ``metric``, which
    :class:`~ppe_core.training.extensions.ProfileReport` reports. With ``trace`` the block is
    also an event of a :class:`~ppe_core.profiler.Tracer`. With ``enable=False`` and no
    ``trace`` it does nothing and costs one function call.

    Args:
        tag: Section name; ``"<module>:<line>:<function>"`` of the caller when None.
        metric: TimeSummary key; ``tag`` when None.
        use_cuda: Accepted for PPE compatibility; ppe-core measures host time only (time
            device work by synchronizing inside the block).
        enable: Add the duration to the TimeSummary.
        device: Whose runtime labels the block: a runtime registered for its device type that
            overrides ``BaseRuntime.trace`` provides the range, else ``torch.profiler`` does.
        trace: A tracer to add an event to, or True for the global tracer
            (:func:`~ppe_core.profiler.get_tracer`).

    Returns:
        A context manager; ``as ntf`` gives an object whose ``defer()`` postpones the time
        report until ``ntf.complete()``.

    Example::

        with ppe.profiler.record("forward"):
            loss = model(x)
    """
    if not enable and not trace:
        return _DISABLED
    if tag is None:
        tag = _caller_tag(1)
    metric = (tag if metric is None else metric) if enable else None
    return _Record(tag, metric, _tracer_for(trace), device)


def record_function(
    tag: str | None,
    use_cuda: bool = False,
    enable: bool = True,
    device: Any = "cpu",
    trace: _tracing.Tracer | bool = False,
) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Decorator form of :func:`record`: every call of the function is one section.

    Args:
        tag: Section name; the function's ``__name__`` when None.
        use_cuda: See :func:`record`.
        enable: See :func:`record`.
        device: See :func:`record`.
        trace: See :func:`record`.
    """

    def decorator(func: Callable[..., _T]) -> Callable[..., _T]:
        name = tag or func.__name__

        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> _T:
            with record(name, None, use_cuda, enable, device, trace):
                return func(*args, **kwargs)

        return wrapped

    return decorator


def record_iterable(
    tag: str | None,
    iter: Iterable[_T],
    divide_metric: bool = False,
    use_cuda: bool = False,
    enable: bool = True,
    device: Any = "cpu",
    trace: _tracing.Tracer | bool = False,
) -> Iterator[_T]:
    """Yields the items of ``iter``, timing the work done on item ``i`` as ``"<tag>-<i>"``.

    Args:
        tag: Section name prefix; ``"<module>:<line>:<function>"`` of the caller when None.
        iter: The iterable to walk.
        divide_metric: Report each item under its own metric ``"<tag>-<i>"`` instead of all
            under ``tag``.
        use_cuda: See :func:`record`.
        enable: See :func:`record`.
        device: See :func:`record`.
        trace: See :func:`record`.
    """
    name = _caller_tag(1) if tag is None else tag

    def generate() -> Iterator[_T]:
        for i, item in enumerate(iter):
            section = f"{name}-{i}"
            with record(
                section, section if divide_metric else name, use_cuda, enable, device, trace
            ):
                yield item

    return generate()
