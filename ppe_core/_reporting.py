"""Reporters, report scopes and running summaries of observed values (implementation).

Beyond PPE, the explained errors at the end of this module: where PPE raises a bare
``KeyError`` (unknown observer), ``IndexError`` (no current reporter), ``ZeroDivisionError``
(mean of nothing) or lets arithmetic fail on a non-number or a tensor of several elements,
ppe-core raises the same types saying what to do instead.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, SupportsFloat, TypeAlias

import torch

from ppe_core._summary_exact import EXACT_KEY, exact_entry, read_exact
from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    EmptySummaryError,
    NoCurrentReporterError,
    UnknownObserverError,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

Observation: TypeAlias = dict[str, Any]
"""A mapping from reported names (``"main/loss"``) to the reported values."""

Scalar: TypeAlias = torch.Tensor | SupportsFloat
"""A value a summary accepts: a one-element tensor or anything ``float()`` accepts."""

FloatLikeValue: TypeAlias = Scalar | float
"""A scalar or a Python float (PPE's name)."""

Value: TypeAlias = Scalar | Callable[[], float]
"""What can be reported: a scalar, or a callable evaluated when a summary reads it."""

# Tensors are buffered and reduced on their device in chunks of this many values: large enough
# that the handful of kernels per chunk is negligible per step, small enough that the buffer of
# pending one-element tensors stays bounded.
_FOLD_SIZE = 256

# Device sums are kept in at least this precision: half-precision running sums lose too much.
_MIN_SUM_DTYPE = torch.float32

# Bound once: the per-step paths below test every reported value against it.
_Tensor = torch.Tensor


class _ReporterStack(threading.local):
    """The per-thread stack of current reporters (each thread starts with an empty one)."""

    def __init__(self) -> None:
        self.reporters: list[Reporter] = []


_local = _ReporterStack()


class Reporter:
    """Collects observed values into the current observation dictionary.

    A value reported with an ``observer`` is stored under ``"<observer name>/<key>"``; the
    observer must have been registered with :meth:`add_observer` or :meth:`add_observers`
    (observers are told apart by identity, not equality).

    Reporting never synchronizes with an accelerator: a tensor is stored as it is (detached from
    the autograd graph when it requires grad), so ``report({"loss": loss})`` costs a dictionary
    write, and the value is only copied to the host when a summary computes a mean.

    Attributes:
        observation: The dictionary that reported values are written to; :meth:`scope` swaps it.
    """

    def __init__(self) -> None:
        self._observer_names: dict[int, str] = {}
        self.observation: Observation = {}
        # The last tensor detached (weakly held) and its detached view: the trainer reports the
        # model's loss after ``forward`` reported the same tensor, and ``detach`` is the most
        # expensive part of a report (~2 us), so the second report reuses the view.
        # One tuple, replaced as a whole, so a reporter shared by threads never mixes two pairs.
        self._last_detach: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None

    def __enter__(self) -> Reporter:
        """Makes this reporter the current one of this thread."""
        _local.reporters.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Restores the previously current reporter."""
        _local.reporters.pop()

    def push(self, observation: Observation) -> Observation:
        """Makes this reporter current in this thread, writing to ``observation``.

        The cheap, context-free form of :meth:`scope` for loops that open and close a scope in
        separate calls (a trainer's iteration): no object is created. Pair every call with
        :meth:`pop`, passing what this returned.

        Args:
            observation: The dictionary that values reported until :meth:`pop` go to.

        Returns:
            The observation this reporter wrote to before; hand it to :meth:`pop`.
        """
        previous = self.observation
        self.observation = observation
        _local.reporters.append(self)
        return previous

    def pop(self, previous: Observation) -> None:
        """Undoes :meth:`push`: the previous reporter becomes current again.

        Args:
            previous: What the matching :meth:`push` returned.
        """
        _local.reporters.pop()
        self.observation = previous

    def scope(self, observation: Observation) -> AbstractContextManager[Observation]:
        """Returns a context in which this reporter is current and writes to ``observation``.

        Args:
            observation: The dictionary that values reported inside the ``with`` block go to.

        Returns:
            A context manager; entering it returns ``observation``.
        """
        return _ReportScope(self, observation)

    def add_observer(self, name: str, observer: object) -> None:
        """Registers ``observer`` so values it reports are prefixed with ``name + "/"``.

        Args:
            name: Prefix for the observer's values, e.g. ``"main"``.
            observer: Any object (typically a module); identified by ``id()``.
        """
        self._observer_names[id(observer)] = name

    def add_observers(self, prefix: str, observers: Iterable[tuple[str, object]]) -> None:
        """Registers several observers named ``prefix/name``.

        Unlike PPE, which glues ``prefix`` and ``name`` together, the two are joined with a
        single ``"/"``, so ``add_observers("main", model.named_modules())`` names a submodule
        ``"main/fc"`` and the root module (whose name is ``""``) ``"main"``.

        Args:
            prefix: Common prefix, with or without a trailing ``"/"``.
            observers: ``(name, observer)`` pairs such as ``module.named_modules()``.
        """
        stem = prefix.rstrip("/")
        for name, observer in observers:
            self._observer_names[id(observer)] = f"{stem}/{name}" if stem and name else stem or name

    def report(self, values: Mapping[str, Any], observer: object | None = None) -> None:
        """Writes ``values`` into the current observation without synchronizing a device.

        Args:
            values: Names to values (tensors, Python numbers or anything else).
            observer: A registered observer whose name prefixes each key, or ``None``.

        Raises:
            UnknownObserverError: ``observer`` was never registered with this reporter.
        """
        prefix = ""
        if observer is not None:
            name = self._observer_names.get(id(observer))
            if name is None:
                raise unknown_observer(observer, len(self._observer_names))
            prefix = name + "/"
        observation = self.observation
        for key, value in values.items():
            if isinstance(value, _Tensor) and value.requires_grad:
                value = self._detach(value)
            observation[prefix + key if prefix else key] = value

    def _detach(self, value: torch.Tensor) -> torch.Tensor:
        """``value.detach()``, reusing the view when the same tensor was detached last.

        The source is held through a weak reference, so a reported tensor's autograd graph is
        never kept alive by the reporter.
        """
        last = self._last_detach
        if last is not None and last[0]() is value:
            return last[1]
        detached = value.detach()
        self._last_detach = (weakref.ref(value), detached)
        return detached


class _ReportScope:
    """:meth:`Reporter.push` for the block, :meth:`Reporter.pop` after it (class-based: cheap
    on the hot path)."""

    __slots__ = ("_observation", "_previous", "_reporter")

    def __init__(self, reporter: Reporter, observation: Observation) -> None:
        self._reporter = reporter
        self._observation = observation

    def __enter__(self) -> Observation:
        self._previous = self._reporter.push(self._observation)
        return self._observation

    def __exit__(self, *exc_info: object) -> None:
        self._reporter.pop(self._previous)


def get_current_reporter() -> Reporter:
    """Returns the reporter most recently made current in this thread.

    Raises:
        NoCurrentReporterError: No reporter is current.
    """
    reporters = _local.reporters
    if not reporters:
        raise no_current_reporter()
    return reporters[-1]


def report(values: Mapping[str, Any], observer: object | None = None) -> None:
    """Reports ``values`` to the current reporter; does nothing when none is current.

    Being a no-op outside a reporter (as in PPE) lets model code call ``report`` unconditionally,
    e.g. when the model is used for inference without a manager. Tensors are not synchronized.

    Args:
        values: Names to values.
        observer: A registered observer whose name prefixes each key, or ``None``.
    """
    reporters = _local.reporters
    if reporters:
        reporters[-1].report(values, observer)


def current_observation() -> Observation | None:
    """The observation the current reporter writes to, or ``None`` when no reporter is current.

    The Handler's automatic report reads it once per step to leave out the keys the step
    already reported itself (one dictionary lookup per output key).
    """
    reporters = _local.reporters
    return reporters[-1].observation if reporters else None


def report_scope(observation: Observation) -> AbstractContextManager[Observation]:
    """Returns a context in which the current reporter writes to ``observation``.

    Equivalent to ``get_current_reporter().scope(observation)``: the current reporter stays
    current (it is pushed again for the block).

    Raises:
        NoCurrentReporterError: No reporter is current.
    """
    return _ReportScope(get_current_reporter(), observation)


# --- Scalar arithmetic shared with PPE's public helpers --------------------------------------


def _as_tensor_like(value: Any, reference: torch.Tensor) -> torch.Tensor:
    """Returns the non-tensor ``value`` as a tensor of ``reference``'s dtype, without a
    host-device copy.

    A zero-dimensional CPU tensor combines with a tensor on any device as a scalar operand, so
    a Python or NumPy number is only moved to the device when it is a real (non-0-d) array.
    """
    tensor = torch.as_tensor(value, dtype=reference.dtype)
    return tensor if tensor.ndim == 0 else tensor.to(reference.device)


def _combine(op: Callable[[Any, Any], Scalar], left: Scalar, right: Scalar) -> Scalar:
    """``op(left, right)``, a non-tensor operand taking the tensor operand's dtype first."""
    if isinstance(left, torch.Tensor) and not isinstance(right, torch.Tensor):
        right = _as_tensor_like(right, left)
    elif isinstance(right, torch.Tensor) and not isinstance(left, torch.Tensor):
        left = _as_tensor_like(left, right)
    return op(left, right)


def divide_scalar(numerator: Scalar, denominator: Scalar) -> Scalar:
    """Returns ``numerator / denominator``; a tensor operand makes the result a tensor.

    The non-tensor operand is converted to the tensor's dtype first, as in PPE, so that e.g. a
    half-precision sum divided by an integer count stays half precision.
    """
    return _combine(operator.truediv, numerator, denominator)


def multiply_scalar(left: Scalar, right: Scalar) -> Scalar:
    """Returns ``left * right``; a tensor operand makes the result a tensor (see divide)."""
    return _combine(operator.mul, left, right)


def subtract_scalar(minuend: Scalar, subtrahend: Scalar) -> Scalar:
    """Returns ``minuend - subtrahend``; a tensor operand makes the result a tensor."""
    return _combine(operator.sub, minuend, subtrahend)


def _host_values_to(
    values: list[float], dtype: torch.dtype | None, device: torch.device
) -> torch.Tensor:
    # A blocking host-to-device copy synchronizes the stream; a non-blocking one from pageable
    # memory is staged by the driver before returning, so it is safe and does not wait.
    host = torch.tensor(values, dtype=dtype)
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


def _result_dtype(dtype: torch.dtype) -> torch.dtype:
    # PPE starts its sums at 0.0, so integer and bool values give default-dtype float means.
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _whole(n: float) -> float | int:
    # PPE stores counts as ints; keep an int where the total weight is whole.
    return int(n) if float(n).is_integer() else n


def _host_sqrt(var: Any) -> Any:
    """``sqrt(max(var, 0))`` the way PPE computes a host standard deviation (with NumPy)."""
    try:
        import numpy
    except ImportError:  # NumPy is optional for ppe-core; PPE always had it
        return math.sqrt(max(float(var), 0.0))
    return numpy.sqrt(numpy.maximum(var, 0))


_Sums: TypeAlias = tuple[Any, Any, Any, Any]
"""Accumulators ``(shift, sum w*d, sum w*d*d, total weight)`` of values ``v``, ``d = v - shift``:
a summary's on its device (the shift prevents cancellation in the variance), or its host sums
``(0, x, x2, n)``."""


def _merged(a: _Sums, b: Sequence[Any]) -> _Sums:
    """``a`` and ``b`` as one accumulator, relative to ``a``'s shift (tensors or numbers)."""
    shift, s1, s2, n = a
    b_shift, b_s1, b_s2, b_n = b
    delta = b_shift - shift
    return shift, s1 + b_s1 + b_n * delta, s2 + b_s2 + (2.0 * b_s1 + b_n * delta) * delta, n + b_n


class Summary:
    """Running weighted mean and standard deviation of a stream of scalars.

    Results have PPE's types: Python and NumPy numbers are accumulated with PPE's arithmetic
    and give a Python (or NumPy) mean; once a tensor was added, :meth:`compute_mean` and
    :meth:`make_statistics` return zero-dimensional tensors on that tensor's device, computed
    there without a host synchronization. Tensors are buffered (detached) and reduced on their
    device every few hundred values, relative to the first value seen, which keeps the standard
    deviation accurate in float32. A callable value is stored and called when the summary is
    read (PPE's deferred values). :meth:`state_dict` is the one place that copies to the host.
    """

    __slots__ = ("_deferred", "_dev", "_dtype", "_n", "_pending", "_pending_weights", "_x", "_x2")

    def __init__(self) -> None:
        self._x: Any = 0.0
        self._x2: Any = 0.0
        self._n: Any = 0
        self._deferred: list[tuple[Callable[[], Any], Any]] = []
        self._pending: list[torch.Tensor] = []
        self._pending_weights: list[Scalar] | None = None
        # The device accumulators (see _Sums); the weight is a host number until a tensor
        # weight is folded.
        self._dev: _Sums | None = None
        # The results' dtype: the promotion of the folded values' (bool, which every dtype
        # promotes over, until a value is folded).
        self._dtype = torch.bool

    def add(self, value: Value, weight: Scalar = 1) -> None:
        """Accumulates ``value`` with ``weight``; a tensor is not copied to the host.

        Args:
            value: A Python/NumPy number, a one-element tensor, or a callable returning one,
                which is called when the summary is read.
            weight: A number or one-element tensor; defaults to 1.

        Raises:
            ConfigurationError: A tensor value has more than one element.
            ArgumentTypeError: ``value`` or ``weight`` is not a number.
        """
        if callable(value):  # (tensors are not callable)
            self._deferred.append((value, weight))
            return
        if not isinstance(value, torch.Tensor):
            if isinstance(weight, torch.Tensor):
                value = _host_values_to([float(value)], None, weight.device).reshape(())
            elif not (is_host_number(value) and is_host_number(weight)):
                raise not_a_number(value, weight)
            else:
                wv: Any = weight * value  # type: ignore[operator]
                self._x += wv
                self._x2 += wv * value
                self._n += weight
                return
        if value.numel() != 1:
            raise not_a_scalar(value)
        if weight.__class__ is int and weight == 1:  # (a tensor compared with == makes a tensor)
            self.add_tensor(value)
            return
        if self._pending_weights is None:
            self._pending_weights = [1] * len(self._pending)
        self._pending_weights.append(weight)
        self._pending.append(value.detach())
        if len(self._pending) >= _FOLD_SIZE:
            self._fold()

    def add_tensor(self, value: torch.Tensor) -> None:
        """Adds a one-element tensor with weight 1: the per-step fast path of :meth:`add`.

        Nothing is checked and nothing synchronizes: the tensor is buffered (detached) and
        reduced on its device with the next few hundred values. Use :meth:`add` for anything
        that may not be a one-element tensor.

        Args:
            value: A one-element tensor (any device and dtype).
        """
        weights = self._pending_weights
        if weights is not None:
            weights.append(1)
        if value.requires_grad:  # detached only when needed: this runs per value per step
            value = value.detach()
        pending = self._pending
        pending.append(value)
        if len(pending) >= _FOLD_SIZE:
            self._fold()

    def _fold(self) -> None:
        """Reduces the pending tensors into the device accumulators (no host sync)."""
        values, weights = self._pending, self._pending_weights
        if not values:
            return
        self._pending, self._pending_weights = [], None
        device = values[0].device if self._dev is None else self._dev[0].device
        try:
            x = torch.stack(values)
        except RuntimeError:  # mixed devices or shapes (0-d and (1,)): normalise one by one
            x = torch.stack([v.reshape(()).to(device) for v in values])
        x = x.reshape(-1).to(device)
        self._dtype = torch.promote_types(self._dtype, _result_dtype(x.dtype))
        x = x.to(torch.promote_types(x.dtype, _MIN_SUM_DTYPE))
        shift, s1, s2, n = (x[0], 0.0, 0.0, 0) if self._dev is None else self._dev
        d = x - shift
        if weights is None:
            n = n + len(values)
            wd = d
        elif any(isinstance(w, torch.Tensor) for w in weights):
            w = torch.stack(
                [
                    w.detach().reshape(()).to(x.device, x.dtype)
                    if isinstance(w, torch.Tensor)
                    else _host_values_to([float(w)], x.dtype, x.device).reshape(())
                    for w in weights
                ]
            )
            n = w.sum() + n
            wd = w * d
        else:
            floats = [float(w) for w in weights]
            n = n + math.fsum(floats)
            wd = _host_values_to(floats, x.dtype, x.device) * d
        self._dev = (shift, s1 + wd.sum(), s2 + torch.dot(wd, d), n)

    def _read(self) -> None:
        """Calls the deferred values and adds their results, then folds: before any read."""
        deferred = self._deferred
        if deferred:
            self._deferred = []
            for fn, weight in deferred:
                self.add(fn(), weight)
        self._fold()

    def _lone_value(self) -> torch.Tensor | None:
        """The one tensor added (with weight 1) when it is all this summary holds, else None."""
        pending = self._pending
        if (
            len(pending) != 1
            or self._dev is not None
            or self._pending_weights is not None
            or self._deferred
            or self._n.__class__ is not int
            or self._n != 0
        ):
            return None
        return pending[0]

    def compute_mean(self) -> Scalar:
        """Returns the weighted mean, a tensor on the values' device if any value was one.

        Raises:
            EmptySummaryError: Only numbers were added and their total weight is 0.
        """
        value = self._lone_value()
        if value is None:
            return self.make_statistics()[0]
        # One tensor of weight 1 (LogReport with an entry per iteration): the mean is the
        # value, what the reduction gives too, without its dozen tensor operations. A copy,
        # so the result never aliases the reported tensor.
        if value.ndim != 0:
            value = value.reshape(())
        dtype = _result_dtype(value.dtype)
        return value.clone() if value.dtype == dtype else value.to(dtype)

    def make_statistics(self) -> tuple[Scalar, Scalar]:
        """Returns the weighted mean and (population) standard deviation.

        Both are tensors when a tensor was added; otherwise the mean is a Python/NumPy number
        and the deviation a NumPy float, as in PPE. Host numbers added beside tensors are
        merged into the device sums, relative to their shift: nothing waits for the device.

        Raises:
            EmptySummaryError: Only numbers were added and their total weight is 0.
        """
        self._read()
        n: Any = self._n
        if self._dev is None:
            # The host sums never hold tensors (those are folded on their device), so plain
            # arithmetic is PPE's; only a plain number is tested (an array's truth is ambiguous).
            if isinstance(self._n, numbers.Number) and n == 0:
                raise empty_summary()
            mean = self._x / n
            return mean, _host_sqrt(self._x2 / n - mean * mean)
        sums = self._dev
        if n != 0:
            sums = _merged(sums, (0.0, float(self._x), float(self._x2), float(n)))
        shift, s1, s2, n = sums
        mean_d = s1 / n
        var = (s2 / n - mean_d * mean_d).clamp_min(0.0)
        # The sum divided by the weight, as PPE computes it (so small cases round identically).
        mean = (s1 + n * shift) / n
        return mean.to(self._dtype), var.sqrt().to(self._dtype)

    def state_dict(self) -> dict[str, Any]:
        """Returns the sums as plain Python numbers (loadable with ``weights_only=True``).

        The keys and types are PPE's (``_x``, ``_x2`` floats, ``_n`` an int for whole weights),
        so PPE snapshots load here and ours load in PPE. Deferred values are evaluated first.
        """
        return _states({"": self})[""]

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Replaces the accumulated statistics with those of :meth:`state_dict`."""
        x, x2, n = float(to_load["_x"]), float(to_load["_x2"]), float(to_load["_n"])
        Summary.__init__(self)  # the accumulators start over
        exact = to_load.get(EXACT_KEY)
        if exact is None:
            self._x, self._x2, self._n = x, x2, _whole(n)
        else:  # the unmerged accumulators: the sums go on bit for bit
            (self._x, self._x2, self._n), self._dev, self._dtype = read_exact(exact)

    def _exact_state(self) -> dict[str, Any]:
        """The device accumulators and host sums as they are, under :data:`EXACT_KEY`, for a
        bit-exact resume (PPE readers ignore the entry); none without device accumulators."""
        if self._dev is None:
            return {}
        host_sums = [self._x, self._x2, self._n]
        return {EXACT_KEY: exact_entry(self._dev, host_sums, self._dtype)}

    def __add__(self, other: Summary) -> Summary:
        """Returns a new summary of both summaries' values (neither operand changes)."""
        if not isinstance(other, Summary):
            return NotImplemented
        result = Summary()
        result._x = self._x + other._x
        result._x2 = self._x2 + other._x2
        result._n = self._n + other._n
        result._deferred = self._deferred + other._deferred
        self._fold()
        other._fold()
        a, b = self._dev, other._dev
        if a is not None and b is not None:
            b = _merged(a, [p.to(a[0].device) if isinstance(p, _Tensor) else p for p in b])
        # Accumulators are never modified in place, so sharing the tensors is safe.
        result._dev = b or a
        result._dtype = torch.promote_types(self._dtype, other._dtype)
        return result


def _states(summaries: Mapping[str, Summary]) -> dict[str, dict[str, Any]]:
    """Each summary's :meth:`~Summary.state_dict` (deferred values evaluated, pending tensors
    folded), the device accumulators of all copied to the host in one transfer per device."""
    by_device: dict[torch.device, dict[str, torch.Tensor]] = {}
    for name, summary in summaries.items():
        summary._read()
        if summary._dev is not None:
            shift, s1, s2, n = summary._dev
            n = n if isinstance(n, _Tensor) else torch.zeros_like(shift)  # host weights: on host
            by_device.setdefault(shift.device, {})[name] = torch.stack([shift, s1, s2, n])
    host: dict[str, list[float]] = {}
    for stats_of in by_device.values():
        # torch.stack promotes the dtypes; tolist gives plain floats.
        host.update(zip(stats_of, torch.stack(list(stats_of.values())).tolist(), strict=True))
    states: dict[str, dict[str, Any]] = {}
    for name, summary in summaries.items():
        sums = (0.0, float(summary._x), float(summary._x2), float(summary._n))
        if summary._dev is not None:
            shift, s1, s2, n = host[name]
            dn = summary._dev[3]
            sums = _merged(sums, (shift, s1, s2, n if isinstance(dn, _Tensor) else dn))
        states[name] = {"_x": sums[1], "_x2": sums[2], "_n": _whole(sums[3])}
        states[name].update(summary._exact_state())
    return states


def _is_scalar(value: object) -> bool:
    cls = value.__class__
    if cls is float or cls is int:
        return True
    # Zero-dimensional tensors and arrays and NumPy scalars, tested before the (slower) ABC.
    if getattr(value, "ndim", -1) == 0 and hasattr(value, "__float__"):
        return True
    return isinstance(value, numbers.Real)


def to_floats(values: Mapping[str, Any]) -> dict[str, Any]:
    """Returns ``values`` with every one-element tensor and NumPy number as a Python float.

    Tensors are copied to the host with one transfer per device, not one per entry, so
    ``to_floats(summary.compute_mean())`` is the cheap way to log a :class:`DictSummary`.
    Other entries are returned unchanged.

    Args:
        values: E.g. the result of :meth:`DictSummary.compute_mean`.
    """
    result = dict(values)
    by_device: dict[torch.device, list[str]] = {}
    for key, value in result.items():
        if isinstance(value, torch.Tensor):
            if value.numel() == 1:
                by_device.setdefault(value.device, []).append(key)
        elif value.__class__ is not float and _is_scalar(value):
            result[key] = float(value)
    for keys in by_device.values():
        if len(keys) == 1:  # one copy to the host either way: no stack (a third of the cost)
            tensor = result[keys[0]].detach()
            if not tensor.is_floating_point():  # floats widen exactly; others as below
                tensor = tensor.to(torch.promote_types(tensor.dtype, _MIN_SUM_DTYPE))
            result[keys[0]] = float(tensor.item())
            continue
        tensors = [result[key].detach().reshape(()) for key in keys]
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors), _MIN_SUM_DTYPE)
        result.update(zip(keys, torch.stack([t.to(dtype) for t in tensors]).tolist(), strict=True))
    return result


