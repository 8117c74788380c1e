"""MLflowLogger against a real MLflow tracking server that the tests start (and stop)."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip(
    "mlflow", reason="ppe-mlflow's tests need mlflow: pip install -e plugins/ppe_mlflow"
)

import ppe_mlflow.plugin
from mlflow.tracking import MlflowClient
from ppe_extensions.tracking import TrackerEntry
from ppe_mlflow import MLflowLogger

import ppe_core as ppe
import ppe_core.testing
from ppe_core.errors import TrackerWarning
from ppe_core.training import extensions
from ppe_core.training.extension import ExtensionEntry

pytestmark = pytest.mark.slow

ITERS_PER_EPOCH = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """An ``mlflow server`` over SQLite in a temporary directory, in its own process group."""

    def __init__(self, root: Path) -> None:
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        command = [sys.executable, "-m", "mlflow", "server"]
        command += ["--backend-store-uri", f"sqlite:///{root / 'db'}"]
        command += ["--artifacts-destination", str(root / "artifacts")]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server did not start in 120 s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def _serve(root: Path) -> Iterator[Server]:
    started = Server(root)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture(autouse=True)
def _plugin_host() -> Iterator[None]:
    import ppe_cpu.plugin

    with ppe_core.testing.plugin_host(ppe_cpu.plugin, ppe_mlflow.plugin):
        yield


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def _trainer(out: Path, max_epochs: int, tracker: Any, *more: Any) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    log = extensions.LogReport(trigger=(1, "iteration"), filename="log.json")
    return ppe.engine.create_trainer(
        model, optimizer, max_epochs, extensions=[log, tracker, *more], out_dir=str(out)
    )


def _data() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        {"x": torch.randn(4, 3, generator=generator), "t": torch.randn(4, 1, generator=generator)}
        for _ in range(ITERS_PER_EPOCH)
    ]


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


class ThreadRecordingLogger(MLflowLogger):
    """Records the thread of every backend call (seen by the test on a thread only: in a
    sender process the records stay in the child)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: set[str] = set()
        self.batches: list[int] = []

    def log_metrics(self, entries: Sequence[TrackerEntry]) -> None:
        self.threads.add(threading.current_thread().name)
        self.batches.append(len(entries))
        super().log_metrics(entries)

    def open_run(self, run_id: str | None) -> str:
        self.threads.add(threading.current_thread().name)
        return super().open_run(run_id)


def test_the_plugin_registers_the_extension() -> None:
    assert extensions.MLflowLogger is MLflowLogger


def test_the_sender_process_is_the_default() -> None:
    assert MLflowLogger("http://127.0.0.1:1").sender == "process"


@pytest.mark.parametrize("sender", ["process", "thread"])
def test_metrics_steps_params_and_snapshots_equal_the_json_log(
    server: Server, tmp_path: Path, sender: str
) -> None:
    logger = ThreadRecordingLogger(
        server.uri, experiment_name=f"equal-{sender}", snapshots=True, sender=sender
    )
    snapshot = ExtensionEntry(extensions.snapshot(), trigger=(ITERS_PER_EPOCH, "iteration"))
    trainer = _trainer(tmp_path, 2, logger, snapshot)
    trainer.run(_data())

    log = json.loads((tmp_path / "log.json").read_text())
    client = MlflowClient(tracking_uri=server.uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) == set(log[0])
    for key in log[0]:
        assert _history(client, run.info.run_id, key) == [(e["iteration"], e[key]) for e in log]
    expected = {key: str(value) for key, value in logger.run_params(trainer.manager).items()}
    assert run.data.params == expected
    assert expected["optimizer/main/class"] == "SGD"
    assert expected["optimizer/main/lr"] == "0.1"
    assert expected["optimizer/main/momentum"] == "0.5"
    assert expected["max_epochs"] == "2"
    assert expected["device/main"] == "cpu"
    assert expected["runtime/main"] == "CPURuntime"
    artifacts = sorted(item.path for item in client.list_artifacts(run.info.run_id))
    assert artifacts == ["snapshot_iter_4", "snapshot_iter_8"]
    assert logger.sender == sender
    if sender == "process":  # every MLflow call ran in the child
        assert logger.sender_pid is not None and logger.sender_pid != os.getpid()
        assert logger.threads == set()
    else:
        assert logger.threads == {"ppe-tracker-ThreadRecordingLogger"}
    assert logger.report.sent == len(log) == 8


