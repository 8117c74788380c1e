"""Reporters, report scopes and running summaries of observed values (implementation)."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, SupportsFloat, TypeAlias

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError, PPEError, RegistryLookupError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from types import TracebackType

__all__ = [
    "DictSummary",
    "EmptySummaryError",
    "NoCurrentReporterError",
    "Observation",
    "Reporter",
    "Scalar",
    "Summary",
    "UnknownObserverError",
    "get_current_reporter",
    "report",
    "report_scope",
]

Observation: TypeAlias = dict[str, Any]
"""A mapping from reported names (``"main/loss"``) to the reported values."""

Scalar: TypeAlias = torch.Tensor | SupportsFloat
"""A value a summary accepts: a one-element tensor or anything ``float()`` accepts."""

# Tensors are buffered and reduced on their device in chunks of this many values: large enough
# that the handful of kernels per chunk is negligible per step, small enough that the buffer of
# pending one-element tensors stays bounded.
_FOLD_SIZE = 256

# Device sums are kept in at least this precision: half-precision running sums lose too much.
_MIN_SUM_DTYPE = torch.float32


class NoCurrentReporterError(PPEError, IndexError):
    """An operation needed the current reporter but no :class:`Reporter` is active.

    Subclasses ``IndexError`` because that is what PPE raises in the same situation.
    """


class UnknownObserverError(RegistryLookupError):
    """A value was reported with an observer that was never registered with the reporter."""


class EmptySummaryError(PPEError, ZeroDivisionError):
    """A mean was requested from a summary that has accumulated no weight yet."""


class _ReporterStack(threading.local):
    """The per-thread stack of current reporters (each thread starts with an empty one)."""

    def __init__(self) -> None:
        self.reporters: list[Reporter] = []


_local = _ReporterStack()


def _join_observer_name(prefix: str, name: str) -> str:
    # PPE concatenates without a separator ("main" + "fc" -> "mainfc"); we insert exactly one "/".
    if not name:
        return prefix.rstrip("/")
    if not prefix or prefix.endswith("/"):
        return prefix + name
    return f"{prefix}/{name}"


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

    def __enter__(self) -> Reporter:
        """Makes this reporter the current one of this thread."""
        _local.reporters.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Restores the previously current reporter."""
        _local.reporters.pop()

    def scope(self, observation: Observation) -> AbstractContextManager[Observation]:
        """Returns a context in which this reporter is current and writes to ``observation``.

        Args:
            observation: The dictionary that values reported inside the ``with`` block go to.

        Returns:
            A context manager; entering it returns ``observation``.
        """
        return _ReportScope(self, observation, True)

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
        names = self._observer_names
        for name, observer in observers:
            names[id(observer)] = _join_observer_name(prefix, name)

    def report(self, values: Mapping[str, Any], observer: object | None = None) -> None:
        """Writes ``values`` into the current observation without synchronizing a device.

        Args:
            values: Names to values (tensors, Python numbers or anything else).
            observer: A registered observer whose name prefixes each key, or ``None``.

        Raises:
            UnknownObserverError: ``observer`` was never registered with this reporter.
        """
        observation = self.observation
        if observer is None:
            for key, value in values.items():
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    value = value.detach()
                observation[key] = value
            return
        name = self._observer_names.get(id(observer))
        if name is None:
            raise UnknownObserverError(
                f"{type(observer).__name__} object at {id(observer):#x} is not registered with "
                f"this Reporter ({len(self._observer_names)} observers are); register it first "
                "with reporter.add_observer(name, observer)"
            )
        prefix = name + "/"
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.requires_grad:
                value = value.detach()
            observation[prefix + key] = value


class _ReportScope:
    """Swaps a reporter's observation for the block (class-based: cheap on the hot path)."""

    __slots__ = ("_make_current", "_observation", "_previous", "_reporter")

    def __init__(self, reporter: Reporter, observation: Observation, make_current: bool) -> None:
        self._reporter = reporter
        self._observation = observation
        self._make_current = make_current
        self._previous: Observation = observation

    def __enter__(self) -> Observation:
        reporter = self._reporter
        self._previous = reporter.observation
        reporter.observation = self._observation
        if self._make_current:
            _local.reporters.append(reporter)
        return self._observation

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._make_current:
            _local.reporters.pop()
        self._reporter.observation = self._previous


