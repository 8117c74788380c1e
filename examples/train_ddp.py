"""Data-parallel training: the same script runs as one process or under torchrun.

    python examples/train_ddp.py
    torchrun --nproc_per_node=2 examples/train_ddp.py

A small classifier on synthetic data (no download), trained on the device named by the
PPE_DEVICE environment variable (default "cpu"; under torchrun each process takes the device
of its LOCAL_RANK, e.g. "cuda:1"). ``ppe.distributed.init_from_env`` creates the process group
when torchrun (or mpirun) started the script and does nothing otherwise; the model is wrapped
in PyTorch's DistributedDataParallel only then. Validation runs on every rank over a disjoint
part of the validation set, and ``val/*`` is the mean over the whole set. Rank 0 prints the
table and writes the log and the snapshots (in ``--out``, default ``result_ddp/world{N}`` for N
processes, so runs at different sizes do not resume each other); a rerun resumes from the newest
snapshot on every rank. There is no teardown at the end: ``init_from_env`` shuts the process
group down at exit, after every rank is done with it.

Restarts: ``torchrun --nproc_per_node=2 --max-restarts=3 examples/train_ddp.py --fail-at 23``
kills the last rank after iteration 23 on the first attempt only (``TORCHELASTIC_RESTART_COUNT``
0); torchrun restarts every worker, they resume from the newest snapshot and the job finishes
with the weights of a run that never failed.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ppe_core as ppe
from ppe_core.distributed import DistributedValidationSampler


class Model(torch.nn.Module):
    """Takes keyword inputs from the batch and returns a dict holding its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.net(x)
        return {
            "loss": torch.nn.functional.cross_entropy(y, t),
            "accuracy": (y.argmax(dim=1) == t).float().mean(),
        }


class DictDataset(TensorDataset):
    """Yields ``{"x": ..., "t": ...}`` so batches map onto ``forward``'s keyword arguments."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x, t = super().__getitem__(index)
        return {"x": x, "t": t}


def make_dataset(n: int, seed: int) -> DictDataset:
    """The same samples in every process (seeded), so the ranks split one dataset."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    t = ((x[:, 0] + x[:, 1] * x[:, 2]) > 0).long()
    return DictDataset(x, t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=None, help="log and snapshot directory (default: result_ddp/world{N})"
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--fail-at",
        type=int,
        default=None,
        help="on torchrun's first attempt, SIGKILL the last rank after this iteration",
    )
    args = parser.parse_args()

    device = os.environ.get("PPE_DEVICE", "cpu")
    world = ppe.distributed.init_from_env(device)  # (1, 0, 0) when started with plain python
    out = args.out if args.out is not None else f"result_ddp/world{world.world_size}"
    distributed = ppe.distributed.is_distributed()
    if distributed and device != "cpu":
        device = f"{torch.device(device).type}:{world.local_rank}"  # one device per process

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = ppe.to(Model(), device)  # tag and move first ...
    wrapped: torch.nn.Module = DistributedDataParallel(model) if distributed else model  # ... wrap

    train, val = make_dataset(1024, seed=0), make_dataset(501, seed=1)  # 501: ranks differ
    if distributed:
        # Every epoch shuffles anew and alike on all ranks: the trainer calls set_epoch.
        train_loader = DataLoader(train, batch_size=32, sampler=DistributedSampler(train, seed=0))
        val_loader = DataLoader(val, batch_size=100, sampler=DistributedValidationSampler(val))
    else:
        g = torch.Generator().manual_seed(0)
        train_loader = DataLoader(train, batch_size=32, shuffle=True, generator=g)
        val_loader = DataLoader(val, batch_size=100)

    E = ppe.training.extensions
    # Rank-aware by default: rank 0 writes the snapshots and the log and prints the table;
    # every rank loads the same snapshot.
    extensions = [
        E.snapshot(autoload=True, n_retains=2),
        E.LogReport(),
        E.PrintReport(["epoch", "iteration", "train/loss", "val/loss", "val/accuracy"]),
    ]
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if args.fail_at is not None and first_attempt and world.rank == world.world_size - 1:

        @ppe.training.make_extension(trigger=(1, "iteration"))
        def fail(manager: ppe.training.ExtensionsManagerProtocol) -> None:
            if manager.iteration == args.fail_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost worker, as a dead node's

        extensions.append(fail)
    trainer = ppe.engine.create_trainer(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.1 * world.world_size, momentum=0.9),
        args.epochs,
        device=device,
        out_dir=out,
        extensions=extensions,
        evaluator=ppe.engine.create_evaluator(wrapped, device=device, distributed=distributed),
    )
    trainer.run(train_loader, val_loader)

    assert trainer.evaluator is not None
    accuracy = float(trainer.evaluator.run(val_loader)["val/accuracy"])  # the same on all ranks
    if ppe.distributed.is_main_process():
        print(f"final validation accuracy: {accuracy:.4f} ({world.world_size} processes)")
    # No destroy_process_group() here: one rank tearing the group down while another is still
    # in the last all-reduce made runs fail at exit. init_from_env registered a shutdown that
    # waits for every rank first.


if __name__ == "__main__":
    main()
