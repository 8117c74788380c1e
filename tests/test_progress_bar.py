"""Tests of ProgressBar: plain lines off-terminal, a tqdm bar on a terminal, update schedule."""

from __future__ import annotations

import io
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import tqdm
from helpers import linear_manager
from ppe_extensions._log_report import LogReport
from ppe_extensions._print_report import PrintReport
from ppe_extensions._progress_bar import ProgressBar

from ppe_core.errors import ConfigurationError
from ppe_core.reporting import report
from ppe_core.training.triggers import TriggerLike

ITERS_PER_EPOCH = 4
PLAIN_LINE = re.compile(
    r"^\d+ iter, \d+ epoch / \d+ (epochs|iterations) \| "
    r"(\d+)/(\d+) iters \(\d+\.\d\d%\), epoch \d+\.\d\d/[\d.]+, ([\d.e+inf]+|\?) iters/sec, "
    r"ETA (\d+:\d\d:\d\d|\?)$"
)


class _Terminal(io.StringIO):
    """An in-memory stream that says it is a terminal, as a console would."""

    def isatty(self) -> bool:
        return True


def _manager(
    out: Path, extensions: list[Any], max_epochs: int = 3, stop_trigger: TriggerLike = None
) -> Any:
    return linear_manager(
        out,
        extensions,
        max_epochs=max_epochs,
        iters_per_epoch=ITERS_PER_EPOCH,
        stop_trigger=stop_trigger,
    )


def _train(manager: Any, iterations: int | None = None) -> None:
    model = manager.models["main"]
    x, t = torch.randn(8, 4), torch.randn(8, 1)
    done = 0
    while not manager.stop_trigger and (iterations is None or done < iterations):
        with manager.run_iteration(step_optimizers=["main"]):
            loss = F.mse_loss(model(x), t)
            loss.backward()  # type: ignore[no-untyped-call]
            report({"train/loss": loss})
        done += 1


def test_plain_lines_when_not_a_terminal(tmp_path: Path) -> None:
    out = io.StringIO()
    _train(_manager(tmp_path, [ProgressBar(out=out, min_interval=0)]))
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    # A 12-iteration run updates every iteration (PPE's interval of 100 would print nothing).
    assert len(lines) == 12
    assert all(PLAIN_LINE.match(line) for line in lines), lines
    assert lines[-1].startswith(
        "12 iter, 3 epoch / 3 epochs | 12/12 iters (100.00%), epoch 3.00/3, "
    )
    assert lines[-1].endswith("ETA 0:00:00")


def test_update_interval_is_an_upper_bound_for_short_runs(tmp_path: Path) -> None:
    out = io.StringIO()
    bar = ProgressBar(out=out, min_interval=0)  # update_interval=100; 1000 iters -> every 10
    _train(_manager(tmp_path, [bar], stop_trigger=(1000, "iteration")))
    lines = out.getvalue().splitlines()
    assert [int(PLAIN_LINE.match(line).group(2)) for line in lines] == list(  # type: ignore[union-attr]
        range(10, 1001, 10)
    )


def test_long_runs_update_every_update_interval(tmp_path: Path) -> None:
    class CountingProgressBar(ProgressBar):
        calls = 0

        def __call__(self, manager: Any) -> None:
            CountingProgressBar.calls += 1
            super().__call__(manager)

    out = io.StringIO()
    bar = CountingProgressBar(
        training_length=(10_000, "iteration"), update_interval=50, out=out, min_interval=0
    )
    _train(_manager(tmp_path, [bar], stop_trigger=(200, "iteration")))
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[1].split()[0] for line in lines] == [
        "50/10000",
        "100/10000",
        "150/10000",
        "200/10000",
    ]
    assert CountingProgressBar.calls == 4  # the manager skips the iterations in between


def test_unknown_length_shows_counts_and_the_final_state(tmp_path: Path) -> None:
    out = io.StringIO()
    stop = _manager(tmp_path, [ProgressBar(out=out)], stop_trigger=lambda m: m.iteration >= 6)
    _train(stop)
    (line,) = out.getvalue().splitlines()  # interval 100 not reached: only the final state
    assert re.match(r"^6 iter, 1 epoch \| epoch 1\.50, [\d.]+ iters/sec$", line)


def test_terminal_gets_a_tqdm_bar_that_is_closed_at_the_end(tmp_path: Path) -> None:
    out = _Terminal()
    extensions = [LogReport(), PrintReport(out=out), ProgressBar(out=out)]
    _train(_manager(tmp_path, extensions))
    text = out.getvalue()
    assert "\r" in text
    assert "100%|" in text and "| 12/12 iters" in text and "it/s" in text
    assert "epoch 3.00/3" in text
    # PrintReport's rows reach the terminal intact between bar redraws.
    assert "epoch       train/loss  elapsed_time\n" in text
    assert re.search(r"[\r\n]3 {11}\S+ +\S+ +\n", text)  # after the bar was cleared
    assert not [bar for bar in getattr(tqdm.tqdm, "_instances", ()) if bar.fp == out]


