"""The extension API and the standard extensions next to pytorch-pfn-extras 0.9.

Each scenario runs with PPE and with ppe-core through the same PPE-style code and compares
what a user sees: attributes, accepted arguments, log entries, printed output, state dicts.
"""

from __future__ import annotations

import inspect
import io
import json
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ppe_core
from ppe_core.training.extension import make_extension

STANDARD = [
    "LogReport",
    "PrintReport",
    "ProgressBar",
    "MicroAverage",
    "ParameterStatistics",
    "PlotReport",
    "ProfileReport",
    "FailOnNonNumber",
    "LRScheduler",
    "observe_value",
    "observe_lr",
    "BestValue",
    "MaxValue",
    "MinValue",
    "VariableStatisticsPlot",
    "Slack",
    "SlackWebhook",
    "TimelineTrace",
    "PrintReportCLI",
    "ProgressBarCLI",
]
# PPE defaults that are live objects; ppe-core's None means the same thing.
_EQUIVALENT_DEFAULTS = {("PrintReport", "out"), ("ProgressBar", "out"), ("LRScheduler", "stepper")}


@pytest.fixture(scope="module")
def pfn() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pytorch_pfn_extras.training.extensions
    return pytorch_pfn_extras


@pytest.fixture(params=["pytorch_pfn_extras", "ppe_core"])
def either(request: pytest.FixtureRequest, pfn: Any) -> Any:
    return pfn if request.param == "pytorch_pfn_extras" else ppe_core


def test_extension_defaults_and_priorities_equal_ppes(pfn: Any) -> None:
    theirs, ours = pfn.training.Extension, ppe_core.training.Extension
    for attribute in ("trigger", "priority", "name", "is_async", "needs_model_state"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    for name in ("PRIORITY_WRITER", "PRIORITY_EDITOR", "PRIORITY_READER", "PRIORITY_SNAPSHOT"):
        assert getattr(ppe_core.training, name) == getattr(pfn.training.extension, name), name
    assert ours().default_name == "Extension"
    assert ours().state_dict() == theirs().state_dict() == {}
    with pytest.raises(AttributeError):
        ours().invoke_before_training  # noqa: B018  (Chainer's removed hook)


def test_make_extension_sets_every_attribute_like_ppe(either: Any) -> None:
    @either.training.make_extension()  # type: ignore[untyped-decorator]
    def plain(manager: Any) -> None:
        pass

    assert plain.trigger == (1, "iteration")
    assert plain.priority == either.training.PRIORITY_READER
    assert plain.default_name == "plain"
    # The no-op hooks are there even when not given, as in PPE.
    plain.initialize(object())
    plain.finalize(object())
    plain.on_error(object(), RuntimeError("x"), None)


def test_make_extension_rejects_unknown_keywords_with_type_error(either: Any) -> None:
    with pytest.raises(TypeError):

        @either.training.make_extension(foo=1)  # type: ignore[untyped-decorator]
        def ext(manager: Any) -> None:
            pass


def test_make_extension_keeps_ppe_core_flags() -> None:
    @make_extension(needs_model_state=True, is_async=True)
    def ext(manager: Any) -> None:
        pass

    entry = ppe_core.training.ExtensionEntry(ext)
    assert entry.needs_model_state is True
    assert entry.extension.is_async is True


def test_extensions_manager_protocol_is_a_protocol() -> None:
    protocol = ppe_core.training.extension.ExtensionsManagerProtocol
    assert getattr(protocol, "_is_protocol", False)
    assert protocol is ppe_core.training.ExtensionsManagerProtocol


@pytest.mark.parametrize("name", STANDARD)
def test_constructor_accepts_ppes_arguments_with_ppes_defaults(pfn: Any, name: str) -> None:
    theirs = inspect.signature(getattr(pfn.training.extensions, name))
    ours = inspect.signature(getattr(ppe_core.training.extensions, name)).parameters
    base = name.removesuffix("CLI")
    for parameter in theirs.parameters.values():
        if parameter.kind is parameter.VAR_KEYWORD:
            continue
        assert parameter.name in ours, f"{name} lacks {parameter.name}"
        mine = ours[parameter.name]
        assert (mine.kind is mine.KEYWORD_ONLY) == (parameter.kind is parameter.KEYWORD_ONLY)
        if (base, parameter.name) in _EQUIVALENT_DEFAULTS:
            continue
        assert mine.default == parameter.default, f"{name}({parameter.name}=...)"


def test_cli_aliases_are_the_terminal_classes() -> None:
    extensions = ppe_core.training.extensions
    assert extensions.PrintReportCLI is extensions.PrintReport
    assert extensions.ProgressBarCLI is extensions.ProgressBar
    assert extensions._ipython_module_available is False


def _report_run(ppe: Any, out: io.StringIO, tmp: Path) -> tuple[Any, Any]:
    manager = ppe.training.ExtensionsManager({}, {}, 3, iters_per_epoch=4, out_dir=str(tmp))
    log_report = ppe.training.extensions.LogReport(trigger=(2, "iteration"))
    manager.extend(log_report)
    manager.extend(
        ppe.training.extensions.PrintReport(["epoch", "iteration", "loss", "acc"], out=out)
    )
    for i in range(12):
        with manager.run_iteration():
            observed = {"loss": float(i)}
            if i % 3:
                observed["acc"] = i / 10
            ppe.reporting.report(observed)
    return manager, log_report


def _without_time(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in entry.items() if k != "elapsed_time"} for entry in log]


