"""Splitting a dataset's indices between the ranks of a ``torch.distributed`` job."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch

from ppe_core.errors import ConfigurationError, ProcessGroupNotInitializedError

__all__ = [
    "DistributedValidationSampler",
    "ProcessGroupNotInitializedError",
    "create_distributed_subset_indices",
]


def _world(num_replicas: int | None, rank: int | None, what: str) -> tuple[int, int]:
    """Fills ``num_replicas``/``rank`` from the default process group when they are None."""
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        missing = ProcessGroupNotInitializedError(
            f"{what} needs num_replicas and rank, or an initialized torch.distributed "
            "process group to read them from; call torch.distributed.init_process_group() "
            "first or pass both"
        )
        if not dist.is_available():
            raise missing
        try:  # torch raises ValueError/RuntimeError when no default group exists
            if num_replicas is None:
                num_replicas = dist.get_world_size()
            if rank is None:
                rank = dist.get_rank()
        except (RuntimeError, ValueError) as exc:
            raise missing from exc
    if num_replicas < 1:
        raise ConfigurationError(f"{what}: num_replicas must be at least 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ConfigurationError(
            f"{what}: invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
        )
    return num_replicas, rank


def _split_bounds(length: int, parts: int, index: int) -> tuple[int, int]:
    """Bounds of part ``index`` when ``length`` items are cut into ``parts`` near-equal runs.

    The first ``length % parts`` runs get one item more, as ``numpy.array_split`` does.
    """
    size, extra = divmod(length, parts)
    begin = index * size + min(index, extra)
    return begin, begin + size + (1 if index < extra else 0)


class DistributedValidationSampler(torch.utils.data.Sampler[int]):
    """Gives each rank a disjoint part of the dataset: every sample is seen exactly once.

    Meant for evaluation (e.g. with ``DistributedEvaluator``): unlike
    ``torch.utils.data.DistributedSampler`` it neither pads nor repeats samples, so ranks may
    get one sample more or less than others. Do not use it for training, where every rank must
    run the same number of steps.

    Args:
        dataset: The dataset (only its length is used).
        num_replicas: Number of ranks; the default process group's world size when None.
        rank: This process's rank; the default process group's rank when None.
        shuffle: Permute the indices (the same permutation on every rank, from ``seed``)
            before splitting.
        seed: Seed of the permutation; ranks must agree on it.

    Raises:
        ProcessGroupNotInitializedError: ``num_replicas`` or ``rank`` is None and
            ``torch.distributed`` is not initialized.
        ConfigurationError: ``rank`` is not in ``[0, num_replicas)``.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.num_replicas, self.rank = _world(num_replicas, rank, "DistributedValidationSampler")
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.dataset_len = len(dataset)
        begin, end = _split_bounds(self.dataset_len, self.num_replicas, self.rank)
        self._begin, self._end = begin, end
        self.num_samples = end - begin

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed)
            order = torch.randperm(self.dataset_len, generator=generator)
            return iter(order[self._begin : self._end].tolist())
        return iter(range(self._begin, self._end))

    def __len__(self) -> int:
        return self.num_samples


def _shared_random_seed() -> int:
    """A random seed drawn on rank 0 and broadcast, so every rank shuffles alike."""
    import torch.distributed as dist

    seed = [int(torch.randint(0, 2**31, size=()).item())]
    if dist.is_available() and dist.is_initialized():
        # broadcast_object_list places the payload on the backend's device itself (NCCL).
        dist.broadcast_object_list(seed, src=0)
    return int(seed[0])


def _shuffled(length: int, seed: int) -> list[int]:
    try:
        import numpy as np
    except ImportError:  # numpy is optional; a torch permutation is as random, not as PPE's
        generator = torch.Generator()
        generator.manual_seed(seed)
        order: list[int] = torch.randperm(length, generator=generator).tolist()
        return order
    indices = list(range(length))
    # numpy's legacy generator: the same permutation PPE computes for the same seed.
    np.random.RandomState(seed).shuffle(indices)
    return indices


def create_distributed_subset_indices(
    num_total_samples: int,
    num_replicas: int | None = None,
    rank: int | None = None,
    shuffle: bool = True,
    seed: int | None = None,
) -> list[int]:
    """Returns the indices of a dataset this rank should use (e.g. for a ``Subset``).

    Every rank gets ``ceil(num_total_samples / num_replicas)`` indices starting at
    ``num_total_samples * rank // num_replicas`` of the (shuffled) index list, PPE's layout:
    the last rank may get fewer when the total is not divisible.

    Args:
        num_total_samples: Length of the dataset.
        num_replicas: Number of ranks; the default process group's world size when None.
        rank: This process's rank; the default process group's rank when None.
        shuffle: Permute the indices first, identically on every rank.
        seed: Seed of the permutation; when None, rank 0 draws one and broadcasts it (with an
            initialized process group) so the ranks agree.

    Returns:
        The indices for this rank.

    Raises:
        ProcessGroupNotInitializedError: ``num_replicas`` or ``rank`` is None and
            ``torch.distributed`` is not initialized.
        ConfigurationError: ``rank`` is not in ``[0, num_replicas)``.
    """
    num_replicas, rank = _world(num_replicas, rank, "create_distributed_subset_indices")
    if shuffle:
        indices = _shuffled(num_total_samples, _shared_random_seed() if seed is None else seed)
    else:
        indices = list(range(num_total_samples))
    per_rank = -(-num_total_samples // num_replicas)
    begin = num_total_samples * rank // num_replicas
    return indices[begin : begin + per_rank]
