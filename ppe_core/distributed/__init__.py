"""``ppe.distributed``: process-group set-up, rank helpers and samplers for torch.distributed."""

from __future__ import annotations

from ppe_core.distributed._devices import device_of, object_device
from ppe_core.distributed._env import (
    DEFAULT_TIMEOUT,
    ENV_TIMEOUT,
    WorldInfo,
    backend_for,
    barrier,
    gather_objects,
    get_local_rank,
    get_rank,
    get_world_size,
    group_world,
    init_from_env,
    is_distributed,
    is_main_process,
    require_group,
    require_object_collectives,
    run_collective,
    shutdown,
    timeout_error,
    timeouts_explained,
)
from ppe_core.distributed._initialize import initialize_ompi_environment
from ppe_core.distributed._sampler import (
    DistributedValidationSampler,
    create_distributed_subset_indices,
)
from ppe_core.errors import (
    CollectiveTimeoutError,
    DistributedEnvironmentError,
    ProcessGroupNotInitializedError,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "ENV_TIMEOUT",
    "CollectiveTimeoutError",
    "DistributedEnvironmentError",
    "DistributedValidationSampler",
    "ProcessGroupNotInitializedError",
    "WorldInfo",
    "backend_for",
    "barrier",
    "create_distributed_subset_indices",
    "device_of",
    "gather_objects",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "group_world",
    "init_from_env",
    "initialize_ompi_environment",
    "is_distributed",
    "is_main_process",
    "object_device",
    "require_group",
    "require_object_collectives",
    "run_collective",
    "shutdown",
    "timeout_error",
    "timeouts_explained",
]
