"""FSDP2: a model sharded with ``fully_shard``, trained, snapshotted with DCP and exported.

    torchrun --nproc_per_node=2 examples/train_fsdp.py
    python examples/train_fsdp.py

An MLP on scikit-learn's handwritten digits (no download; the ``examples`` extra), trained on
the device named by the PPE_DEVICE environment variable (default "cpu": gloo; under torchrun on
GPUs, e.g. PPE_DEVICE=cuda, each process takes the device of its LOCAL_RANK: nccl). Each hidden
block is sharded over all ranks with ``fully_shard``, then the root module (the output layer):
every rank holds only its shard of each parameter (a DTensor) and of the AdamW state. The
global batch is 64 samples split over the ranks, so every world size takes the same number of
steps per epoch. Validation runs on every rank over a disjoint part of the validation set, and
``val/*`` is the mean over the whole set.

Rank 0 prints the table and writes the log; the snapshots (``SnapshotMode.DCP``, one directory
per epoch, the newest 2 kept) hold every rank's shards, written by every rank in the background.
Output goes to ``--out``, default ``result_fsdp/world{N}`` for N processes, and a rerun with more
``--epochs`` resumes from the newest snapshot. At the end, rank 0 exports that snapshot to one
ordinary state dict, ``{out}/model.pt``, loads it into a plain (unsharded) copy of the model and
prints its validation loss and accuracy, which equal the sharded model's.

FSDP2 and DCP need a process group: started with plain ``python``, the script makes itself a
world of one, as ``torchrun --nproc_per_node=1`` would. There is no teardown at the end:
``init_from_env`` shuts the process group down at exit, after every rank is done with it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler
from train_digits import load_digits_split  # the digits example's data (this directory)

import ppe_core as ppe
from ppe_core.distributed import DistributedValidationSampler

E = ppe.training.extensions
GLOBAL_BATCH = 64  # samples per optimizer step, over all ranks


class Classifier(torch.nn.Module):
    """An MLP over the 64 pixels: hidden blocks (each sharded on its own) and an output layer.

    Returns the loss and the accuracy of the batch, which the handler reports (``train/loss``,
    ``val/loss``, ``val/accuracy``).
    """

    def __init__(self, hidden: int = 128, depth: int = 2, classes: int = 10) -> None:
        super().__init__()
        widths = [64] + [hidden] * depth
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(n_in, n_out), torch.nn.ReLU())
            for n_in, n_out in itertools.pairwise(widths)
        )
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        for block in self.blocks:
            x = block(x)
        scores = self.head(x)
        return {
            "loss": torch.nn.functional.cross_entropy(scores, t),
            "accuracy": (scores.argmax(dim=1) == t).float().mean(),
        }


def become_a_world_of_one() -> None:
    """Sets torchrun's variables for one process on a free local port, unless launched."""
    if "WORLD_SIZE" in os.environ or "OMPI_COMM_WORLD_SIZE" in os.environ:
        return  # torchrun or mpirun started this process
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def shard(model: Classifier, device_type: str) -> None:
    """FSDP2: each block's parameters become DTensors sharded over every rank, then the rest
    (the root's, i.e. the output layer's). Blocks are gathered one at a time in forward and
    backward, and their gradients reduce-scattered as soon as they are computed."""
    mesh = init_device_mesh(device_type, (torch.distributed.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def evaluate_exported(path: str, val_x: torch.Tensor, val_t: torch.Tensor) -> dict[str, float]:
    """Loads an exported state dict into a plain Classifier and evaluates it on one batch."""
    model = Classifier()
    model.load_state_dict(torch.load(path, weights_only=True))  # no FSDP prefixes, no DTensors
    model.eval()
    with torch.no_grad():
        return {k: float(v) for k, v in model(val_x, val_t).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=None, help="log and snapshot directory (default: result_fsdp/world{N})"
    )
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train in total")
    args = parser.parse_args()

    torch.set_num_threads(1)  # layers this small run fastest on one thread per process
    become_a_world_of_one()
    device = os.environ.get("PPE_DEVICE", "cpu")
    if device != "cpu":  # one accelerator per process; FSDP2 shards onto the current one
        device = f"{torch.device(device).type}:{ppe.distributed.get_local_rank()}"
        torch.accelerator.set_device_index(ppe.distributed.get_local_rank())
    world = ppe.distributed.init_from_env(device)  # gloo for "cpu", nccl for "cuda:N"
    out = args.out if args.out is not None else f"result_fsdp/world{world.world_size}"

    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    model = ppe.to(Classifier(), device)  # tag and move first ...
    shard(model, torch.device(device).type)  # ... then shard
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # from the sharded parameters

    train, val = load_digits_split(seed=0)  # 1438 and 359 samples (ranks get 180 and 179)
    # Every epoch shuffles anew and alike on all ranks: the trainer calls set_epoch.
    sampler: DistributedSampler[dict[str, torch.Tensor]] = DistributedSampler(train, seed=0)
    train_loader = DataLoader(train, batch_size=GLOBAL_BATCH // world.world_size, sampler=sampler)
    val_loader = DataLoader(val, batch_size=100, sampler=DistributedValidationSampler(val))

    # Rank-aware by default: rank 0 prints and writes the log. A DCP snapshot is a collective:
    # every rank writes its own shards, and every rank resumes from the same one.
    snapshot = E.snapshot(
        autoload=True, saver_rank=0, snapshot_mode=E.SnapshotMode.DCP, n_retains=2
    )
    extensions = [
        snapshot,
        E.LogReport(),
        E.PrintReport(["epoch", "iteration", "train/loss", "val/loss", "val/accuracy"]),
    ]
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        args.epochs,
        device=device,
        out_dir=out,
        extensions=extensions,
        evaluator=ppe.engine.create_evaluator(model, device=device, distributed=True),
    )
    trainer.run(train_loader, val_loader)

    assert trainer.evaluator is not None
    sharded = trainer.evaluator.run(val_loader)  # a collective: the same on every rank
    if not ppe.distributed.is_main_process():
        return
    if snapshot.loaded_from is not None:
        print(f"resumed from {snapshot.loaded_from}")
    print(
        f"sharded model: val/loss {float(sharded['val/loss']):.6f}, "
        f"val/accuracy {float(sharded['val/accuracy']):.4f} (world size {world.world_size})"
    )
    # The newest snapshot holds the final weights (one per epoch, the last at the end). Its
    # shards are joined in this process into one ordinary file (`ppe-core export-snapshot`).
    newest = os.path.join(out, f"snapshot_iter_{trainer.iteration}")
    exported = os.path.join(out, "model.pt")
    E.export_snapshot(newest, exported)
    val_x = torch.stack([val[i]["x"] for i in range(len(val))])
    val_t = torch.stack([val[i]["t"] for i in range(len(val))])
    plain = evaluate_exported(exported, val_x, val_t)
    print(f"exported {newest} to {exported}")
    print(f"exported model: val/loss {plain['loss']:.6f}, val/accuracy {plain['accuracy']:.4f}")


if __name__ == "__main__":
    main()
