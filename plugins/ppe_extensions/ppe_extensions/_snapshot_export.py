"""``export_snapshot``: one model's weights of a snapshot as one ordinary ``state_dict`` file.

A default-mode snapshot (one file) is verified against its manifest and loaded safely; one
without a manifest (written by PPE) is exported with a :class:`SnapshotVerificationWarning`
saying its weights are unverified. A ``SnapshotMode.DCP`` snapshot (a directory) is
``_snapshot_dcp``'s. Never called while training.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ppe_core.errors import SnapshotError, SnapshotVerificationWarning
from ppe_extensions._snapshot_dcp import check_output, export_models, write_export
from ppe_extensions._snapshot_manifest import (
    load_snapshot,
    parse_manifest,
    verify_snapshot,
)

__all__ = ["export_snapshot"]


def export_snapshot(
    directory: str | os.PathLike[str],
    output: str | os.PathLike[str],
    model: str | None = None,
) -> dict[str, torch.Tensor]:
    """Writes one model's weights of a snapshot as one ordinary file.

    ``directory`` is a ``SnapshotMode.DCP`` snapshot directory or a default-mode snapshot
    file (``snapshot(...)``'s, or ``snapshot_object(model, ...)``'s). A DCP snapshot is
    verified (every file's size and SHA-256 against its manifest), and its shards of every
    rank are joined into full tensors in this process (no process group, any number of saving
    ranks). A snapshot file with a manifest must verify; one without (written by PPE, or by
    ppe-core when a kill prevented its manifest) is exported with a
    :class:`SnapshotVerificationWarning`: nothing vouches for its weights. Either way the
    model's plain state dict is saved with ``torch.save``, keyed as ``model.state_dict()``:
    ``model.load_state_dict(torch.load(output))`` restores it, for inference or in PPE. The
    file appears atomically (written beside ``output``, then renamed).

    Args:
        directory: The snapshot (e.g. ``result/snapshot_iter_12``).
        output: The file to write.
        model: The trainer's name of the model (``"main"`` for ``create_trainer``'s model);
            needed only when the snapshot holds several models.

    Returns:
        The exported state dict (host tensors).

    Raises:
        SnapshotError: ``directory`` does not exist ("not found"), the snapshot does not
            verify (a damaged file; a DCP directory without a manifest: unfinished or not a
            DCP snapshot), is not a readable snapshot, holds no model states, ``model`` is not
            in it, or ``output`` cannot be written (its directory is missing or not writable,
            it is the snapshot itself or inside the snapshot directory); checked before the
            snapshot is read.
        DiskFullError: The file system of ``output`` is full.

    Warns:
        SnapshotVerificationWarning: The snapshot file has no manifest (exported unverified).
    """
    directory = os.fspath(directory)
    output = os.fspath(output)
    if not os.path.exists(directory):
        raise SnapshotError(
            f"{directory} not found: there is no such file or directory. Name a snapshot "
            "file (e.g. result/snapshot_iter_12) or a SnapshotMode.DCP snapshot directory"
        )
    if os.path.isdir(directory):
        check_output(directory, output)
        models = export_models(directory)
    else:
        if os.path.realpath(output) == os.path.realpath(directory):
            raise SnapshotError(
                f"refusing to write {output}: it is the snapshot itself; name another file"
            )
        check_output(directory, output)
        models = _file_models(directory)
    weights = _chosen(directory, models, model)
    write_export(weights, output)
    return weights


def _file_models(path: str) -> dict[str, Any]:
    """The model states of the default-mode snapshot file ``path``, by name.

    A trainer's snapshot holds them under ``'models'``; a ``snapshot_object(model, ...)`` file
    is one model's state dict, returned under the name ``'target'``.
    """
    if parse_manifest(path) is None:
        warnings.warn(
            SnapshotVerificationWarning(
                f"{path} has no manifest (written by PPE, or a kill prevented ppe-core from "
                "writing it): exported unverified, nothing vouches for its weights"
            ),
            stacklevel=3,
        )
    else:
        try:
            verify_snapshot(path)
        except SnapshotError as exc:
            raise SnapshotError(
                f"refusing to export {path}: it does not verify, so its weights cannot be "
                f"trusted ({exc}). Export another snapshot of the series (autoload resumes "
                "from the newest one that verifies)."
            ) from exc
    state = load_snapshot(path, verify=False)  # verified above when it has a manifest
    if isinstance(state, Mapping) and isinstance(state.get("models"), Mapping):
        models = dict(state["models"])
    elif (
        isinstance(state, Mapping)
        and state
        and all(isinstance(value, torch.Tensor) for value in state.values())
    ):
        models = {"target": state}
    else:
        models = {}
    if not models:
        raise SnapshotError(f"{path}: the snapshot holds no model states")
    return models


def _chosen(directory: str, models: dict[str, Any], model: str | None) -> dict[str, torch.Tensor]:
    """The state of ``model`` (the only one when None)."""
    if model is None and len(models) > 1:
        raise SnapshotError(
            f"{directory} holds the models {sorted(models)}: name the one to export (model=)"
        )
    name = next(iter(models)) if model is None else model
    if name not in models:
        raise SnapshotError(f"{directory} holds no model {name!r}; it holds {sorted(models)}")
    return dict(models[name])