def test_resume_continues_the_run_id_and_its_steps(server: Server, tmp_path: Path) -> None:
    first = MLflowLogger(server.uri, experiment_name="resume")
    trainer = _trainer(tmp_path / "a", 1, first)
    trainer.run(_data())
    state = trainer.state_dict()

    second = MLflowLogger(server.uri, experiment_name="resume")
    resumed = _trainer(tmp_path / "b", 2, second)
    resumed.load_state_dict(state)
    resumed.run(_data())

    assert second.run_id == first.run_id
    client = MlflowClient(tracking_uri=server.uri)
    steps = [step for step, _ in _history(client, first.run_id, "iteration")]
    assert steps == list(range(1, 2 * ITERS_PER_EPOCH + 1))  # no restart at 0, no duplicate


class DelayingProxy:
    """A local HTTP proxy in front of the server that answers every request late."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.requests: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests.append(self.path)
                time.sleep(delay)
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("sender", ["process", "thread"])
def test_a_slow_server_never_runs_on_the_training_thread(
    server: Server, tmp_path: Path, sender: str
) -> None:
    proxy = DelayingProxy(server.port, delay=0.3)
    try:
        logger = ThreadRecordingLogger(
            proxy.uri, experiment_name=f"slow-{sender}", flush_timeout=30, sender=sender
        )
        trainer = _trainer(tmp_path, 3, logger)
        trainer.run(_data())
    finally:
        proxy.close()
    # Every call ran off the training thread; entries queued while a request was slow went
    # in one batch.
    assert logger.report.sent == 3 * ITERS_PER_EPOCH
    batch_requests = [path for path in proxy.requests if path.endswith("/runs/log-batch")]
    assert len(batch_requests) - 1 < 3 * ITERS_PER_EPOCH  # the params' request too
    if sender == "thread":
        assert logger.threads == {"ppe-tracker-ThreadRecordingLogger"}
        assert len(batch_requests) == len(logger.batches) + 1
    client = MlflowClient(tracking_uri=server.uri)
    steps = [step for step, _ in _history(client, logger.run_id, "iteration")]
    assert steps == list(range(1, 3 * ITERS_PER_EPOCH + 1))


# Trains 3 epochs with a snapshot every epoch (autoloaded); with a kill iteration, waits there
# until the worker sent every entry, then dies by SIGKILL.
_KILLED_SCRIPT = """
import os, signal, sys, time
import torch
import ppe_core as ppe
from ppe_core.training import extensions
from ppe_core.training.extension import ExtensionEntry, make_extension
from ppe_mlflow import MLflowLogger

uri, out, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])

class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x, t):
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}

