"""PlotReport: plots reported values against the iteration or epoch into an image file."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any

from ppe_core.errors import ConfigurationError, NoPlotDataWarning, missing_extra_error
from ppe_core.reporting import DictSummary, to_floats
from ppe_core.training.extension import Extension
from ppe_core.training.triggers import DueCheck, EveryIteration, get_trigger
from ppe_core.writing import (
    OutputSample,
    WriterLike,
    write_file,
    writes_files_in_out,
)

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["NoPlotDataWarning", "PlotReport"]

#: The x keys read from the manager; any other is a reported key, averaged like the y values.
_MANAGER_KEYS = ("iteration", "epoch", "elapsed_time")


def _save_figure(target: tuple[Any, Any, str], file_obj: IO[bytes]) -> None:
    figure, legend, image_format = target
    figure.savefig(file_obj, format=image_format, bbox_extra_artists=(legend,), bbox_inches="tight")


def matplotlib_available() -> bool:
    """Returns whether matplotlib can be imported (PlotReport's and VariableStatisticsPlot's
    ``available()``)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _check_y_keys(y_keys: tuple[str, ...]) -> None:
    if not y_keys:
        raise ConfigurationError("PlotReport needs at least one key in y_keys")


class PlotReport(Extension):
    """Plots the mean of reported values over each interval and saves the figure.

    Every iteration it adds the values of ``y_keys`` in the observation to a running summary
    (tensors stay on the device); when ``trigger`` fires it appends the means as new points,
    redraws the whole figure and saves it under the output directory through the manager's
    writer. It therefore runs every iteration, like ``LogReport``.

    Figures are drawn with ``matplotlib.figure.Figure``, without pyplot, so no GUI backend is
    needed and ``matplotlib.use`` is not required. matplotlib is an optional dependency:
    ``pip install 'ppe-core[plot]'``.

    Args:
        y_keys: Key or keys of the values to plot (one line each).
        x_key: ``'iteration'``, ``'epoch'``, ``'elapsed_time'`` or a reported key.
        trigger: When to add points and save the figure; once per epoch by default. This is
            not the extension's own trigger, which fires every iteration.
        postprocess: ``postprocess(figure, axes, summary)`` called before saving, to edit the
            figure (``summary`` is the interval's ``DictSummary``).
        filename: Image file name under the output directory; its extension selects the
            format. ``'plot.png'`` by default.
        marker: Marker of the points; ``None`` draws lines only.
        grid: Whether to draw the grid.
        file_name: PPE's former name of ``filename``.
        writer: Writer to save through instead of the manager's.

    Raises:
        OptionalDependencyError: matplotlib is not installed.
    """

    def __init__(
        self,
        y_keys: str | Iterable[str],
        x_key: str = "iteration",
        trigger: TriggerLike = (1, "epoch"),
        postprocess: Callable[[Any, Any, DictSummary], object] | None = None,
        filename: str | os.PathLike[str] | None = None,
        marker: str | None = "x",
        grid: bool = True,
        *,
        file_name: str | os.PathLike[str] | None = None,
        writer: WriterLike | None = None,
    ) -> None:
        if not self.available():
            raise missing_extra_error("PlotReport", "matplotlib", "plot")
        if filename is None:
            filename = "plot.png" if file_name is None else file_name
        filename = os.fspath(filename)  # a Path names the file its str form does
        self._y_keys = (y_keys,) if isinstance(y_keys, str) else tuple(y_keys)
        _check_y_keys(self._y_keys)
        self.trigger = EveryIteration()  # it must see every iteration's values
        self._x_key = x_key
        self._trigger = DueCheck(get_trigger(trigger))
        self._postprocess = postprocess
        self._filename = filename
        self._format = os.path.splitext(filename)[1].lstrip(".").lower() or "png"
        self._marker = marker
        self._grid = grid
        self._writer = writer
        # The x value of a reported key must be averaged over the interval like the y values.
        self._summary_keys = self._y_keys + (() if x_key in _MANAGER_KEYS else (x_key,))
        self._summary = DictSummary()
        self._data: dict[str, list[tuple[float, float]]] = {key: [] for key in self._y_keys}

    available = staticmethod(matplotlib_available)

    @property
    def data(self) -> dict[str, list[tuple[float, float]]]:
        """The plotted points: ``{y_key: [(x, y), ...]}`` (a copy)."""
        return {key: list(points) for key, points in self._data.items()}

    def __call__(self, manager: ManagerView) -> None:
        """Accumulates this iteration's values; plots and saves when the trigger fires."""
        observation = manager.observation
        self._summary.add({k: observation[k] for k in self._summary_keys if k in observation})
        if not (manager.is_before_training or self._trigger(manager)):
            return
        summary, self._summary = self._summary, DictSummary()
        means = to_floats(summary.compute_mean())
        x_key = self._x_key
        x = getattr(manager, x_key) if x_key in _MANAGER_KEYS else means.get(x_key)
        if x is not None:
            for key in self._y_keys:
                if key in means:
                    self._data[key].append((float(x), means[key]))
        self._plot(manager, summary)

    def _plot(self, manager: ManagerView, summary: DictSummary) -> None:
        from matplotlib.figure import Figure

        figure = Figure()
        axes = figure.add_subplot(111)
        axes.set_xlabel(self._x_key)
        if self._grid:
            axes.grid()
        for key in self._y_keys:
            points = self._data[key]
            if points:
                xs, ys = zip(*points, strict=True)
                axes.plot(xs, ys, marker=self._marker, label=key)
        if not axes.has_data():
            warnings.warn(
                NoPlotDataWarning(
                    f"PlotReport found no values for {list(self._y_keys)} at iteration "
                    f"{manager.iteration}; {self._filename} was not written. Check the keys."
                ),
                stacklevel=3,
            )
            return
        if self._postprocess is not None:
            self._postprocess(figure, axes, summary)
        legend = axes.legend(bbox_to_anchor=(1.05, 1), loc=2, borderaxespad=0.0)
        write_file(
            manager, self._writer, self._filename, (figure, legend, self._format), _save_figure
        )

    def output_files(self, sample: OutputSample) -> tuple[str, ...]:
        """The image file (the manager checks that no other extension writes it); none for a
        writer that writes elsewhere."""
        return (self._filename,) if writes_files_in_out(self._writer, sample) else ()

    def finalize(self, manager: ManagerView) -> None:
        """Finalizes the writer given to this extension (the manager finalizes its own)."""
        if self._writer is not None:
            self._writer.finalize()

    def state_dict(self) -> dict[str, Any]:
        """Returns the plotted points as a JSON string (PPE's layout)."""
        return {f"_plot_{self._filename}": json.dumps(self._data)}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the plotted points from :meth:`state_dict`."""
        loaded = json.loads(to_load[f"_plot_{self._filename}"])
        self._data = {
            key: [(float(x), float(y)) for x, y in loaded.get(key, [])] for key in self._y_keys
        }
