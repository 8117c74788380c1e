"""Data-parallel training that runs alone or under torchrun (gloo), used by test_distributed.py.

Usage: [python -m torch.distributed.run --standalone --nproc_per_node=2] ddp_training.py OUT

Trains a small MLP for 3 epochs (``--epochs``) on 64 synthetic samples, evaluating on an
odd-sized validation set of 37 (ranks get 19 and 18 samples in batches of 5), snapshots every
4 iterations with autoload, and writes ``OUT/rank{N}.pt``: final weights, the evaluator's means,
the files this rank wrote, and the snapshot it resumed from. With the environment variable
``DDP_TEST_EXIT_AT_ITERATION=N`` every rank exits hard (``os._exit``) at iteration N + 1, just
after snapshot N: a crash to resume from. ``DDP_TEST_OUT_PER_RANK=1`` gives each rank its own
``OUT/r{rank}`` directory.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import ppe_core as ppe
from ppe_core.distributed import DistributedValidationSampler
from ppe_core.writing import SimpleWriter

N_TRAIN, N_VAL = 64, 37


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


def dataset() -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """The same synthetic samples in every process: ``(train, validation)``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_TRAIN + N_VAL, 4, generator=g)
    t = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    data = [{"x": x[i], "t": t[i]} for i in range(len(x))]
    return data[:N_TRAIN], data[N_TRAIN:]


class RecordingWriter(SimpleWriter):
    """A SimpleWriter remembering the names of the files this process wrote."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.files: list[str] = []

    def __call__(
        self, filename: str, out_dir: str, target: Any, *, savefun: Any = None, append: bool = False
    ) -> None:
        self.files.append(filename)
        super().__call__(filename, out_dir, target, savefun=savefun, append=append)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    world = ppe.distributed.init_from_env("cpu")  # (1, 0, 0) under plain python
    distributed = ppe.distributed.is_distributed()
    if os.environ.get("DDP_TEST_OUT_PER_RANK"):  # a misconfiguration autoload must catch
        args.out = os.path.join(args.out, f"r{world.rank}")
        os.makedirs(args.out, exist_ok=True)
    train, val = dataset()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = ppe.to(Net(), "cpu")
    wrapped: torch.nn.Module = DistributedDataParallel(model) if distributed else model
    E = ppe.training.extensions
    snapshot = E.snapshot(autoload=True, filename="snapshot_{.iteration}")
    writer = RecordingWriter(out_dir=args.out)
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.2),
        args.epochs,
        out_dir=args.out,
        writer=writer,
        extensions=[E.LogReport()],
        evaluator=ppe.engine.create_evaluator(wrapped, distributed=distributed),
    )
    trainer.extend(snapshot, trigger=(4, "iteration"))
    exit_at = os.environ.get("DDP_TEST_EXIT_AT_ITERATION")
    if exit_at:

        @ppe.training.make_extension(trigger=(1, "iteration"))
        def crash(manager: Any) -> None:
            if manager.iteration == int(exit_at) + 1:
                os._exit(3)

        trainer.extend(crash)
    if distributed:
        sampler: Any = DistributedSampler(train, shuffle=True, seed=1)  # type: ignore[arg-type]
        loader = DataLoader(train, batch_size=4, sampler=sampler)  # type: ignore[arg-type]
        val_sampler: Any = DistributedValidationSampler(val, shuffle=False)
    else:
        g = torch.Generator().manual_seed(1)
        loader = DataLoader(train, batch_size=4, shuffle=True, generator=g)  # type: ignore[arg-type]
        val_sampler = None
    val_loader = DataLoader(val, batch_size=5, sampler=val_sampler)  # type: ignore[arg-type]
    trainer.run(loader, val_loader)
    assert trainer.evaluator is not None
    means = {k: float(v) for k, v in trainer.evaluator.run(val_loader).items()}
    loaded_from = snapshot.loaded_from
    torch.save(
        {
            "weights": model.state_dict(),
            "means": means,
            "iteration": trainer.iteration,
            "world_size": world.world_size,
            "written": writer.files,
            "loaded_from": loaded_from and os.path.basename(loaded_from),
            "val_samples": len(val) if val_sampler is None else len(val_sampler),
        },
        os.path.join(args.out, f"rank{world.rank}.pt"),
    )
    ppe.distributed.barrier()  # every rank done with collectives before the group goes
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
