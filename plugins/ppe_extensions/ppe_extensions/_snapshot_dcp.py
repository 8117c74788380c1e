"""The files of ``SnapshotMode.DCP`` snapshots: directories written by
``torch.distributed.checkpoint`` (DCP), each rank its own shards, verified by a manifest.

A snapshot is written into a hidden temporary directory (``.<name>.<host>-<pid>.dcp-tmp``,
the saver's host and process) and renamed to ``<name>`` by the saver once every rank's shards
and the manifest (size and SHA-256 of every file) are in it, so a run killed during a save
leaves the previous snapshot as the newest complete one; the next run removes the temporary
directory once its writer is dead (the rule of the writers' temporary files). The models' and
optimizers' states go through DCP (resharded on load at another world size); the rest of the
manager's state (counters, extensions, this rank's RNG and loader states) is one small
``rank<N>.pt`` per rank. ``torch.distributed.checkpoint`` is imported when a snapshot of this
mode is used. Never called per step.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ppe_core.errors import (
    ConfigurationError,
    DiskFullError,
    SnapshotError,
    SnapshotVerificationWarning,
)
from ppe_core.writing import HOST_TAG, disk_full_error, process_is_dead
from ppe_extensions._snapshot_manifest import file_digest
from ppe_extensions._snapshot_retention import (
    glob_pattern,
    in_series,
    series_paths,
)

__all__ = [
    "MANIFEST_NAME",
    "check_fits",
    "check_output",
    "disk_full",
    "export_models",
    "newest_valid",
    "publish",
    "read_manifest",
    "remove_leftovers",
    "rest_file",
    "restore_tensor_state",
    "retain",
    "temporary_dir",
    "tensor_owners",
    "tensor_state",
    "verify",
    "verify_world",
    "write_export",
    "write_manifest",
    "writer_tag",
]

#: The manifest inside each snapshot directory: every other file's size and SHA-256.
MANIFEST_NAME = ".ppe_core_manifest.json"
_FORMAT = "ppe-core-dcp/1"
_TEMPORARY = ".dcp-tmp"
#: A temporary directory (or the older snapshot ``publish`` moves aside): who wrote it.
_TEMPORARY_NAME = re.compile(
    r"\.(?P<name>.+)\.(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)" + re.escape(_TEMPORARY) + r"(?:\.old)?"
)
#: The files of the format: DCP's shards and metadata, each rank's rest of the state. Other
#: files in a snapshot directory (``.DS_Store``, notes) are not the snapshot's and are ignored.
_PART = re.compile(r"[^/]+\.distcp|\.metadata|rank[0-9]+\.pt")


def writer_tag() -> str:
    """This process's host tag and pid, as the saver puts them in the temporary name."""
    return f"{HOST_TAG}-{os.getpid()}"


