"""``VariableStatisticsPlot``: plots how the statistics of tensors (weights, grads) evolve.

Every call samples the mean, standard deviation and percentiles of the target tensors'
values and gradients; when the plot trigger fires, the kept samples (a fixed-size
reservoir, so memory stays bounded on long runs) are drawn into an image file. Needs
matplotlib (the ``plot`` extra); numpy and matplotlib are imported only when used.
"""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Any

import torch

from ppe_core.errors import ConfigurationError, missing_extra_error
from ppe_core.training.extension import Extension
from ppe_core.training.triggers import DueCheck, TriggerLike, get_trigger
from ppe_core.writing import WriterLike, write_file
from ppe_extensions._plot_report import matplotlib_available

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = ["Reservoir", "Statistician", "VariableStatisticsPlot"]

#: PPE's default percentiles: min, the +-1/2/3 sigma points of a normal distribution, max.
DEFAULT_PERCENTILE_SIGMAS = (0, 0.13, 2.28, 15.87, 50, 84.13, 97.72, 99.87, 100)

_COLOR = "#1f77b4"


def _tensors(targets: object) -> tuple[torch.Tensor, ...]:
    """The tensors in ``targets``: a tensor, a module's parameters, or lists of them."""
    if isinstance(targets, torch.Tensor):
        return (targets,)
    if isinstance(targets, torch.nn.Module):
        return tuple(targets.parameters())
    if isinstance(targets, (list, tuple)):
        return tuple(t for item in targets for t in _tensors(item))
    return ()


class Reservoir:
    """A uniform random sample of fixed size from a stream of equally shaped arrays.

    Args:
        size: How many samples to keep.
        data_shape: Shape of each sample.
        dtype: numpy dtype of the kept samples (float32 by default).
    """

    def __init__(self, size: int, data_shape: tuple[int, ...], dtype: Any = None) -> None:
        import numpy

        self.size = size
        self.data = numpy.zeros((size, *data_shape), dtype=dtype or numpy.float32)
        self.idxs = numpy.zeros((size,), dtype=numpy.int64)
        self.counter = 0
        self._rng = numpy.random.default_rng()

    def add(self, x: Any, idx: int | None = None) -> None:
        """Offers one sample (a tensor or array) taken at step ``idx``.

        The first ``size`` samples are kept; after that each replaces a random kept one with
        probability ``size / (count + 1)`` (reservoir sampling).
        """
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        index = self.counter if idx is None else idx
        if self.counter < self.size:
            slot: int | None = self.counter
        elif self._rng.random() < self.size / (self.counter + 1):
            slot = int(self._rng.integers(self.size))
        else:
            slot = None
        if slot is not None:
            self.data[slot] = x
            self.idxs[slot] = index
        self.counter += 1

    def get_data(self) -> tuple[Any, Any]:
        """Returns ``(idxs, data)`` of the kept samples, ordered by step."""
        import numpy

        kept = min(self.counter, self.size)
        order = numpy.argsort(self.idxs[:kept], kind="stable")
        return self.idxs[:kept][order], self.data[:kept][order]


