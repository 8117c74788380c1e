"""The process group from the launcher's environment, and rank helpers that work without one.

``torchrun`` exports ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; ``mpirun`` (Open MPI) exports ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``.
A script started with plain ``python`` has neither, and every helper here then answers as the
only process of a world of one, so the same script runs both ways.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, NamedTuple

import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError

__all__ = [
    "DistributedEnvironmentError",
    "WorldInfo",
    "backend_for",
    "barrier",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_from_env",
    "is_distributed",
    "is_main_process",
]

#: The port rank 0 listens on when an Open MPI job on one node does not export MASTER_PORT.
_DEFAULT_PORT = "29500"
#: Used where torch lacks ``Backend.default_device_backend_map``.
_FALLBACK_BACKENDS = {"cpu": "gloo"}


class DistributedEnvironmentError(ConfigurationError):
    """The launcher's environment variables cannot start a process group (a ``ValueError``)."""


class WorldInfo(NamedTuple):
    """``(world_size, rank, local_rank)`` of this process, in ``initialize_ompi_environment``'s
    order so both unpack alike."""

    world_size: int
    rank: int
    local_rank: int


def _group() -> Any:
    """``torch.distributed`` when its default process group exists, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _int_variable(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise DistributedEnvironmentError(
            f"environment variable {name}={text!r} is not an integer; launch with torchrun "
            f"(or mpirun), which sets it, or unset it to run as a single process"
        ) from None


def _launch_variables(env: Mapping[str, str]) -> tuple[str, int, int, int] | None:
    """``(launcher, world_size, rank, local_rank)`` from the environment, or None if unlaunched.

    torchrun's variables win over Open MPI's when both are present (torchrun under mpirun).
    """
    for launcher, prefix in (("torchrun", ""), ("mpirun", "OMPI_COMM_WORLD_")):
        size_name = "WORLD_SIZE" if not prefix else prefix + "SIZE"
        world_size = _int_variable(env, size_name)
        if world_size is None:
            continue
        rank_name = "RANK" if not prefix else prefix + "RANK"
        rank = _int_variable(env, rank_name)
        if rank is None:
            raise DistributedEnvironmentError(
                f"{size_name} is set ({world_size}) but {rank_name} is not; launch with "
                f"{launcher}, which sets both, or unset {size_name} to run as a single process"
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise DistributedEnvironmentError(
                f"{rank_name}={rank} is not a rank of a world of {size_name}={world_size} "
                f"processes (ranks are 0 to {world_size - 1}); check the launcher's arguments"
            )
        local_rank = _int_variable(env, "LOCAL_RANK" if not prefix else prefix + "LOCAL_RANK")
        return launcher, world_size, rank, local_rank if local_rank is not None else 0
    return None


def _rendezvous(env: Mapping[str, str], launcher: str, world_size: int) -> tuple[str, str]:
    """``(MASTER_ADDR, MASTER_PORT)``; defaults only where they cannot be wrong (one node)."""
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    one_node = launcher == "mpirun" and env.get("OMPI_COMM_WORLD_LOCAL_SIZE") == str(world_size)
    if not addr:
        if not one_node:
            raise DistributedEnvironmentError(
                f"WORLD_SIZE={world_size} is set but MASTER_ADDR is not, so the processes "
                "cannot find rank 0: launch with torchrun (it sets MASTER_ADDR/MASTER_PORT), "
                "or export MASTER_ADDR=<rank 0's host> and MASTER_PORT=<free port> (with "
                "mpirun: mpirun -x MASTER_ADDR -x MASTER_PORT ...)"
            )
        addr = "127.0.0.1"
    if not port:
        if not one_node:
            raise DistributedEnvironmentError(
                f"MASTER_ADDR={addr} is set but MASTER_PORT is not; export MASTER_PORT=<free "
                "port on rank 0's host> (torchrun sets it) and launch again"
            )
        port = _DEFAULT_PORT
    try:
        port_number = int(port)
    except ValueError:
        port_number = -1
    if not 0 < port_number < 65536:
        raise DistributedEnvironmentError(
            f"MASTER_PORT={port!r} is not a port number; export a free TCP port, e.g. 29500"
        )
    return addr, port


def backend_for(device: str | torch.device | None) -> str | None:
    """The collective backend PyTorch pairs with ``device``'s type (``None``: torch decides).

    ``"cpu"`` gives ``"gloo"``; accelerator types get the backend PyTorch lists for them
    (``torch.distributed.Backend.default_device_backend_map``). Only the device string is
    read: no device is queried.

    Raises:
        ConfigurationError: ``device`` is not a device string, or PyTorch knows no backend for
            its type.
    """
    if device is None:
        return None
    given: object = device  # checked at run time: callers need not be type-checked
    if not isinstance(given, (str, torch.device)):
        raise ArgumentTypeError(
            f"device must be a str or torch.device (e.g. 'cpu'), got {type(given).__name__}"
        )
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ConfigurationError(
            f"device {device!r} is not a device string; pass e.g. 'cpu' or a type with an "
            f"index such as 'cuda:0' ({exc})"
        ) from None
    import torch.distributed as dist

    known = dict(getattr(dist.Backend, "default_device_backend_map", _FALLBACK_BACKENDS))
    backend = known.get(kind)
    if backend is None:
        raise ConfigurationError(
            f"PyTorch has no collective backend for device type {kind!r} (it knows "
            f"{sorted(known)}); pass backend= explicitly"
        )
    return str(backend)


def init_from_env(
    device: str | torch.device | None = None,
    backend: str | None = None,
    *,
    timeout: float | timedelta | None = None,
) -> WorldInfo:
    """Creates the default process group from the launcher's environment, if launched.

    Under ``torchrun`` (``WORLD_SIZE``/``RANK`` set) or ``mpirun`` (``OMPI_COMM_WORLD_*`` set)
    it calls ``torch.distributed.init_process_group`` over ``MASTER_ADDR:MASTER_PORT``, also
    for a world of one, so DDP and the distributed evaluator work the same at every size.
    Started with plain ``python`` it does nothing and returns ``(1, 0, 0)`` at once. An existing
    group is kept (calling twice is harmless).

    Args:
        device: The device this process trains on; its type picks the backend (``"cpu"``:
            gloo, ``"cuda"``: nccl). ``None`` leaves the choice to PyTorch.
        backend: An explicit backend (``"gloo"``, ``"nccl"``, ...); overrides ``device``.
        timeout: Timeout of collective operations, in seconds or as a ``timedelta``;
            PyTorch's default when None.

    Returns:
        ``WorldInfo(world_size, rank, local_rank)``.

    Raises:
        DistributedEnvironmentError: The launch variables are inconsistent, e.g. ``WORLD_SIZE``
            without ``RANK`` or without ``MASTER_ADDR`` (a ``ValueError``).
        ConfigurationError: ``device`` or ``backend`` cannot be used.
    """
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ArgumentTypeError(
            f"backend must be a backend name such as 'gloo' or 'nccl', got {backend!r}; or "
            "leave it out and pass device= to pick it"
        )
    env = os.environ
    launched = _launch_variables(env)
    group = _group()
    if group is not None:
        return WorldInfo(
            int(group.get_world_size()),
            int(group.get_rank()),
            launched[3] if launched is not None else 0,
        )
    if launched is None:
        return WorldInfo(1, 0, 0)
    launcher, world_size, rank, local_rank = launched
    chosen = backend if backend is not None else backend_for(device)
    addr, port = _rendezvous(env, launcher, world_size)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = timedelta(seconds=timeout)
    elif timeout is not None and not isinstance(timeout, timedelta):
        raise ArgumentTypeError(
            f"timeout must be seconds or a datetime.timedelta, got {type(timeout).__name__}"
        )
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedEnvironmentError(
            f"launched by {launcher} (WORLD_SIZE={world_size}) but this PyTorch build has no "
            "torch.distributed; install a PyTorch build with distributed support"
        )
    if launcher == "torchrun":
        # env:// joins the store torchrun's agent already serves on MASTER_PORT
        # (TORCHELASTIC_USE_AGENT_STORE); a tcp:// URL would try to serve that port again.
        url = "env://"
    else:
        url = f"tcp://[{addr}]:{port}" if ":" in addr else f"tcp://{addr}:{port}"
    dist.init_process_group(
        chosen, init_method=url, world_size=world_size, rank=rank, timeout=timeout
    )
    return WorldInfo(world_size, rank, local_rank)


def is_distributed() -> bool:
    """Whether the default ``torch.distributed`` process group exists."""
    return _group() is not None


def get_rank() -> int:
    """This process's global rank: the group's, else the launcher's ``RANK``, else 0."""
    group = _group()
    if group is not None:
        return int(group.get_rank())
    launched = _launch_variables(os.environ)
    return launched[2] if launched is not None else 0


def get_world_size() -> int:
    """The number of processes: the group's, else the launcher's ``WORLD_SIZE``, else 1."""
    group = _group()
    if group is not None:
        return int(group.get_world_size())
    launched = _launch_variables(os.environ)
    return launched[1] if launched is not None else 1


def get_local_rank() -> int:
    """This process's rank on its node (``LOCAL_RANK``), e.g. to pick ``f"cuda:{n}"``; else 0."""
    launched = _launch_variables(os.environ)
    return launched[3] if launched is not None else 0


def is_main_process() -> bool:
    """Whether this process is rank 0 (True when not distributed): the one that writes output."""
    return get_rank() == 0


def barrier() -> None:
    """Waits until every rank arrives; does nothing without a process group."""
    group = _group()
    if group is not None:
        group.barrier()
