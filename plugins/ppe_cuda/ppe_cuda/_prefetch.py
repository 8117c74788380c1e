"""``PrefetchLoader``: copies the next batch to the GPU on a side stream while the current one
is computed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ppe_core.runtime import DeviceLike, device_type_of, map_tensors

__all__ = ["PrefetchLoader"]


class PrefetchLoader:
    """Wraps a loader so each batch is already on the GPU when the training step wants it.

    While step ``i`` runs on the current stream, batch ``i + 1`` is copied host-to-device on a
    side stream (``non_blocking``; use ``DataLoader(pin_memory=True)`` so the copy is truly
    asynchronous). Before a batch is yielded the current stream waits for its copy and the
    tensors are recorded on the current stream, so the caching allocator does not reuse their
    memory early. The runtime's ``convert_batch`` then finds the tensors on the device and
    does not copy them again. Nested dicts, lists, tuples and namedtuples are handled.

    ``len()`` and attribute access (``sampler``, ``batch_sampler``, ``dataset``, ...) are those
    of the wrapped loader, so the trainer's epoch length and ``DistributedSampler.set_epoch``
    work unchanged.

    Args:
        loader: The batches (usually a ``torch.utils.data.DataLoader``).
        device: The CUDA device to copy to.
        channels_last: Also convert 4-D tensors to ``torch.channels_last``.

    Raises:
        CUDAUnavailableError: CUDA cannot be used here (checked when created).

    Example:
        >>> loader = PrefetchLoader(DataLoader(dataset, batch_size=64, pin_memory=True))
        >>> trainer.run(loader)  # doctest: +SKIP
    """

    def __init__(
        self, loader: Iterable[Any], device: DeviceLike = "cuda", *, channels_last: bool = False
    ) -> None:
        from ppe_core.errors import ConfigurationError
        from ppe_cuda._runtime import _require_cuda

        if device_type_of(device) != "cuda":
            raise ConfigurationError(
                f"PrefetchLoader copies to CUDA devices, got device={device!r}; pass 'cuda' or "
                "'cuda:N' (on the CPU there is nothing to prefetch: use the loader itself)"
            )
        _require_cuda(device)
        self.loader = loader
        self.device = torch.device(device)
        self.channels_last = channels_last

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Only called for names not found on the wrapper: the loader's sampler, dataset, ...
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.channels_last and tensor.dim() == 4:
            return tensor.to(self.device, non_blocking=True, memory_format=torch.channels_last)
        return tensor.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[Any]:
        stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        batches = iter(self.loader)
        end = object()

        def load() -> Any:
            batch = next(batches, end)
            if batch is end:
                return end
            with torch.cuda.stream(stream):
                return map_tensors(batch, self._copy)

        upcoming = load()
        while upcoming is not end:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)
            batch = upcoming

            def keep(tensor: torch.Tensor, current: Any = current) -> torch.Tensor:
                tensor.record_stream(current)
                return tensor

            map_tensors(batch, keep)
            upcoming = load()  # the next copy overlaps this batch's step
            yield batch
