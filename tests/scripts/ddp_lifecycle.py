"""A tiny DDP run that leaves the process group's lifecycle to ppe-core, for
test_distributed_lifecycle.py.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_lifecycle.py MODE

Two gloo ranks train a small MLP with DistributedDataParallel for 2 iterations, evaluate with a
distributed evaluator inside the run and once more after it, and return from ``main`` with no
teardown of their own. MODE:

- ``finish``: as above. Rank 1 is made slower (``DDP_TEST_LINGER`` seconds, default 0.2, before
  its last all-reduce), so rank 0 always reaches the end first, as in the runs that aborted.
- ``stall-train``: rank 1 freezes for ``DDP_TEST_STALL`` seconds (default 40) in its second
  training step; ``stall-eval``: in its first evaluation batch. Rank 0 prints ``waited N s``
  when the error reaches it and ``resumed`` is printed by rank 1 only if it wakes up. The
  frozen rank dies of torchrun's SIGTERM (sent once rank 0 failed), so the run ends then.

A check registered before ``init_from_env`` (so Python runs it after ppe-core's exit handler)
exits with status 3 if the process group is still alive then: it would be left to interpreter
finalization, where the backend's native threads can no longer take the GIL.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import ppe_core as ppe
from ppe_core.distributed import DistributedValidationSampler


def _group_gone_at_exit() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        print("process group still alive at interpreter exit", file=sys.stderr, flush=True)
        os._exit(3)


class Net(torch.nn.Module):
    """An MLP whose forward can freeze on rank 1, as a stuck data loader or device would."""

    def __init__(self, stall_in: str | None, stall_seconds: float) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )
        self.stall_in, self.stall_seconds = stall_in, stall_seconds
        self.calls = {"train": 0, "eval": 0}

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        phase = "train" if self.training else "eval"
        self.calls[phase] += 1
        frozen = phase == self.stall_in and self.calls[phase] == (2 if phase == "train" else 1)
        if frozen and ppe.distributed.get_rank() == 1:
            # The launcher's closing signal ends the frozen rank at once. ppe-core's handler
            # would only note it (a SIGTERM stops training after the iteration), and torchrun
            # would then wait 30 s before its SIGKILL: time spent on torchrun, not on the
            # behaviour under test (the other rank's timeout), which ends before the signal.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            time.sleep(self.stall_seconds)
            print("rank 1 resumed", flush=True)
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


def main() -> None:
    mode = sys.argv[1]
    atexit.register(_group_gone_at_exit)  # before init_from_env: runs after its exit handler
    world = ppe.distributed.init_from_env("cpu")
    stall_in = {"stall-train": "train", "stall-eval": "eval"}.get(mode)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=g)
    data = [{"x": x[i], "t": (x[i, 0] > 0).long()} for i in range(len(x))]
    train, val = data[:16], data[16:]
    torch.manual_seed(0)
    model = ppe.to(Net(stall_in, float(os.environ.get("DDP_TEST_STALL", "40"))), "cpu")
    wrapped = DistributedDataParallel(model)
    loader: Any = DataLoader(train, batch_size=4, sampler=DistributedSampler(train, seed=0))  # type: ignore[arg-type]
    val_loader: Any = DataLoader(val, batch_size=4, sampler=DistributedValidationSampler(val))  # type: ignore[arg-type]
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.1),
        1,
        evaluator=ppe.engine.create_evaluator(wrapped, distributed=True),
    )
    started = time.monotonic()
    try:
        trainer.run(loader, val_loader)
    except Exception:
        print(f"rank {world.rank} waited {time.monotonic() - started:.1f} s", flush=True)
        raise
    if world.rank == 1:
        time.sleep(float(os.environ.get("DDP_TEST_LINGER", "0.2")))
    means = trainer.evaluator.run(val_loader) if trainer.evaluator is not None else {}
    if world.rank == 0:
        print(f"val/loss {float(means['val/loss']):.4f}", flush=True)


if __name__ == "__main__":
    main()
