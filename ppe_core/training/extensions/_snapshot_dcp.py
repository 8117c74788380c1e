"""The files of ``SnapshotMode.DCP`` snapshots: directories written by
``torch.distributed.checkpoint`` (DCP), each rank its own shards, verified by a manifest.

A snapshot is written into a hidden temporary directory (``.<name>.dcp-tmp``) and renamed to
``<name>`` by the saver once every rank's shards and the manifest (size and SHA-256 of every
file) are in it, so a run killed during a save leaves the previous snapshot as the newest
complete one. The models' and optimizers' states go through DCP (resharded on load at another
world size); the rest of the manager's state (counters, extensions, this rank's RNG and loader
states) is one small ``rank<N>.pt`` per rank. ``torch.distributed.checkpoint`` is imported when
a snapshot of this mode is used. Never called per step.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ppe_core.errors import ConfigurationError, SnapshotError, SnapshotVerificationWarning
from ppe_core.training.extensions._snapshot_manifest import file_digest
from ppe_core.training.extensions._snapshot_retention import glob_pattern

__all__ = [
    "MANIFEST_NAME",
    "export_snapshot",
    "newest_valid",
    "publish",
    "remove_leftovers",
    "rest_file",
    "restore_tensor_state",
    "retain",
    "temporary_dir",
    "tensor_owners",
    "tensor_state",
    "verify",
    "verify_world",
    "write_manifest",
]

#: The manifest inside each snapshot directory: every other file's size and SHA-256.
MANIFEST_NAME = ".ppe_core_manifest.json"
_FORMAT = "ppe-core-dcp/1"
_TEMPORARY = ".dcp-tmp"


def temporary_dir(path: str) -> str:
    """Where the snapshot ``path`` is written before it is renamed into place."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}{_TEMPORARY}")


def rest_file(directory: str, rank: int) -> str:
    """The file of ``rank``'s state besides the models' and optimizers' tensors."""
    return os.path.join(directory, f"rank{rank}.pt")


def tensor_owners(
    models: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]
) -> dict[str, str]:
    """Optimizer name -> the name of the model whose parameters it holds (DCP's pairing)."""
    owner = {id(p): name for name, model in models.items() for p in model.parameters()}
    pairs: dict[str, str] = {}
    for name, optimizer in optimizers.items():
        held = {owner.get(id(p)) for group in optimizer.param_groups for p in group["params"]}
        model = next(iter(held)) if len(held) == 1 else None
        if model is None:
            raise ConfigurationError(
                f"SnapshotMode.DCP saves each optimizer with the one model whose parameters it "
                f"holds, and optimizers[{name!r}] holds parameters of "
                f"{sorted(map(str, held))} (None: of no model the trainer has); give each "
                "model its own optimizer, or use SnapshotMode.SHARDED"
            )
        pairs[name] = model
    return pairs


def tensor_state(
    models: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]
) -> dict[str, Any]:
    """The models' and optimizers' states as DCP saves and loads them (optimizer states keyed
    by parameter names, initialized when empty, so that a fresh run can load into them)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    pairs = tensor_owners(models, optimizers)
    return {
        "models": {name: get_model_state_dict(model) for name, model in models.items()},
        "optimizers": {
            name: get_optimizer_state_dict(models[pairs[name]], optimizer)
            for name, optimizer in optimizers.items()
        },
    }


def stage_storageless(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each device tensor that has no storage of its own copied to the host.

    DCP's asynchronous stager copies a tensor through its storage; a device tensor without one
    (XLA, MTIA, a Python-emulated device) comes out as uninitialised memory, with no error.
    Such tensors are copied here, on the training thread (DTensors are staged by their local
    shards, which DCP handles).
    """
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map

    def host(value: Any) -> Any:
        if (
            isinstance(value, torch.Tensor)
            and not isinstance(value, DTensor)
            and value.device.type != "cpu"
            and value.numel()
            and value.data_ptr() == 0
        ):
            return value.cpu()
        return value

    staged: dict[str, Any] = tree_map(host, state)
    return staged


def restore_tensor_state(
    models: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer],
    state: Mapping[str, Any],
) -> None:
    """Loads what :func:`tensor_state` gave (filled by ``dcp.load``) into the objects."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    pairs = tensor_owners(models, optimizers)
    for name, model in models.items():
        set_model_state_dict(model, state["models"][name])
    for name, optimizer in optimizers.items():
        set_optimizer_state_dict(models[pairs[name]], optimizer, state["optimizers"][name])


def write_manifest(directory: str, iteration: int, world_size: int) -> None:
    """Hashes every file under ``directory`` into its manifest (written last)."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            size, sha256 = file_digest(path)
            files[os.path.relpath(path, directory)] = {"size": size, "sha256": sha256}
    manifest = {
        "format": _FORMAT,
        "iteration": iteration,
        "world_size": world_size,
        "files": dict(sorted(files.items())),
    }
    with open(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def verify(directory: str) -> dict[str, Any]:
    """The manifest of the snapshot ``directory`` once every file it lists matches.

    Raises:
        SnapshotError: The manifest is missing or unreadable, or a file is missing, of another
            size or another SHA-256 (a damaged shard), or not listed.
    """
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        if manifest.get("format") != _FORMAT or not isinstance(files, dict):
            raise ValueError(f"not a {_FORMAT} manifest")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"{directory}: no readable snapshot manifest ({exc})") from exc
    present = {
        os.path.relpath(os.path.join(root, name), directory)
        for root, _, names in os.walk(directory)
        for name in names
    } - {MANIFEST_NAME}
    if present != set(files):
        raise SnapshotError(
            f"{directory}: the files differ from the manifest's (missing: "
            f"{sorted(set(files) - present)}, not listed: {sorted(present - set(files))})"
        )
    for name, expected in files.items():
        size, sha256 = file_digest(os.path.join(directory, name))
        if (size, sha256) != (expected.get("size"), expected.get("sha256")):
            raise SnapshotError(
                f"{directory}: {name} is damaged (size {size}, SHA-256 {sha256[:12]}...; the "
                f"manifest says size {expected.get('size')}, "
                f"{str(expected.get('sha256'))[:12]}...)"
            )
    return dict(manifest)