def test_resumed_run_starts_the_bar_at_the_loaded_iteration(tmp_path: Path) -> None:
    first = _manager(tmp_path, [ProgressBar(out=io.StringIO())])
    _train(first, iterations=6)
    torch.save(first.state_dict(), tmp_path / "snapshot")

    out = io.StringIO()
    resumed = _manager(tmp_path, [ProgressBar(out=out, min_interval=0)])
    resumed.load_state_dict(torch.load(tmp_path / "snapshot", weights_only=True))
    _train(resumed)
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[1].split()[0] for line in lines] == [f"{i}/12" for i in range(7, 13)]


def _autoloading_run(tmp_path: Path, bar: ProgressBar) -> Any:
    """A run resumed by an autoloading snapshot, which initializes after the bar (a lower
    priority), so the bar first sees iteration 0 and then the loaded one."""
    from ppe_core.training.extensions import snapshot

    first = _manager(
        tmp_path, [ProgressBar(out=io.StringIO()), snapshot(filename="snap_{.iteration}")]
    )
    _train(first, iterations=6)  # saved at the end of epoch 1: iteration 4
    resumed = _manager(tmp_path, [bar, snapshot(filename="snap_{.iteration}", autoload=True)])
    _train(resumed)
    return resumed


def test_the_rate_after_an_autoloaded_resume_counts_only_the_resumed_iterations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ppe_extensions import _progress_bar

    monkeypatch.setattr(_progress_bar, "time", _Clock())
    out = io.StringIO()
    _autoloading_run(tmp_path, ProgressBar(out=out, min_interval=0, update_interval=1))
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[1].split()[0] for line in lines] == [f"{i}/12" for i in range(5, 13)]
    speeds = [line.split(", ")[-2].removesuffix(" iters/sec") for line in lines]
    # The clock says at most 0.5 iters/sec (two readings of 1 s per one-iteration update);
    # the first update after the resume has no measured span yet. Counted from the iteration
    # the bar started at (0), the first line said 2.5 and the next ones more than 0.5.
    assert speeds[0] == "?"
    assert all(0 < float(speed) <= 0.5 for speed in speeds[1:]), speeds


def test_a_tqdm_bar_counts_from_the_loaded_iteration_after_an_autoloaded_resume(
    tmp_path: Path,
) -> None:
    out = _Terminal()
    _autoloading_run(tmp_path, ProgressBar(out=out, update_interval=1))
    text = out.getvalue()
    assert "| 12/12 iters" in text and "it/s" in text
    assert not [bar for bar in getattr(tqdm.tqdm, "_instances", ()) if bar.fp == out]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"update_interval": 0},
        {"bar_length": -1},
        {"update_interval": 1.5},
        {"training_length": (10, "epochs")},
        {"training_length": 10},
        {"min_interval": -1},
        {"min_interval": "5"},
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        ProgressBar(**kwargs)


class _Clock:
    """A perf_counter stand-in that advances one second per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_plain_lines_are_limited_by_time_plus_the_final_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ppe_extensions import _progress_bar

    monkeypatch.setattr(_progress_bar, "time", _Clock())
    out = io.StringIO()
    # Each update reads the clock twice (rate limit + speed): 2 s per update, so with a 5 s
    # minimum a line appears every third update; the final state is always printed.
    bar = ProgressBar(out=out, min_interval=5.0, training_length=(30, "iteration"))
    _train(_manager(tmp_path, [bar], stop_trigger=(30, "iteration")))
    done = [int(PLAIN_LINE.match(line).group(2)) for line in out.getvalue().splitlines()]  # type: ignore[union-attr]
    assert done[0] == 1 and done[-1] == 30
    assert len(done) < 30 // 2
    assert all(b - a >= 2 for a, b in itertools.pairwise(done[:-1]))  # final line aside


def test_redirected_stdout_gets_the_first_and_the_final_line_of_a_fast_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The process's own stdout, not a terminal (as in CI): a line at most every 5 s.
    _train(_manager(tmp_path, [ProgressBar()]))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[1].split()[0] for line in lines] == ["1/12", "12/12"]


def test_a_stream_passed_in_gets_every_update_as_in_ppe(tmp_path: Path) -> None:
    out = io.StringIO()
    _train(_manager(tmp_path, [ProgressBar(out=out)]))
    assert len(out.getvalue().splitlines()) == 12


def test_only_rank_0_draws_under_torch_distributed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    out_rank0, out_rank1 = io.StringIO(), io.StringIO()
    # A pretend group of two: the managers' one start-time exchange (which extensions issue
    # collectives) answers as if the other rank had the same extensions.
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 1)

    def all_gather_object(everyone: list[Any], mine: Any, group: Any = None) -> None:
        everyone[:] = [mine] * len(everyone)

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    log = LogReport()
    extensions = [log, PrintReport(out=out_rank1), ProgressBar(out=out_rank1, min_interval=0)]
    _train(_manager(tmp_path / "rank1", extensions))
    assert out_rank1.getvalue() == ""
    assert len(log.log) == 3  # rank 1 still keeps the entries; it only does not write them
    assert not (tmp_path / "rank1" / "log").exists()
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    extensions = [LogReport(), PrintReport(out=out_rank0), ProgressBar(out=out_rank0)]
    _train(_manager(tmp_path / "rank0", extensions))
    assert "train/loss" in out_rank0.getvalue()
    assert (tmp_path / "rank0" / "log").exists()
