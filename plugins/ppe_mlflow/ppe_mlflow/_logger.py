"""``MLflowLogger``: LogReport's entries as MLflow metrics, sent off the training thread."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ppe_extensions.tracking import BaseTracker, TrackerEntry

from ppe_core.errors import OptionalDependencyError

__all__ = ["MLflowLogger"]

# MLflow's limits per log_batch request.
_METRICS_PER_REQUEST = 1000
_PARAMS_PER_REQUEST = 100
_PARAM_VALUE_LENGTH = 6000

#: The tag holding the tracker's run key (:attr:`~ppe_extensions.tracking.BaseTracker.run_key`).
RUN_KEY_TAG = "ppe.run_key"


class MLflowLogger(BaseTracker):
    """Logs every LogReport entry to an MLflow run, as metrics by iteration step.

    Also logs the run's params once (optimizer class and hyperparameters, ``max_epochs``,
    ``iters_per_epoch``, each model's runtime and device, versions; see
    :meth:`~ppe_extensions.tracking.BaseTracker.run_params`) and, with ``snapshots=True``, the
    snapshot files as artifacts. Every MLflow call runs in the tracker's sender process
    (``sender="process"``, the default: MLflow's HTTP and JSON work never holds the training
    process's GIL) or on its worker thread (``sender="thread"``); see
    :class:`~ppe_extensions.tracking.BaseTracker` for the queue, retries, drops and final flush.
    The run id is saved in snapshots, so a resumed training continues the same run.

    MLflow's own HTTP retries would hold a batch for minutes against a dead server, so unless
    you set them the logger sets ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and
    ``MLFLOW_HTTP_REQUEST_TIMEOUT=<request_timeout>`` in the process that sends (the sender
    process, or this one on a thread): the tracker retries itself, with backoff, and never
    waits on the training thread.

    Args:
        tracking_uri: The tracking server (``http://host:port``) or store; MLflow's default
            (``MLFLOW_TRACKING_URI``, else ``./mlruns``) when None.
        experiment_name: The experiment the run belongs to (created when missing).
        run_name: The run's name; MLflow picks one when None.
        tags: Tags set on a new run.
        snapshots: Upload the files matching ``snapshot_iter_*`` in the output directory as
            artifacts (each once, when it appears; a ``SnapshotMode.DCP`` directory once
            complete, whole); a string is another glob pattern. Under torch.distributed a
            DCP snapshot needs an output directory rank 0 shares with every rank (checked at
            start: see :class:`~ppe_extensions.tracking.BaseTracker`'s ``artifacts``).
        request_timeout: Seconds one HTTP request may take.
        sender: ``"process"`` (default) or ``"thread"``: where the MLflow client runs.
        **tracker_options: ``BaseTracker`` options (``params``, ``artifacts``,
            ``queue_size``, ``batch_size``, ``max_retries``, ``retry_backoff``,
            ``flush_timeout``, ``log_report``).

    Example::

        from ppe_core.training import extensions

        trainer = ppe.engine.create_trainer(
            model, optimizer, 10,
            extensions=[extensions.LogReport(), extensions.MLflowLogger("http://127.0.0.1:5000")],
        )
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment_name: str = "ppe-core",
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        snapshots: bool | str = False,
        request_timeout: float = 10.0,
        sender: str = "process",
        **tracker_options: Any,
    ) -> None:
        if importlib.util.find_spec("mlflow") is None:
            raise OptionalDependencyError(
                "MLflowLogger needs MLflow, which is not installed; run `pip install ppe-mlflow` "
                "(or `pip install mlflow`)"
            )
        super().__init__(sender=sender, snapshots=snapshots, **tracker_options)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.request_timeout = request_timeout
        self._client: Any = None
        self._resumed = False

    def __getstate__(self) -> dict[str, Any]:
        """The logger without its MLflow client: a sender process makes its own."""
        state = super().__getstate__()
        state["_client"] = None
        return state

    # Everything below runs in the sender process (or on the tracker's worker thread).

    def _mlflow_client(self) -> Any:
        if self._client is None:
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", f"{self.request_timeout:g}")
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def open_run(self, run_id: str | None) -> str:
        """Creates the run (in ``experiment_name``, tagged with the run key), or marks the
        resumed one running again (found by its key when the snapshot has no run id)."""
        client = self._mlflow_client()
        if run_id is None:
            experiment = client.get_experiment_by_name(self.experiment_name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                experiment_id = client.create_experiment(self.experiment_name)
            if self.resuming:  # a snapshot from before the run opened: find it by its key
                found = client.search_runs(
                    [experiment_id],
                    filter_string=f"tags.`{RUN_KEY_TAG}` = '{self.run_key}'",
                    max_results=1,
                )
                run_id = str(found[0].info.run_id) if found else None
        self._resumed = run_id is not None
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return run_id
        tags = {**self.tags, RUN_KEY_TAG: str(self.run_key)}
        run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        return str(run.info.run_id)

    def log_metrics(self, entries: Sequence[TrackerEntry]) -> None:
        """One ``log_batch`` request per 1,000 metrics, each at its entry's iteration."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, entry.step)
            for entry in entries
            for key, value in entry.metrics.items()
        ]
        client = self._mlflow_client()
        for start in range(0, len(metrics), _METRICS_PER_REQUEST):
            chunk = metrics[start : start + _METRICS_PER_REQUEST]
            client.log_batch(self.run_id, metrics=chunk)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """The params as strings.

        MLflow refuses to change a param, so a resumed run sends only the params it does not
        hold yet: one that changed (``max_epochs`` of a run trained further) keeps its first
        value.
        """
        from mlflow.entities import Param

        client = self._mlflow_client()
        held = client.get_run(self.run_id).data.params if self._resumed else {}
        items = [
            Param(key, str(value)[:_PARAM_VALUE_LENGTH])
            for key, value in params.items()
            if key not in held
        ]
        for start in range(0, len(items), _PARAMS_PER_REQUEST):
            client.log_batch(self.run_id, params=items[start : start + _PARAMS_PER_REQUEST])

    def last_step(self) -> int | None:
        """The last ``iteration`` step the resumed run holds."""
        history = self._mlflow_client().get_metric_history(self.run_id, "iteration")
        return max((int(metric.step) for metric in history), default=None)

    def log_artifact(self, path: str) -> None:
        """Uploads ``path`` to the run's artifact root (a directory, a ``SnapshotMode.DCP``
        snapshot, as the directory of that name)."""
        client = self._mlflow_client()
        if os.path.isdir(path):
            client.log_artifacts(self.run_id, path, artifact_path=os.path.basename(path))
        else:
            client.log_artifact(self.run_id, path)

    def close_run(self, failed: bool) -> None:
        """Marks the run ``FINISHED`` (or ``FAILED`` when training raised)."""
        self._mlflow_client().set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