def verify_world(directory: str) -> int:
    """The number of processes that wrote the (verified) snapshot ``directory``."""
    with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as f:
        return int(json.load(f)["world_size"])


def publish(temporary: str, path: str) -> None:
    """Renames the complete ``temporary`` directory to ``path`` (replacing an older one)."""
    if os.path.lexists(path):  # a run without autoload saving again at the same name
        old = f"{temporary}.old"
        os.rename(path, old)
        os.rename(temporary, path)
        shutil.rmtree(old)
    else:
        os.rename(temporary, path)


def _complete(out_dir: str, template: str) -> list[tuple[int, str]]:
    """``(iteration, path)`` of the directories of the series with a manifest, newest first."""
    found = []
    for path in glob.glob(os.path.join(out_dir, glob_pattern(template))):
        try:
            with open(os.path.join(path, MANIFEST_NAME), encoding="utf-8") as f:
                iteration = int(json.load(f)["iteration"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a snapshot of this mode (verify reports damaged manifests below)
        found.append((iteration, path))
    return sorted(found, reverse=True)


def newest_valid(out_dir: str, template: str) -> str | None:
    """The newest snapshot directory of the series that verifies; a damaged one is skipped
    with a :class:`SnapshotVerificationWarning` (resume falls back to the one before)."""
    for _, path in _complete(out_dir, template):
        try:
            verify(path)
        except SnapshotError as exc:
            warnings.warn(
                SnapshotVerificationWarning(f"skipping snapshot {path}: {exc}"), stacklevel=4
            )
            continue
        return path
    return None


def retain(out_dir: str, template: str, n_retains: int) -> None:
    """Removes all but the newest ``n_retains`` complete snapshots (all kept when <= 0)."""
    if n_retains > 0:
        for _, path in _complete(out_dir, template)[n_retains:]:
            shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(out_dir: str, template: str) -> None:
    """Removes the temporary directories of saves a killed run left unfinished."""
    for path in glob.glob(temporary_dir(os.path.join(out_dir, glob_pattern(template)))):
        shutil.rmtree(path, ignore_errors=True)


def _full_state(directory: str) -> dict[str, Any]:
    """Every tensor of the DCP checkpoint in ``directory``, whole, in this process's memory."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(directory),
        planner=_EmptyStateDictLoadPlanner(),  # type: ignore[no-untyped-call]
        no_dist=True,  # one process, no process group: DCP's own conversion (dcp_to_torch_save)
    )
    return state


def export_snapshot(
    directory: str | os.PathLike[str],
    output: str | os.PathLike[str],
    model: str | None = None,
) -> dict[str, torch.Tensor]:
    """Writes one model's weights from a ``SnapshotMode.DCP`` snapshot as one ordinary file.

    The snapshot directory is verified first (every file's size and SHA-256 against its
    manifest); then the model's shards of every rank are read and joined into full tensors in
    this process (no process group, any number of saving ranks) and saved with ``torch.save``
    as a plain state dict, keyed as ``model.state_dict()`` of the unwrapped model (no FSDP or
    DDP prefixes): ``model.load_state_dict(torch.load(output))`` restores it, for inference
    or in PPE. The file appears atomically (written beside ``output``, then renamed).

    Args:
        directory: The snapshot's directory (e.g. ``result/snapshot_iter_12``).
        output: The file to write.
        model: The trainer's name of the model (``"main"`` for ``create_trainer``'s model);
            needed only when the snapshot holds several models.

    Returns:
        The exported state dict (host tensors).

    Raises:
        SnapshotError: The snapshot does not verify (no manifest: unfinished or not a DCP
            snapshot; a file damaged, missing or not listed), or ``model`` is not in it.
    """
    directory = os.fspath(directory)
    try:
        verify(directory)
    except SnapshotError as exc:
        raise SnapshotError(
            f"refusing to export {directory}: it does not verify, so its weights cannot be "
            f"trusted ({exc}). Export another snapshot of the series (autoload resumes from "
            "the newest one that verifies)."
        ) from exc
    models = _full_state(directory).get("models")
    if not isinstance(models, dict) or not models:
        raise SnapshotError(f"{directory}: the snapshot holds no model states")
    if model is None and len(models) > 1:
        raise SnapshotError(
            f"{directory} holds the models {sorted(models)}: name the one to export (model=)"
        )
    name = next(iter(models)) if model is None else model
    if name not in models:
        raise SnapshotError(f"{directory} holds no model {name!r}; it holds {sorted(models)}")
    weights = dict(models[name])
    output = os.fspath(output)
    temporary = f"{output}.tmp{os.getpid()}"
    try:
        torch.save(weights, temporary)
        os.replace(temporary, output)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return weights
