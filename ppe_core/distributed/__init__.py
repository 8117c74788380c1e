"""``ppe.distributed``: samplers, subsets and set-up helpers for ``torch.distributed`` jobs."""

from __future__ import annotations

from ppe_core.distributed._initialize import initialize_ompi_environment
from ppe_core.distributed._sampler import (
    DistributedValidationSampler,
    ProcessGroupNotInitializedError,
    create_distributed_subset_indices,
)

__all__ = [
    "DistributedValidationSampler",
    "ProcessGroupNotInitializedError",
    "create_distributed_subset_indices",
    "initialize_ompi_environment",
]