def get_current_reporter() -> Reporter:
    """Returns the reporter most recently made current in this thread.

    Raises:
        NoCurrentReporterError: No reporter is current.
    """
    reporters = _local.reporters
    if not reporters:
        raise NoCurrentReporterError(
            "no Reporter is current in this thread; enter one first with `with reporter:` or "
            "`with reporter.scope(observation):`"
        )
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


def report_scope(observation: Observation) -> AbstractContextManager[Observation]:
    """Returns a context in which the current reporter writes to ``observation``.

    Equivalent to ``get_current_reporter().scope(observation)`` without pushing the reporter again.

    Raises:
        NoCurrentReporterError: No reporter is current.
    """
    return _ReportScope(get_current_reporter(), observation, False)


def _host_values_to(
    values: list[float], dtype: torch.dtype | None, device: torch.device
) -> torch.Tensor:
    # A blocking host-to-device copy synchronizes the stream; a non-blocking one from pageable
    # memory is staged by the driver before returning, so it is safe and does not wait.
    host = torch.tensor(values, dtype=dtype)
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


def _is_one(weight: object) -> bool:
    # Class check first: comparing a tensor with == would build another tensor.
    return weight.__class__ is int and weight == 1


class Summary:
    """Running weighted mean and standard deviation of a stream of scalars.

    Python numbers are accumulated on the host. Tensors stay on their device: they are buffered
    (detached) and reduced there every few hundred values, with no host synchronization; the
    single device-to-host copy happens in :meth:`compute_mean`, :meth:`make_statistics` or
    :meth:`state_dict`. Device sums are taken relative to the first value seen, which keeps the
    standard deviation accurate in float32.
    """

    __slots__ = (
        "_dev_n",
        "_dev_n_tensor",
        "_dev_x",
        "_dev_x2",
        "_n",
        "_pending",
        "_pending_weights",
        "_shift",
        "_x",
        "_x2",
    )

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._x = 0.0
        self._x2 = 0.0
        self._n = 0.0
        self._pending: list[torch.Tensor] = []
        self._pending_weights: list[Scalar] | None = None
        self._shift: torch.Tensor | None = None
        self._dev_x: torch.Tensor | None = None
        self._dev_x2: torch.Tensor | None = None
        self._dev_n = 0.0
        self._dev_n_tensor: torch.Tensor | None = None

    def add(self, value: Scalar, weight: Scalar = 1) -> None:
        """Accumulates ``value`` with ``weight``; a tensor is not copied to the host.

        Args:
            value: A Python/NumPy number or a one-element tensor.
            weight: A number or one-element tensor; defaults to 1.

        Raises:
            ConfigurationError: A tensor value has more than one element.
            ArgumentTypeError: ``value`` or ``weight`` is not a number.
        """
        if isinstance(value, torch.Tensor) or isinstance(weight, torch.Tensor):
            self._add_tensor(value, weight)
            return
        try:
            v = float(value)
            w = float(weight)
        except (TypeError, ValueError):
            raise ArgumentTypeError(
                f"Summary.add() takes a number or a one-element tensor as value and weight, got "
                f"{type(value).__name__} {value!r} (weight {weight!r}); add numbers, e.g. "
                "summary.add(loss) or summary.add(accuracy, weight=batch_size)"
            ) from None
        self._x += w * v
        self._x2 += w * v * v
        self._n += w

    def _add_tensor(self, value: Scalar, weight: Scalar) -> None:
        if not isinstance(value, torch.Tensor):
            assert isinstance(weight, torch.Tensor)
            value = _host_values_to([float(value)], None, weight.device).reshape(())
        if value.numel() != 1:
            raise ConfigurationError(
                f"Summary.add() takes a scalar, got a tensor of shape {tuple(value.shape)}; "
                "reduce it first, e.g. report({'loss': loss.mean()})"
            )
        if _is_one(weight):
            self._push(value)
            return
        if self._pending_weights is None:
            self._pending_weights = [1] * len(self._pending)
        self._pending_weights.append(weight)
        self._push_value(value)

    def _push(self, value: torch.Tensor) -> None:
        """Buffers a one-element tensor of weight 1 (the per-step path: no checks, no sync)."""
        weights = self._pending_weights
        if weights is not None:
            weights.append(1)
        self._push_value(value)

    def _push_value(self, value: torch.Tensor) -> None:
        if value.requires_grad:
            value = value.detach()
        pending = self._pending
        pending.append(value)
        if len(pending) >= _FOLD_SIZE:
            self._fold()

    def _fold(self) -> None:
        """Reduces the pending tensors into the device accumulators (no host sync)."""
        values = self._pending
        if not values:
            return
        weights = self._pending_weights
        self._pending = []
        self._pending_weights = None
        device = values[0].device if self._shift is None else self._shift.device
        try:
            x = torch.stack(values)
        except RuntimeError:  # mixed devices or shapes (0-d and (1,)): normalise one by one
            x = torch.stack([v.reshape(()).to(device) for v in values])
        x = x.reshape(-1)
        if x.device != device:
            x = x.to(device)
        dtype = torch.promote_types(x.dtype, _MIN_SUM_DTYPE)
        if x.dtype != dtype:
            x = x.to(dtype)
        if self._shift is None:
            self._shift = x[0]
        d = x - self._shift
        if weights is None:
            self._dev_n += len(values)
            s1 = d.sum()
            s2 = torch.dot(d, d)
        else:
            w = self._weights_tensor(weights, x)
            wd = w * d
            s1 = wd.sum()
            s2 = torch.dot(wd, d)
        self._dev_x = s1 if self._dev_x is None else self._dev_x + s1
        self._dev_x2 = s2 if self._dev_x2 is None else self._dev_x2 + s2

    def _weights_tensor(self, weights: list[Scalar], x: torch.Tensor) -> torch.Tensor:
        if not any(isinstance(w, torch.Tensor) for w in weights):
            floats = [float(w) for w in weights]
            self._dev_n += math.fsum(floats)
            return _host_values_to(floats, x.dtype, x.device)
        w = torch.stack(
            [
                w.detach().reshape(()).to(x.device, x.dtype)
                if isinstance(w, torch.Tensor)
                else _host_values_to([float(w)], x.dtype, x.device).reshape(())
                for w in weights
            ]
        )
        total = w.sum()
        self._dev_n_tensor = total if self._dev_n_tensor is None else self._dev_n_tensor + total
        return w

    def _take_device_stats(self) -> tuple[torch.Tensor, float] | None:
        """Folds pending tensors and hands the device accumulators over, resetting them.

        Returns:
            ``None`` when nothing is on a device; otherwise a 3- or 4-element device tensor
            ``[shift, sum w*d, sum w*d*d (, sum of tensor weights)]`` and the host-known weight.
        """
        self._fold()
        if self._dev_x is None or self._dev_x2 is None or self._shift is None:
            return None
        parts = [self._shift, self._dev_x, self._dev_x2]
        if self._dev_n_tensor is not None:
            parts.append(self._dev_n_tensor.to(self._shift.device))
        host_n = self._dev_n
        self._shift = self._dev_x = self._dev_x2 = self._dev_n_tensor = None
        self._dev_n = 0.0
        return torch.stack([p.to(parts[0].dtype) for p in parts]), host_n

    def _absorb(self, stats: list[float], host_n: float) -> None:
        shift, s1, s2 = stats[0], stats[1], stats[2]
        n = host_n + (stats[3] if len(stats) > 3 else 0.0)
        self._x += n * shift + s1
        self._x2 += s2 + 2.0 * shift * s1 + n * shift * shift
        self._n += n

    def _sync(self) -> None:
        taken = self._take_device_stats()
        if taken is not None:
            self._absorb(taken[0].tolist(), taken[1])

    def _mean(self) -> float:
        if self._n == 0:
            raise EmptySummaryError(
                "the summary is empty (total weight 0); add() values before computing a mean"
            )
        return self._x / self._n

    def compute_mean(self) -> float:
        """Returns the weighted mean as a float (the one point where tensors reach the host).

        Raises:
            EmptySummaryError: Nothing with non-zero weight was added.
        """
        self._sync()
        return self._mean()

    def make_statistics(self) -> tuple[float, float]:
        """Returns the weighted mean and (population) standard deviation as floats.

        Raises:
            EmptySummaryError: Nothing with non-zero weight was added.
        """
        self._sync()
        mean = self._mean()
        var = self._x2 / self._n - mean * mean
        return mean, math.sqrt(var) if var > 0.0 else 0.0

    def state_dict(self) -> dict[str, float]:
        """Returns the sums as plain floats (loadable with ``torch.load(weights_only=True)``).

        The keys (``_x``, ``_x2``, ``_n``) are PPE's, so PPE snapshots load too.
        """
        self._sync()
        return {"_x": self._x, "_x2": self._x2, "_n": self._n}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Replaces the accumulated statistics with those of :meth:`state_dict`."""
        self._reset()
        self._x = float(to_load["_x"])
        self._x2 = float(to_load["_x2"])
        self._n = float(to_load["_n"])


def _is_scalar(value: object) -> bool:
    cls = value.__class__
    if cls is float or cls is int:
        return True
    if isinstance(value, torch.Tensor):
        return value.ndim == 0
    if isinstance(value, numbers.Real):
        return True
    return getattr(value, "ndim", -1) == 0 and hasattr(value, "__float__")


class DictSummary:
    """Running statistics for every scalar entry of a stream of dictionaries.

    Only scalars (Python/NumPy numbers, zero-dimensional tensors or arrays) are summarised; other
    entries (strings, images, ...) are skipped silently, as in PPE. A ``(value, weight)`` tuple
    adds ``value`` with that weight. Tensors are kept on their device until a mean is computed,
    and then all entries are copied to the host with one transfer per device.
    """

    __slots__ = ("_summaries",)

    def __init__(self) -> None:
        self._summaries: dict[str, Summary] = {}

    def add(self, d: Mapping[str, Any]) -> None:
        """Accumulates every scalar entry of ``d``.

        Raises:
            ConfigurationError: A ``(value, weight)`` tuple is malformed or its weight is not
                a scalar.
        """
        summaries = self._summaries
        for key, entry in d.items():
            if isinstance(entry, torch.Tensor):  # the per-step case, kept short
                if entry.ndim == 0:
                    summary = summaries.get(key)
                    if summary is None:
                        summary = summaries[key] = Summary()
                    summary._push(entry)
                continue
            value = entry
            weight: Any = 1
            if isinstance(entry, tuple):
                if len(entry) != 2 or not _is_scalar(entry[1]):
                    raise ConfigurationError(
                        f"DictSummary entry {key!r} is a tuple, which means (value, weight), "
                        f"but got {entry!r}; pass a scalar or a (value, scalar weight) pair"
                    )
                value, weight = entry
            if not _is_scalar(value):
                continue
            summary = summaries.get(key)
            if summary is None:
                summary = summaries[key] = Summary()
            summary.add(value, weight)

    def _sync(self) -> None:
        # One device-to-host copy per device for all entries, instead of one per entry.
        by_device: dict[torch.device, list[tuple[Summary, torch.Tensor, float]]] = {}
        for summary in self._summaries.values():
            taken = summary._take_device_stats()
            if taken is not None:
                by_device.setdefault(taken[0].device, []).append((summary, *taken))
        for items in by_device.values():
            dtype = items[0][1].dtype
            for _, stats, _ in items[1:]:
                dtype = torch.promote_types(dtype, stats.dtype)
            flat = torch.cat([stats.to(dtype) for _, stats, _ in items]).tolist()
            offset = 0
            for summary, stats, host_n in items:
                size = stats.numel()
                summary._absorb(flat[offset : offset + size], host_n)
                offset += size

    def compute_mean(self) -> dict[str, float]:
        """Returns the mean of every entry as floats."""
        self._sync()
        return {name: summary.compute_mean() for name, summary in self._summaries.items()}

    def make_statistics(self) -> dict[str, float]:
        """Returns ``{key: mean, key + ".std": std}`` for every entry, as floats."""
        self._sync()
        stats: dict[str, float] = {}
        for name, summary in self._summaries.items():
            mean, std = summary.make_statistics()
            stats[name] = mean
            stats[name + ".std"] = std
        return stats

    def state_dict(self) -> dict[str, dict[str, float]]:
        """Returns ``{key: Summary.state_dict()}`` of plain floats (PPE's layout)."""
        self._sync()
        return {name: summary.state_dict() for name, summary in self._summaries.items()}

    def load_state_dict(self, to_load: Mapping[str, Mapping[str, Any]]) -> None:
        """Replaces all entries with those of :meth:`state_dict`."""
        self._summaries.clear()
        for name, state in to_load.items():
            summary = self._summaries[name] = Summary()
            summary.load_state_dict(state)