torch.manual_seed(0)
model = ppe.to(Regressor(), "cpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
logger = MLflowLogger(uri, experiment_name="killed", send_interval=0)

@make_extension(trigger=(1, "iteration"), priority=0)
def kill(manager):
    if manager.iteration == kill_at:
        while logger.report.sent < kill_at:
            time.sleep(0.02)
        print(logger.run_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

snapshot = ExtensionEntry(extensions.snapshot(autoload=True), trigger=(4, "iteration"))
log = extensions.LogReport(trigger=(1, "iteration"))
trainer = ppe.engine.create_trainer(
    model, optimizer, 3, extensions=[log, logger, snapshot, kill], out_dir=out
)
generator = torch.Generator().manual_seed(1)
data = [{"x": torch.randn(4, 3, generator=generator), "t": torch.randn(4, 1)} for _ in range(4)]
trainer.run(data)
print(logger.run_id, logger.report.sent, logger.report.skipped, flush=True)
"""


def test_a_killed_run_resumes_the_same_run_without_duplicate_steps(
    server: Server, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_KILLED_SCRIPT)
    out = str(tmp_path / "out")

    def train(kill_at: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(script), server.uri, out, str(kill_at)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    killed = train(6)  # the snapshot holds iteration 4; the server holds steps 1-6
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = train(0)
    assert resumed.returncode == 0, resumed.stderr
    run_id, sent, skipped = resumed.stdout.split()[-3:]
    assert run_id == killed.stdout.split()[-1]
    # 7-12 sent; 5 and 6 were on the server, and so were those of 1-4 that had reached it
    # before the snapshot at 4 was taken (handed over again, skipped)
    assert int(sent) == 6 and 2 <= int(skipped) <= 6
    client = MlflowClient(tracking_uri=server.uri)
    steps = [step for step, _ in _history(client, run_id, "iteration")]
    assert steps == list(range(1, 13))
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server for one test alone, which may stop it (the module's server stays up)."""
    yield from _serve(tmp_path_factory.mktemp("mlflow-own"))


def test_a_server_stopped_mid_run_does_not_stop_training(
    own_server: Server, tmp_path: Path
) -> None:
    server = own_server
    logger = MLflowLogger(
        server.uri,
        experiment_name="stopped",
        request_timeout=2,
        max_retries=1,
        retry_backoff=0.05,
        flush_timeout=5,
    )

    # After the tracker (a lower priority), so this iteration's entry is queued already.
    @ppe.training.extension.make_extension(trigger=(ITERS_PER_EPOCH, "iteration"), priority=0)
    def stop_server(manager: Any) -> None:
        if server.process.poll() is not None:
            return
        # Let the worker send what it has first, so the run exists before the server goes.
        deadline = time.monotonic() + 30
        while logger.report.sent < manager.iteration and time.monotonic() < deadline:
            time.sleep(0.05)
        server.stop()

    trainer = _trainer(tmp_path, 3, logger, stop_server)
    with pytest.warns(TrackerWarning) as record:
        trainer.run(_data())

    assert trainer.manager.iteration == 3 * ITERS_PER_EPOCH  # training finished
    counts = logger.report
    assert counts.sent == ITERS_PER_EPOCH
    lost = counts.failed + counts.unsent + counts.dropped
    assert counts.sent + lost == 3 * ITERS_PER_EPOCH
    final = str(record[-1].message)
    assert f"sent {ITERS_PER_EPOCH} of {3 * ITERS_PER_EPOCH} entries" in final
    assert f"{lost} did not reach it" in final
    assert "last error:" in final


def test_under_torchrun_only_rank_0_sends_each_step_once(server: Server, tmp_path: Path) -> None:
    # Two gloo ranks train alike with LogReport + MLflowLogger: both keep the entries, only
    # rank 0's tracker sends, so the server holds one run with each step once.
    sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
    from helpers import launch

    script = Path(__file__).parent / "scripts" / "ddp_tracked.py"
    code, stderr = launch(script, server.uri, str(tmp_path), processes=2, timeout=300)
    assert code == 0, stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [len(rank["log"]) for rank in ranks] == [8, 8]  # both ranks trained every step
    assert (ranks[0]["queued"], ranks[0]["sent"]) == (8, 8), ranks[0]["report"]
    assert (ranks[1]["queued"], ranks[1]["sent"], ranks[1]["run_id"]) == (0, 0, None)
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name("ddp")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [ranks[0]["run_id"]]
    steps = [step for step, _ in _history(client, ranks[0]["run_id"], "iteration")]
    assert steps == list(range(1, 9))
    assert runs[0].data.params["world_size"] == "2"


@pytest.mark.parametrize("sender", ["process", "thread"])
def test_a_resumed_run_sends_what_the_backend_lacks_of_the_snapshots_log(
    server: Server, tmp_path: Path, sender: str
) -> None:
    # Killed at iteration 13 with steps 1-8 on the server and 9-13 handed to the queue but
    # never sent; the autoloaded snapshot (iteration 10) holds LogReport's entries 1-10. The
    # resumed run sends 9 and 10 from them and 11-20 as they come: each step once, one run,
    # and no warning (nothing was dropped).
    script = Path(__file__).parent / "scripts" / "killed_at_13.py"
    out = str(tmp_path / "out")

    def train(kill_at: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(script), server.uri, out, sender, str(kill_at), "8"]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    killed = train(13)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = train(0)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout.splitlines()[-1])
    # The killed run's lock is taken over (expected); the tracker warns of nothing.
    assert [w.split(":")[0] for w in result["warnings"]] == ["RunLockWarning"]
    assert result["dropped"] == 0
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name(f"killed-13-{sender}")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [result["run_id"]]
    for key in ("iteration", "epoch"):
        steps = [step for step, _ in _history(client, result["run_id"], key)]
        assert steps == list(range(1, 21)), key
    assert result["sent"] == 12  # 9-20; 1-8 were on the server (skipped, if handed again)
    assert client.get_run(result["run_id"]).info.status == "FINISHED"


def test_an_autoloaded_resume_reports_no_drops(server: Server, tmp_path: Path) -> None:
    # Autoload restores LogReport's log after the tracker started listening: the entries
    # restored are not entries handed over (nor dropped), so the resumed run does not warn.
    def run(max_epochs: int) -> MLflowLogger:
        logger = MLflowLogger(server.uri, experiment_name="autoload-drops", sender="thread")
        snapshot = ExtensionEntry(
            extensions.snapshot(autoload=True), trigger=(ITERS_PER_EPOCH, "iteration")
        )
        _trainer(tmp_path, max_epochs, logger, snapshot).run(_data())
        return logger

    first = run(1)
    second = run(2)  # no warning: filterwarnings=error
    assert second.run_id == first.run_id
    assert (second.report.dropped, second.report.sent) == (0, ITERS_PER_EPOCH)
    client = MlflowClient(tracking_uri=server.uri)
    steps = [step for step, _ in _history(client, first.run_id, "iteration")]
    assert steps == list(range(1, 2 * ITERS_PER_EPOCH + 1))


def test_dcp_snapshots_are_uploaded_as_directories(server: Server, tmp_path: Path) -> None:
    # SnapshotMode.DCP writes directories (renamed into place once complete): each is
    # uploaded whole, under its name, with every file its manifest lists.
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0
    )
    try:
        logger = MLflowLogger(server.uri, experiment_name="dcp", snapshots=True, sender="thread")
        snap = extensions.snapshot(saver_rank=0, snapshot_mode=extensions.SnapshotMode.DCP)
        entry = ExtensionEntry(snap, trigger=(ITERS_PER_EPOCH, "iteration"))
        _trainer(tmp_path / "out", 2, logger, entry).run(_data())
    finally:
        dist.destroy_process_group()
    client = MlflowClient(tracking_uri=server.uri)
    tops = sorted(item.path for item in client.list_artifacts(logger.run_id))
    assert tops == ["snapshot_iter_4", "snapshot_iter_8"]
    for name in tops:
        local = tmp_path / "out" / name
        manifest = json.loads((local / ".ppe_core_manifest.json").read_text())
        uploaded = {Path(item.path).name for item in client.list_artifacts(logger.run_id, name)}
        assert set(manifest["files"]) | {".ppe_core_manifest.json"} <= uploaded
    assert logger.report.artifacts_sent == 2


