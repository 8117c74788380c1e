"""``initialize_ompi_environment``: ``torch.distributed`` set-up for jobs launched by ``mpirun``."""

from __future__ import annotations

import os
from datetime import timedelta

from ppe_core.errors import ConfigurationError

__all__ = ["initialize_ompi_environment"]

_BACKENDS = ("gloo", "nccl")
_INIT_METHODS = ("tcp", "env")


def initialize_ompi_environment(
    *,
    backend: str = "gloo",
    init_method: str = "tcp",
    world_size: int = 1,
    rank: int = 0,
    local_rank: int = 0,
    addr: str = "localhost",
    port: str = "1234",
    timeout: int = 1800,
) -> tuple[int, int, int]:
    """Initializes ``torch.distributed`` from Open MPI's environment variables.

    ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_RANK`` and ``OMPI_COMM_WORLD_LOCAL_RANK``
    (set by ``mpirun``) override ``world_size``, ``rank`` and ``local_rank``;
    ``MASTER_ADDR``/``MASTER_PORT`` override ``addr``/``port``. The default process group
    is created (followed by a barrier) only when the world has more than one process and no
    group exists yet. With ``init_method="env"`` the ``MASTER_*``, ``WORLD_SIZE``, ``RANK``
    and ``LOCAL_RANK`` variables are exported for ``env://``.

    Args:
        backend: ``"gloo"`` or ``"nccl"``.
        init_method: ``"tcp"`` (``tcp://addr:port``) or ``"env"`` (``env://``).
        world_size: World size when not launched by ``mpirun``.
        rank: Rank when not launched by ``mpirun``.
        local_rank: Rank within the node when not launched by ``mpirun``.
        addr: Address of rank 0.
        port: Port of rank 0.
        timeout: Timeout of collective operations, in seconds.

    Returns:
        ``(world_size, rank, local_rank)``.

    Raises:
        ConfigurationError: ``backend`` or ``init_method`` is not one of the supported values.
    """
    env = os.environ
    world_size = int(env.get("OMPI_COMM_WORLD_SIZE", world_size))
    rank = int(env.get("OMPI_COMM_WORLD_RANK", rank))
    local_rank = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", local_rank))
    addr = env.get("MASTER_ADDR", addr)
    port = env.get("MASTER_PORT", port)
    if backend not in _BACKENDS:
        raise ConfigurationError(
            f"Invalid value for backend {backend!r}, only 'gloo' and 'nccl' are supported"
        )
    if init_method not in _INIT_METHODS:
        raise ConfigurationError(
            f"Invalid value for init_method {init_method!r}, only 'env' and 'tcp' are supported"
        )
    if init_method == "env":
        url = "env://"
        env.update(
            MASTER_ADDR=addr,
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world_size),
            RANK=str(rank),
            LOCAL_RANK=str(local_rank),
        )
    else:
        url = f"tcp://{addr}:{port}"
    if world_size > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                init_method=url,
                world_size=world_size,
                rank=rank,
                timeout=timedelta(seconds=timeout),
            )
            dist.barrier()
    return world_size, rank, local_rank