def test_log_report_and_print_report_output_match_ppe(pfn: Any, tmp_path: Path) -> None:
    their_out, our_out = io.StringIO(), io.StringIO()
    _, theirs = _report_run(pfn, their_out, tmp_path / "pfn")
    _, ours = _report_run(ppe_core, our_out, tmp_path / "core")
    assert _without_time(ours.log) == _without_time(theirs.log)
    # PPE erases the line below the cursor before each row (for its progress bar); ppe-core's
    # plain-stream output has no ANSI codes. The text is otherwise identical.
    assert our_out.getvalue() == their_out.getvalue().replace("\x1b[J", "")
    on_disk = json.loads((tmp_path / "core" / "log").read_text())
    assert _without_time(on_disk) == _without_time(
        json.loads((tmp_path / "pfn" / "log").read_text())
    )


def test_log_report_state_round_trips_between_ppe_and_ppe_core(pfn: Any, tmp_path: Path) -> None:
    _, theirs = _report_run(pfn, io.StringIO(), tmp_path / "pfn")
    _, ours = _report_run(ppe_core, io.StringIO(), tmp_path / "core")
    assert set(ours.state_dict()) == set(theirs.state_dict())

    restored = ppe_core.training.extensions.LogReport(trigger=(2, "iteration"))
    restored.load_state_dict(theirs.state_dict())
    assert _without_time(restored.log) == _without_time(theirs.log)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = pfn.training.extensions.LogReport(trigger=(2, "iteration"))
    back.load_state_dict(ours.state_dict())
    assert _without_time(back.log) == _without_time(ours.log)


def test_progress_bar_prints_ppes_status_phrase(tmp_path: Path) -> None:
    ppe = ppe_core
    manager = ppe.training.ExtensionsManager({}, {}, 5, iters_per_epoch=5)
    out = io.StringIO()
    manager.extend(
        ppe.training.extensions.ProgressBar(
            training_length=None, update_interval=1, bar_length=40, out=out
        )
    )
    for epoch in range(5):
        for _ in range(5):
            with manager.run_iteration():
                if manager.iteration >= 2:
                    assert f"{manager.iteration} iter, {epoch} epoch / 5 epochs" in out.getvalue()


def test_profile_report_state_has_ppes_keys(pfn: Any, tmp_path: Path) -> None:
    def run(ppe: Any, out: Path) -> dict[str, Any]:
        manager = ppe.training.ExtensionsManager({}, {}, 1, iters_per_epoch=2, out_dir=str(out))
        extension = ppe.training.extensions.ProfileReport()
        manager.extend(extension)
        for _ in range(2):
            with manager.run_iteration():
                pass
        return dict(extension.state_dict())

    theirs, ours = run(pfn, tmp_path / "pfn"), run(ppe_core, tmp_path / "core")
    assert set(ours) == set(theirs) == {"_trigger", "_log"}
    restored = ppe_core.training.extensions.ProfileReport()
    restored.load_state_dict(theirs)
    assert restored.state_dict()["_log"] == theirs["_log"]
    assert (tmp_path / "core" / "log").exists()