def test_dcp_uploads_are_refused_where_rank_0_lacks_the_other_ranks_shards(
    server: Server, tmp_path: Path
) -> None:
    # Two gloo ranks, a DCP snapshot and snapshots=True (scripts/dcp_shared_out_dir.py). With
    # an out_dir of their own each (as the local disks of two nodes), rank 1 writes its
    # shards where rank 0 does not see them: every rank refuses at start (none hangs),
    # naming why and the fix, before training. With one shared out_dir the check passes and
    # each uploaded directory holds both ranks' files.
    sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
    from helpers import launch

    script = Path(__file__).parent / "scripts" / "dcp_shared_out_dir.py"
    code, stderr = launch(script, server.uri, str(tmp_path), processes=2, timeout=300)
    assert code == 0, stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        error = rank["error"]
        assert error is not None
        assert f"rank 1 on host {socket.gethostname()} writes into" in error
        assert str(tmp_path / "apart" / "rank1") in error
        assert "would hold only rank 0's node's shards" in error
        assert "same out_dir on a shared file system" in error and "snapshots=False" in error
    apart = tmp_path / "apart" / "rank0"
    assert not (apart / "log.json").exists() and not (apart / "snapshot_iter_4").exists()
    client = MlflowClient(tracking_uri=server.uri)
    assert client.get_experiment_by_name("dcp-apart") is None
    # Shared: rank 0 alone sent, and the directories hold every rank's files.
    assert ranks[0]["artifacts_sent"] == 2 and ranks[1]["run_id"] is None
    run_id = ranks[0]["run_id"]
    tops = sorted(item.path for item in client.list_artifacts(run_id))
    assert tops == ["snapshot_iter_4", "snapshot_iter_8"]
    for name in tops:
        manifest = json.loads((tmp_path / "shared" / name / ".ppe_core_manifest.json").read_text())
        uploaded = {Path(item.path).name for item in client.list_artifacts(run_id, name)}
        assert {"rank0.pt", "rank1.pt"} <= set(manifest["files"]) <= uploaded
    for directory in (apart, tmp_path / "shared"):  # the probes are gone
        assert not list(directory.glob(".ppe_core_shared_dir_probe.*"))