def temporary_dir(path: str, writer: str) -> str:
    """Where the snapshot ``path`` is written before it is renamed into place, by the saver
    of ``writer`` (:func:`writer_tag`; all ranks write into the saver's directory)."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{writer}{_TEMPORARY}")


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


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _manifest_problem(manifest: Any) -> str | None:
    """What makes ``manifest`` (parsed JSON) not a manifest of this format, or None."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    if manifest.get("format") != _FORMAT:
        return f"format {manifest.get('format')!r}, not {_FORMAT!r}"
    for key, least in (("iteration", 0), ("world_size", 1)):
        if not _count(manifest.get(key), least):
            return f"{key} {manifest.get(key)!r} is not an integer >= {least}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return f"files is {type(files).__name__}, not an object"
    for name, entry in files.items():
        if not (
            isinstance(entry, dict)
            and _count(entry.get("size"), 0)
            and isinstance(entry.get("sha256"), str)
        ):
            return f"the entry of {name!r} is not {{'size': int, 'sha256': str}}: {entry!r}"
    return None


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of the snapshot ``directory``, checked to be of this format.

    Raises:
        SnapshotError: It is missing, not JSON, or of another shape or types.
    """
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{directory}: no readable snapshot manifest ({exc})") from exc
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise SnapshotError(
            f"{directory}: no readable snapshot manifest ({MANIFEST_NAME}: {problem})"
        )
    return dict(manifest)


def verify(directory: str) -> dict[str, Any]:
    """The manifest of the snapshot ``directory`` once every file it lists matches.

    Files that are not of the format (``.DS_Store``, a note) are ignored; a shard or rank
    file the manifest does not list is an error (it would be read unverified).

    Raises:
        SnapshotError: The manifest is missing or unreadable, or a file is missing, of another
            size or another SHA-256 (a damaged shard), or a part of the format not listed.
    """
    manifest = read_manifest(directory)
    files: dict[str, dict[str, Any]] = manifest["files"]
    present = {
        name
        for name in os.listdir(directory)
        if _PART.fullmatch(name) and os.path.isfile(os.path.join(directory, name))
    }
    missing = sorted(name for name in files if not os.path.isfile(os.path.join(directory, name)))
    unlisted = sorted(present - set(files))
    if missing or unlisted:
        raise SnapshotError(
            f"{directory}: the files differ from the manifest's (missing: {missing}, not "
            f"listed: {unlisted})"
        )
    for name, expected in files.items():
        size, sha256 = file_digest(os.path.join(directory, name))
        if (size, sha256) != (expected["size"], expected["sha256"]):
            raise SnapshotError(
                f"{directory}: {name} is damaged (size {size}, SHA-256 {sha256[:12]}...; the "
                f"manifest says size {expected['size']}, {expected['sha256'][:12]}...)"
            )
    return manifest


def verify_world(directory: str) -> int:
    """The number of processes that wrote the (verified) snapshot ``directory``."""
    return int(read_manifest(directory)["world_size"])


def publish(temporary: str, path: str) -> None:
    """Renames the complete ``temporary`` directory to ``path`` (replacing an older one)."""
    if os.path.lexists(path):  # a run without autoload saving again at the same name
        old = f"{temporary}.old"
        os.rename(path, old)
        os.rename(temporary, path)
        shutil.rmtree(old)
    else:
        os.rename(temporary, path)


def _complete(out_dir: str, template: str, warn: bool = False) -> list[tuple[int, str]]:
    """``(iteration, path)`` of the directories of the series with a manifest, newest first;
    with ``warn``, each other path of the series' names is skipped with a warning."""
    found = []
    for path in series_paths(out_dir, template):  # whole names only: never a user's copy
        try:
            iteration = int(read_manifest(path)["iteration"])
        except SnapshotError as exc:
            if warn:
                warnings.warn(
                    SnapshotVerificationWarning(f"skipping snapshot {path}: {exc}"), stacklevel=5
                )
            continue
        found.append((iteration, path))
    return sorted(found, reverse=True)


def newest_valid(out_dir: str, template: str) -> str | None:
    """The newest snapshot directory of the series that verifies; a damaged one (a file or
    its manifest) is skipped with a :class:`SnapshotVerificationWarning` naming it (resume
    falls back to the one before)."""
    for _, path in _complete(out_dir, template, warn=True):
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