class Statistician:
    """Computes the mean, standard deviation and percentiles of a tensor.

    Args:
        collect_mean: Compute ``'mean'``.
        collect_std: Compute ``'std'``.
        percentile_sigmas: Percentiles (0-100) to compute as ``'percentile'``; a number or a
            tuple; nothing when empty or 0-length.
    """

    def __init__(
        self,
        collect_mean: bool,
        collect_std: bool,
        percentile_sigmas: float | tuple[float, ...],
    ) -> None:
        self.collect_mean = collect_mean
        self.collect_std = collect_std
        self.percentile_sigmas = percentile_sigmas

    def __call__(
        self, x: torch.Tensor, axis: int | tuple[int, ...] | None = 0, dtype: Any = None
    ) -> dict[str, torch.Tensor]:
        """Returns the statistics of ``x`` over ``axis`` (all axes when None).

        Args:
            x: The values.
            axis: Axis or axes to reduce.
            dtype: Compute in this dtype (``x``'s when None); the results have it too.
        """
        if dtype is not None:
            x = x.to(dtype)
        dims = tuple(range(x.ndim)) if axis is None else (axis,) if isinstance(axis, int) else axis
        return self.collect(x, dims)

    def collect(self, x: torch.Tensor, axis: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """Returns the statistics of ``x`` over the dimensions ``axis``."""
        out: dict[str, torch.Tensor] = {}
        if self.collect_mean:
            out["mean"] = x.mean(dim=axis)
        if self.collect_std:
            out["std"] = x.std(dim=axis)
        sigmas = self.percentile_sigmas
        if isinstance(sigmas, (int, float)) or len(sigmas) > 0:
            import numpy

            values = numpy.percentile(x.detach().cpu().numpy(), sigmas, axis=axis)
            out["percentile"] = torch.as_tensor(values, dtype=x.dtype)
        return out


def _save_figure(target: tuple[Any, str], file_obj: IO[bytes]) -> None:
    figure, image_format = target
    figure.savefig(file_obj, format=image_format)


def _check_keys(keys: list[str]) -> None:
    if not keys:
        raise ConfigurationError(
            "VariableStatisticsPlot has nothing to plot: set report_data or report_grad"
        )


class VariableStatisticsPlot(Extension):
    """Plots the statistics of tensors' values and gradients over the iterations.

    It runs every iteration (its own trigger) and samples, for the values (``data``) and
    the gradients (``grad``) of all target tensors together, the mean, the standard
    deviation and the percentiles. When ``trigger`` fires it draws one column per kind: the
    mean with a standard-deviation band on top, the percentile bands below.

    Args:
        targets: A tensor, a module (its parameters) or a list of them.
        max_sample_size: How many sampled iterations to keep (a uniform random sample).
        report_data: Plot the values.
        report_grad: Plot the gradients.
        plot_mean: Plot the mean.
        plot_std: Plot the standard deviation (as error bars around the mean).
        percentile_sigmas: Percentiles to plot as bands (0-100); empty for none.
        trigger: When to draw and save the plot; once per epoch by default.
        filename: Image file under the output directory; ``'statistics.png'`` when None.
        figsize: ``(width, height)`` of the figure in inches; matplotlib's default when None.
        marker: Line marker, e.g. ``'o'``; none when None.
        grid: Draw a grid.
        writer: Writer to save through instead of the manager's.
        file_name: PPE's older spelling of ``filename``.

    Raises:
        ConfigurationError: No tensor in ``targets``, or nothing to plot.
        OptionalDependencyError: matplotlib is not installed.

    Example::

        manager.extend(VariableStatisticsPlot(model, trigger=(1, "epoch")))
    """

    def __init__(
        self,
        targets: Any,
        max_sample_size: int = 1000,
        report_data: bool = True,
        report_grad: bool = True,
        plot_mean: bool = True,
        plot_std: bool = True,
        percentile_sigmas: float | tuple[float, ...] = DEFAULT_PERCENTILE_SIGMAS,
        trigger: TriggerLike = (1, "epoch"),
        filename: str | os.PathLike[str] | None = None,
        figsize: tuple[float, ...] | None = None,
        marker: str | None = None,
        grid: bool = True,
        *,
        writer: WriterLike | None = None,
        file_name: str | os.PathLike[str] | None = None,
    ) -> None:
        if not self.available():
            raise missing_extra_error("VariableStatisticsPlot", "matplotlib", "plot")
        self._vars = _tensors(targets)
        if not self._vars:
            raise ConfigurationError(
                "VariableStatisticsPlot needs at least one tensor to watch; pass a tensor, a "
                f"module or a list of them, got {type(targets).__name__}"
            )
        if isinstance(percentile_sigmas, (int, float)):
            n_percentile = 1
        else:
            percentile_sigmas = tuple(percentile_sigmas)
            n_percentile = len(percentile_sigmas)
        if not (plot_mean or plot_std or n_percentile):
            raise ConfigurationError(
                "VariableStatisticsPlot has nothing to plot: set plot_mean, plot_std or "
                "percentile_sigmas"
            )
        self._keys: list[str] = [
            key for key, wanted in (("data", report_data), ("grad", report_grad)) if wanted
        ]
        _check_keys(self._keys)
        self._plot_mean = plot_mean
        self._plot_std = plot_std
        self._n_percentile = n_percentile
        self._statistician = Statistician(plot_mean, plot_std, percentile_sigmas)
        self._due = DueCheck(get_trigger(trigger))
        # A Path names the file its str form does.
        self._filename = os.fspath(filename or file_name or "statistics.png")
        self._format = self._filename.rsplit(".", 1)[-1] if "." in self._filename else "png"
        self._figsize: Any = figsize  # matplotlib types it as a pair
        self._marker = marker
        self._grid = grid
        self._writer = writer
        self._data_shape = (len(self._keys), int(plot_mean) + int(plot_std) + n_percentile)
        self._samples = Reservoir(max_sample_size, self._data_shape)

    available = staticmethod(matplotlib_available)

    def _statistics(self) -> Any:
        import numpy

        stats = numpy.zeros(self._data_shape, dtype=numpy.float32)
        for row, key in enumerate(self._keys):
            flat = [
                value.detach().flatten()
                for value in (getattr(var, key, None) for var in self._vars)
                if value is not None
            ]
            if not flat:
                continue
            collected = self._statistician(torch.cat(flat), axis=0)
            # Statistician's order: mean, std, percentiles (those asked for).
            parts = [value.reshape(-1) for value in collected.values()]
            stats[row] = torch.cat([p.float().cpu() for p in parts]).numpy()
        return stats

    def __call__(self, manager: ManagerView) -> None:
        """Samples the statistics; draws and saves the plot when the trigger fires."""
        self._samples.add(self._statistics(), idx=manager.iteration)
        if self._due(manager):
            self._plot(manager)

    def _plot(self, manager: ManagerView) -> None:
        from matplotlib.figure import Figure

        has_moments = self._plot_mean or self._plot_std
        nrows = int(has_moments) + int(self._n_percentile > 0)
        figure = Figure(figsize=self._figsize)
        axes = figure.subplots(nrows, len(self._keys), sharex=True, squeeze=False)
        idxs, data = self._samples.get_data()
        offset = int(self._plot_mean) + int(self._plot_std)
        for col, key in enumerate(self._keys):
            axes[0, col].set_title(key)
            if has_moments:  # the first row; the percentiles' is the last
                both = self._plot_mean and self._plot_std
                axes[0, col].errorbar(
                    idxs,
                    data[:, col, 0],
                    data[:, col, 1] if both else None,  # the std as error bars around the mean
                    color=_COLOR,
                    ecolor=_COLOR,
                    elinewidth=0.5,
                    label="mean, std" if both else "mean" if self._plot_mean else "std",
                    marker=self._marker,
                )
            if self._n_percentile:
                self._plot_percentiles(axes[-1, col], idxs, data[:, col, offset:])
            axes[-1, col].set_xlabel("iteration")
        for ax in axes.ravel():
            if ax.has_data():
                ax.legend()
            if self._grid:
                ax.grid()
                ax.set_axisbelow(True)
        write_file(manager, self._writer, self._filename, (figure, self._format), _save_figure)

    def _plot_percentiles(self, ax: Any, idxs: Any, values: Any) -> None:
        """Fills the band between each pair of symmetric percentiles; a middle one is a line."""
        count = values.shape[-1]
        for low in range(count // 2):
            ax.fill_between(
                idxs,
                values[:, low],
                values[:, count - 1 - low],
                alpha=0.2,
                linewidth=0,
                color=_COLOR,
                label="percentile" if low == count // 2 - 1 and count % 2 == 0 else "_nolegend_",
            )
        if count % 2:
            ax.plot(
                idxs, values[:, count // 2], color=_COLOR, label="percentile", marker=self._marker
            )

    def finalize(self, manager: ManagerView) -> None:
        """Finalizes the writer given to this extension (the manager finalizes its own)."""
        if self._writer is not None:
            self._writer.finalize()