# VariableStatisticsPlot ---------------------------------------------------------------------


def _train_linear(ppe: Any, out: Path, extension: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = ppe.training.ExtensionsManager(
        {"main": model}, {"main": optimizer}, 2, iters_per_epoch=3, out_dir=str(out)
    )
    manager.extend(extension(ppe, model))
    for _ in range(6):
        with manager.run_iteration(step_optimizers=["main"]):
            model(torch.randn(4, 3)).pow(2).mean().backward()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"report_grad": False, "plot_std": False, "percentile_sigmas": (5, 50, 95)},
        {"plot_mean": False, "plot_std": False, "percentile_sigmas": 50.0, "marker": "o"},
    ],
)
def test_variable_statistics_plot_writes_an_image_per_epoch(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    written: list[tuple[int, str]] = []

    class Recorder(ppe_core.writing.SimpleWriter):
        def __call__(self, filename: str, out_dir: str, target: Any, **kwargs: Any) -> None:
            written.append((len(written), filename))
            super().__call__(filename, out_dir, target, **kwargs)

    _train_linear(
        ppe_core,
        tmp_path,
        lambda ppe, model: ppe.training.extensions.VariableStatisticsPlot(
            model, filename="stats.png", writer=Recorder(), **options
        ),
    )
    assert [name for _, name in written] == ["stats.png", "stats.png"]  # epochs 1 and 2
    assert (tmp_path / "stats.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variable_statistics_plot_rejects_nothing_to_watch_or_plot() -> None:
    extensions = ppe_core.training.extensions
    with pytest.raises(ValueError, match="tensor"):
        extensions.VariableStatisticsPlot([])
    with pytest.raises(ValueError, match="nothing to plot"):
        extensions.VariableStatisticsPlot(
            torch.zeros(2), plot_mean=False, plot_std=False, percentile_sigmas=()
        )


def test_reservoir_keeps_a_bounded_sorted_sample() -> None:
    from ppe_extensions._variable_statistics_plot import Reservoir

    reservoir = Reservoir(size=3, data_shape=(2, 4))
    for step in range(10):
        reservoir.add(torch.full((2, 4), float(step)), idx=step)
    idxs, data = reservoir.get_data()
    assert idxs.ndim == 1 and len(idxs) == len(data) == 3
    assert list(idxs) == sorted(idxs)
    for idx, sample in zip(idxs, data, strict=True):
        assert (sample == idx).all()  # each kept sample stays with its step
    assert reservoir.counter == 10


def test_statistician_matches_ppes(pfn: Any) -> None:
    from ppe_extensions._variable_statistics_plot import Statistician
    from pytorch_pfn_extras.training.extensions.variable_statistics_plot import (
        Statistician as TheirStatistician,
    )

    x = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(0))
    sigmas = (0.0, 15.87, 50.0, 100.0)
    ours = Statistician(True, True, sigmas)(x, axis=None, dtype=x.dtype)
    theirs = TheirStatistician(True, True, sigmas)(x, axis=None, dtype=x.dtype)
    assert set(ours) == set(theirs) == {"mean", "std", "percentile"}
    for key in ours:
        assert ours[key].dtype == x.dtype
        assert torch.allclose(ours[key], theirs[key].to(x.dtype))
    assert torch.allclose(ours["percentile"][0], x.min())
    assert torch.allclose(ours["percentile"][-1], x.max())


# Slack --------------------------------------------------------------------------------------


class _Reply:
    """What urlopen returns, for the patched calls."""

    def __init__(self, body: dict[str, Any], status: int = 200) -> None:
        self.status = status
        self._body = json.dumps(body).encode()

    def read(self) -> bytes:
        return self._body

    def close(self) -> None:
        pass

    def __enter__(self) -> _Reply:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Records every urllib request instead of sending it; Slack answers ok with ts '1'."""
    import urllib.request

    sent: list[Any] = []

    def fake_urlopen(request: Any, *args: Any, **kwargs: Any) -> _Reply:
        sent.append(request)
        return _Reply({"ok": True, "ts": "1"})

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    yield sent


def _slack_run(ppe: Any, extension: Any, tmp: Path, fail: bool = False) -> None:
    manager = ppe.training.ExtensionsManager({}, [], 1, iters_per_epoch=2, out_dir=str(tmp))
    manager.extend(extension, trigger=(1, "iteration"))
    for loss in (0.5, 0.75):
        with manager.run_iteration():
            ppe.reporting.report({"loss": loss})
            if fail:
                raise RuntimeError("diverged")


def test_slack_webhook_posts_the_same_payloads_as_ppe(
    pfn: Any, requests: list[Any], tmp_path: Path
) -> None:
    def run(ppe: Any) -> list[Any]:
        requests.clear()
        extension = ppe.training.extensions.SlackWebhook(
            url="http://hooks.invalid/x",
            msg="It {manager.iteration} loss: {loss} {context.tag}",
            start_msg="start {context.tag}",
            end_msg=lambda manager, context: f"end at {manager.iteration}",
            context=types.SimpleNamespace(tag="run1"),
        )
        _slack_run(ppe, extension, tmp_path)
        return [(r.full_url, r.get_method(), json.loads(r.data)) for r in requests]

    theirs, ours = run(pfn), run(ppe_core)
    assert ours == theirs
    assert [payload["text"] for _, _, payload in ours] == [
        "start run1",
        "It 1 loss: 0.5 run1",
        "It 2 loss: 0.75 run1",
        "end at 2",
    ]


def test_slack_posts_through_the_web_api_in_one_thread(requests: list[Any], tmp_path: Path) -> None:
    extension = ppe_core.training.extensions.Slack(
        "#exp", "It {manager.iteration} loss: {loss}", token="xoxb-test", end_msg=None
    )
    _slack_run(ppe_core, extension, tmp_path)
    assert all(r.full_url == "https://slack.com/api/chat.postMessage" for r in requests)
    assert all(r.get_header("Authorization") == "Bearer xoxb-test" for r in requests)
    payloads = [json.loads(r.data) for r in requests]
    assert "Training started" in payloads[0]["text"]
    assert "thread_ts" not in payloads[0]
    assert payloads[1:] == [
        {"channel": "#exp", "text": "It 1 loss: 0.5", "thread_ts": "1"},
        {"channel": "#exp", "text": "It 2 loss: 0.75", "thread_ts": "1"},
    ]


def test_slack_without_slack_sdk_posts_and_warns_that_files_need_it(
    requests: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ppe_extensions import _slack

    from ppe_core.errors import SlackPostWarning

    monkeypatch.setattr(_slack, "_slack_sdk_available", False)
    (tmp_path / "curve.png").write_bytes(b"png")
    extension = ppe_core.training.extensions.Slack(
        "#exp",
        "It {manager.iteration}",
        token="xoxb-test",
        start_msg=None,
        end_msg=None,
        filenames=[str(tmp_path / "curve.png")],
    )
    with pytest.warns(SlackPostWarning, match=r"needs slack_sdk \(`pip install slack_sdk`\)") as w:
        _slack_run(ppe_core, extension, tmp_path)
    assert all("curve.png" in str(warning.message) for warning in w)
    # the messages are still posted, through the Web API, without file links
    assert [json.loads(r.data)["text"] for r in requests] == ["It 1", "It 2"]


def test_slack_error_message_and_failed_posts_warn(
    requests: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extension = ppe_core.training.extensions.SlackWebhook(url="http://hooks.invalid/x")
    with pytest.raises(RuntimeError, match="diverged"):
        _slack_run(ppe_core, extension, tmp_path, fail=True)
    error_text = json.loads(requests[-1].data)["text"]
    assert "Error during training" in error_text and "RuntimeError: diverged" in error_text

    import urllib.request

    from ppe_core.errors import SlackPostWarning

    monkeypatch.setattr(urllib.request, "urlopen", lambda request: _Reply({}, status=500))
    manager = ppe_core.training.ExtensionsManager({}, [], 1, iters_per_epoch=1)
    with pytest.warns(SlackPostWarning, match="status 500"):
        extension.finalize(manager)  # training goes on: a failed post only warns


def test_slack_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match="needed for communicating"):
        ppe_core.training.extensions.Slack("0", "msg", start_msg=None, end_msg=None)
    monkeypatch.setenv("SLACK_BOT_TOKEN", "from-env")
    assert ppe_core.training.extensions.Slack("0")._token == "from-env"


# TimelineTrace ------------------------------------------------------------------------------


def test_timeline_trace_writes_the_same_events_as_ppe(pfn: Any, tmp_path: Path) -> None:
    def run(ppe: Any, out: Path) -> tuple[list[str], list[str]]:
        tracer = ppe.profiler.ChromeTracer()
        manager = ppe.training.ExtensionsManager({}, {}, 2, iters_per_epoch=3, out_dir=str(out))
        extension = ppe.training.extensions.TimelineTrace(tracer=tracer)
        manager.extend(extension)
        for step in range(6):
            with manager.run_iteration(), tracer.add_event(f"step{step}"):
                pass
        events = ppe.profiler.load_chrome_trace_as_json(str(out / "chrome_trace.json"))
        return [event["name"] for event in events], sorted(extension.state_dict())

    assert run(ppe_core, tmp_path / "core") == run(pfn, tmp_path / "pfn")


def test_profile_report_yaml_log_holds_plain_floats(tmp_path: Path) -> None:
    import yaml

    def run(ppe: Any, out: Path) -> list[dict[str, Any]]:
        manager = ppe.training.ExtensionsManager({}, {}, 2, iters_per_epoch=2, out_dir=str(out))
        manager.extend(ppe.training.extensions.ProfileReport(format="yaml"))
        for _ in range(4):
            with manager.run_iteration(), ppe.profiler.get_time_summary().report("step"):
                pass
        loaded: list[dict[str, Any]] = yaml.safe_load((out / "log").read_text())
        return loaded

    ours = run(ppe_core, tmp_path / "core")
    assert len(ours) == 2
    assert all(isinstance(entry["step"], float) and "step.std" in entry for entry in ours)


def test_extend_with_a_positional_tuple_names_the_extension_like_ppe() -> None:
    manager = ppe_core.training.ExtensionsManager({}, [], 1, iters_per_epoch=3)
    extension = ppe_core.training.extensions.MicroAverage("c", "t", "acc", (3, "iteration"))
    manager.extend(extension, (1, "iteration"))  # PPE's second positional argument is `name`
    assert extension.name == "(1, 'iteration')"
    for correct in (1, 2, 3):
        with manager.run_iteration():
            ppe_core.reporting.report({"c": correct, "t": 4})
    assert manager.observation["acc"] == pytest.approx(6 / 12)


def test_lr_scheduler_waits_only_when_the_first_step_is_observable() -> None:
    from unittest import mock

    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    custom = mock.Mock(spec=["step", "optimizer", "state_dict", "load_state_dict"])
    custom.optimizer = optimizer
    torch_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    steppers = {"custom": mock.Mock(), "torch": mock.Mock()}
    extensions = ppe_core.training.extensions
    manager = ppe_core.training.ExtensionsManager(
        {},
        {"main": optimizer},
        1,
        iters_per_epoch=4,
        extensions=[
            extensions.LRScheduler(
                scheduler,
                stepper=steppers[key],
                wait_for_first_optimizer_step=True,
                trigger=(1, "iteration"),
            )
            for key, scheduler in (("custom", custom), ("torch", torch_scheduler))
        ],
    )
    for step in range(4):
        with manager.run_iteration(step_optimizers=["main"] if step >= 2 else []):
            pass
    # A non-torch scheduler cannot tell, so it steps from the start (as in PPE).
    assert steppers["custom"].call_count == 4
    assert steppers["torch"].call_count == 2


def test_notebook_variants_are_the_standard_classes() -> None:
    """PPE defines the notebook variants only with IPython; ppe-core always provides them."""
    from ppe_core.training.extensions.print_report_notebook import PrintReportNotebook
    from ppe_core.training.extensions.progress_bar_notebook import ProgressBarNotebook

    extensions = ppe_core.training.extensions
    assert extensions.ProgressBarNotebook is ProgressBarNotebook is extensions.ProgressBar
    assert extensions.PrintReportNotebook is PrintReportNotebook is extensions.PrintReport
    out = io.StringIO()
    bar = extensions.ProgressBarNotebook(
        training_length=(4, "iteration"), update_interval=1, out=out
    )
    manager = ppe_core.training.ExtensionsManager(
        torch.nn.Linear(1, 1),
        torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1),
        1,
        iters_per_epoch=4,
        extensions=[bar],
    )
    while not manager.stop_trigger:
        with manager.run_iteration():
            pass
    assert "4 iter, 1 epoch" in out.getvalue()