def remove_leftovers(out_dir: str, template: str) -> list[str]:
    """Removes the temporary directories of saves a killed run left unfinished, when their
    saver's process is dead on this host (a live run's, another host's stay), as the writers
    remove their temporary files. POSIX only, as they do.

    Returns:
        The removed paths.
    """
    if os.name != "posix":
        return []
    removed = []
    pattern = temporary_dir(os.path.join(glob.escape(out_dir), glob_pattern(template)), "*")
    for path in glob.glob(pattern) + glob.glob(f"{pattern}.old"):
        match = _TEMPORARY_NAME.fullmatch(os.path.basename(path))
        if (
            match  # of this series only (another series' run removes its own)
            and in_series(template, out_dir, os.path.join(os.path.dirname(path), match["name"]))
            and match["host"] == HOST_TAG
            and process_is_dead(int(match["pid"]))
        ):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def disk_full(exc: BaseException, path: str) -> DiskFullError | None:
    """A :class:`DiskFullError` naming the snapshot directory ``path`` if ``exc`` (DCP's
    ``CheckpointException`` around each rank's failure, or a failure of its own) was caused
    by a full file system. Call it before the partial files are removed."""
    failures = getattr(exc, "failures", None)
    causes = [exc] + (
        [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        if isinstance(failures, Mapping)
        else []
    )
    for cause in causes:
        if isinstance(cause, BaseException):
            full = disk_full_error(cause, path)
            if full is not None:
                return full
    return None


def _listed(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def check_fits(directory: str, state: Mapping[str, Any]) -> None:
    """Refuses to load the DCP snapshot ``directory`` into ``state`` (:func:`tensor_state`)
    when its models' tensors are not those of the models: other keys or shapes (another
    architecture), which DCP would report as a ``CheckpointException`` of its plan, or load
    in part.

    Raises:
        SnapshotError: Naming the snapshot and, per model, the keys that do not fit.
    """
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = FileSystemReader(directory).read_metadata().state_dict_metadata
    problems = []
    for name, model in state["models"].items():
        prefix = f"models.{name}."
        ours = {k: list(v.shape) for k, v in model.items() if isinstance(v, torch.Tensor)}
        theirs = {
            key[len(prefix) :]: list(meta.size)
            for key, meta in saved.items()
            if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
        }
        if not theirs:
            problems.append(f"models[{name!r}] is not in it")
            continue
        missing = sorted(set(ours) - set(theirs))
        extra = sorted(set(theirs) - set(ours))
        shapes = [
            f"{k} (saved {theirs[k]}, this run {ours[k]})"
            for k in sorted(set(ours) & set(theirs))
            if ours[k] != theirs[k]
        ]
        found = [
            f"other shapes: {_listed(shapes)}" if shapes else "",
            f"missing from the snapshot: {_listed(missing)}" if missing else "",
            f"not in this run's model: {_listed(extra)}" if extra else "",
        ]
        if shapes or missing or extra:
            problems.append(f"models[{name!r}]: " + "; ".join(p for p in found if p))
    if problems:
        raise SnapshotError(
            f"the DCP snapshot {directory} holds other models than this run's (another "
            f"architecture?): {'. '.join(problems)}"
        )


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


def export_models(directory: str) -> dict[str, Any]:
    """The model states of the ``SnapshotMode.DCP`` snapshot ``directory``, once it verifies
    (every file's size and SHA-256 against its manifest), each model's shards of every rank
    joined into full tensors in this process (no process group, any number of saving ranks),
    keyed as ``model.state_dict()`` of the unwrapped model (no FSDP or DDP prefixes).

    Raises:
        SnapshotError: The snapshot does not verify (no manifest: unfinished or not a DCP
            snapshot; a file damaged, missing or not listed), or holds no model states.
    """
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
    return models


def write_export(weights: dict[str, torch.Tensor], output: str) -> None:
    """``torch.save``-s ``weights`` as ``output``, atomically (beside it, then renamed).

    Raises:
        SnapshotError: ``output`` cannot be written.
        DiskFullError: The file system of ``output`` is full.
    """
    temporary = f"{output}.tmp{os.getpid()}"
    try:
        torch.save(weights, temporary)
        os.replace(temporary, output)
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as RuntimeError
        full = disk_full_error(exc, output)
        if full is not None:
            raise full from exc
        raise SnapshotError(f"cannot write {output}: {exc}") from exc
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def check_output(directory: str, output: str) -> None:
    """Refuses, before the snapshot is read, an ``output`` that cannot or must not be written."""
    parent = os.path.dirname(os.path.abspath(output))
    snapshot = os.path.realpath(directory)
    if os.path.commonpath([os.path.realpath(output), snapshot]) == snapshot:
        raise SnapshotError(
            f"refusing to write {output} inside the snapshot directory {directory}: the "
            "snapshot is verified file by file, and a file written there would damage it or "
            "be taken for a part of it. Write the export elsewhere (e.g. beside the snapshot)"
        )
    if os.path.isdir(output):
        raise SnapshotError(
            f"cannot write {output}: it is a directory; name the file to write, e.g. "
            f"{os.path.join(output, 'model.pt')}"
        )
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise SnapshotError(
            f"cannot write {output}: its directory {parent} {what}; create the directory "
            "first, or name a file in an existing one"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SnapshotError(
            f"cannot write {output}: no permission to create files in {parent}; name a file "
            "in a directory you can write to"
        )
