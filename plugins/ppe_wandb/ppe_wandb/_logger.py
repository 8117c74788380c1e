"""``WandbLogger``: LogReport's entries as W&B history, sent off the training thread."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ppe_extensions.tracking import BaseTracker, TrackerEntry

from ppe_core.errors import OptionalDependencyError

__all__ = ["WandbLogger"]


class WandbLogger(BaseTracker):
    """Logs every LogReport entry to a W&B run, at its iteration as the step.

    The run's params (optimizer, trainer options, runtime; see
    :meth:`~ppe_extensions.tracking.BaseTracker.run_params`) go to the run's config. Every W&B call
    runs in the tracker's sender process (``sender="process"``, the default: W&B's protobuf
    work never holds the training process's GIL) or on its worker thread
    (``sender="thread"``); see :class:`~ppe_extensions.tracking.BaseTracker` for the queue,
    retries, drops and final flush. The run id is saved in snapshots, so a resumed
    training continues the same run (``resume="allow"``) from the resumed iteration.

    Works offline (``mode="offline"`` or ``WANDB_MODE=offline``): the run is written under
    ``dir`` and can be uploaded later with ``wandb sync``.

    Args:
        project: The W&B project.
        name: The run's display name; W&B picks one when None.
        dir: Where W&B writes its ``wandb/`` folder; the current directory when None.
        mode: ``"online"``, ``"offline"`` or ``"disabled"``; W&B's default (``WANDB_MODE``)
            when None.
        entity: The W&B entity (user or team).
        tags: Tags of the run.
        init_options: More ``wandb.init`` arguments.
        snapshots: Save the files matching ``snapshot_iter_*`` in the output directory with
            the run's files (each once, when it appears; a ``SnapshotMode.DCP`` directory
            once complete, file by file under its name); a string is another glob pattern.
            Under torch.distributed a DCP snapshot needs an output directory rank 0 shares
            with every rank (checked at start: see
            :class:`~ppe_extensions.tracking.BaseTracker`'s ``artifacts``).
        sender: ``"process"`` (default) or ``"thread"``: where the W&B client runs.
        **tracker_options: ``BaseTracker`` options (``params``, ``artifacts``, ``queue_size``,
            ``batch_size``, ``max_retries``, ``retry_backoff``, ``flush_timeout``,
            ``log_report``).

    Example::

        trainer = ppe.engine.create_trainer(
            model, optimizer, 10,
            extensions=[extensions.LogReport(), extensions.WandbLogger(project="digits")],
        )
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        name: str | None = None,
        dir: str | None = None,
        mode: str | None = None,
        entity: str | None = None,
        tags: Sequence[str] | None = None,
        init_options: Mapping[str, Any] | None = None,
        snapshots: bool | str = False,
        sender: str = "process",
        **tracker_options: Any,
    ) -> None:
        if importlib.util.find_spec("wandb") is None:
            raise OptionalDependencyError(
                "WandbLogger needs wandb, which is not installed; run `pip install ppe-wandb` "
                "(or `pip install wandb`)"
            )
        super().__init__(sender=sender, snapshots=snapshots, **tracker_options)
        self.project = project
        self.run_name = name
        self.dir = dir
        self.mode = mode
        self.entity = entity
        self.tags = list(tags or [])
        self.init_options = dict(init_options or {})
        self._run: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """The logger without its W&B run: a sender process opens its own."""
        state = super().__getstate__()
        state["_run"] = None
        return state

    # Everything below runs on the tracker's worker thread (or in its sender process).

    def open_run(self, run_id: str | None) -> str:
        """``wandb.init`` with ``id=`` the run id (the run key for a new run) and
        ``resume="allow"``: the same id resumes the run."""
        import wandb

        options: dict[str, Any] = {
            "project": self.project,
            "name": self.run_name,
            "dir": self.dir,
            "mode": self.mode,
            "entity": self.entity,
            "tags": self.tags or None,
            "reinit": "create_new",
            **self.init_options,
        }
        # W&B takes the run id from the client: the run key is the id, so a resumed training
        # finds its run even from a snapshot taken before the run opened.
        options.update(id=run_id or self.run_key, resume="allow")
        self._run = wandb.init(**{k: v for k, v in options.items() if v is not None})
        return str(self._run.id)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """The params as the run's config (a resumed run's config is updated)."""
        self._run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, entries: Sequence[TrackerEntry]) -> None:
        """One ``run.log`` per entry, at ``step=`` its iteration."""
        for entry in entries:
            self._run.log(entry.metrics, step=entry.step)

    def last_step(self) -> int | None:
        """The resumed run's step (W&B refuses steps below it), or None when it has none."""
        step = getattr(self._run, "step", None)
        return int(step) - 1 if step else None

    def log_artifact(self, path: str) -> None:
        """Saves ``path`` with the run's files (``run.save``); a directory (a
        ``SnapshotMode.DCP`` snapshot) file by file, under its name."""
        if os.path.isdir(path):
            base = os.path.dirname(os.path.abspath(path))
            for root, _, names in os.walk(path):
                for name in names:
                    self._run.save(os.path.join(root, name), base_path=base, policy="now")
            return
        self._run.save(path, policy="now")

    def close_run(self, failed: bool) -> None:
        """``run.finish`` with exit code 1 when training raised."""
        self._run.finish(exit_code=1 if failed else 0)