class DictSummary:
    """Running statistics for every scalar entry of a stream of dictionaries.

    Only scalars (Python/NumPy numbers, zero-dimensional tensors or arrays) and callables
    (deferred values, called when the summary is read) are summarised; other entries (strings,
    images, ...) are skipped silently. A ``(value, weight)`` tuple adds ``value`` with that
    weight. Results have PPE's types (see :class:`Summary`): a tensor entry's mean stays a
    tensor on its device; pass the result to :func:`to_floats` for Python floats.
    """

    __slots__ = ("_summaries",)

    def __init__(self) -> None:
        # A key's Summary is made when the key is first added.
        self._summaries: dict[str, Summary] = {}

    def add(self, d: Mapping[str, Any]) -> None:
        """Accumulates every scalar (or callable) entry of ``d``.

        Raises:
            ConfigurationError: A ``(value, weight)`` tuple is malformed or its weight is not
                a scalar (a ``ValueError``, as in PPE).
        """
        summaries = self._summaries
        for key, entry in d.items():
            if isinstance(entry, _Tensor):  # the per-step case
                if entry.ndim == 0:
                    # get, then create: a defaultdict's __missing__ costs more per entry.
                    summary = summaries.get(key)
                    if summary is None:
                        summary = summaries[key] = Summary()
                    summary.add_tensor(entry)
                continue
            value = entry
            weight: Any = 1
            if isinstance(entry, tuple):
                if len(entry) != 2 or not _is_scalar(entry[1]):
                    raise malformed_weighted_entry(key, entry)
                value, weight = entry
            if callable(value) or _is_scalar(value):
                summary = summaries.get(key)
                if summary is None:
                    summary = summaries[key] = Summary()
                summary.add(value, weight)

    def compute_mean(self) -> dict[str, Scalar]:
        """Returns the mean of every entry (tensors for tensor entries, without a sync)."""
        return {name: summary.compute_mean() for name, summary in self._summaries.items()}

    def compute_mean_floats(self) -> dict[str, Any]:
        """Returns ``to_floats(self.compute_mean())``: the means as Python floats.

        Where every entry holds one CPU tensor of weight 1 (LogReport with an entry per
        iteration), each mean is that value read directly (``item``), without the copy and
        the intermediate dict ``compute_mean`` and :func:`to_floats` make; the value is the
        same. Otherwise (several values, weights, host numbers, another device, where one
        batched copy per device beats a read per entry) it is ``to_floats(compute_mean())``.
        """
        # A plain loop: the entry of a per-iteration LogReport runs it (a comprehension, a
        # None search and a zip cost twice as much).
        result: dict[str, Any] = {}
        for name, summary in self._summaries.items():
            value = summary._lone_value()
            if value is None or not value.is_cpu:
                return to_floats(self.compute_mean())
            if not value.is_floating_point():  # compute_mean's dtype, then to_floats' read
                value = value.to(_result_dtype(value.dtype))
            result[name] = value.item()  # a float already: no float() call per entry
        return result

    def make_statistics(self) -> dict[str, Scalar]:
        """Returns ``{key: mean, key + ".std": std}`` for every entry (PPE's types)."""
        stats: dict[str, Scalar] = {}
        for name, summary in self._summaries.items():
            stats[name], stats[name + ".std"] = summary.make_statistics()
        return stats

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Returns ``{key: Summary.state_dict()}`` of plain numbers (PPE's layout).

        All entries on one device are copied to the host together, in one transfer.
        """
        return _states(self._summaries)

    def load_state_dict(self, to_load: Mapping[str, Mapping[str, Any]]) -> None:
        """Replaces all entries with those of :meth:`state_dict`."""
        self._summaries.clear()
        for name, state in to_load.items():
            summary = self._summaries[name] = Summary()
            summary.load_state_dict(state)

    def __add__(self, other: DictSummary) -> DictSummary:
        """Returns a new summary with both summaries' entries, merging shared keys."""
        if not isinstance(other, DictSummary):
            return NotImplemented
        result = DictSummary()
        mine, theirs = self._summaries, other._summaries
        for key in sorted({*mine, *theirs}):
            result._summaries[key] = mine.get(key, Summary()) + theirs.get(key, Summary())
        return result


# Explained errors: the conditions are tested where they occur (most on per-step paths);
# these build the errors, out of the way of the code that reads them.


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
