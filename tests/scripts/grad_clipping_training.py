"""Gradient clipping under torchrun (gloo, 2 processes): DDP or FSDP2 (tests/test_grad_clipping.py).

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2
    grad_clipping_training.py OUT ddp|fsdp

Trains each of :data:`RUNS` (norm clipping with accumulation windows of 2, value clipping) on
8 global batches of 8 samples, each rank taking its 4, and writes ``OUT/rank{N}.pt``: per run
the full (gathered) weights and the ``train/grad_norm`` values reported. :func:`reference` is
the same training in one process on the whole batches, clipped by hand.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

import ppe_core as ppe

RUNS: dict[str, dict[str, Any]] = {
    "norm": {"grad_clip_norm": 0.3, "grad_accumulation_steps": 2},
    "value": {"grad_clip_value": 0.02},
}
STEPS, BATCH = 8, 4  # per rank; one process takes 2 * BATCH


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.body(x), t)}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * 2 * BATCH, 4, generator=g) * 3
    return x, torch.randn(len(x), 2, generator=g) * 4


def rank_batches(rank: int) -> list[dict[str, torch.Tensor]]:
    x, t = data()
    starts = (step * 2 * BATCH + rank * BATCH for step in range(STEPS))
    return [{"x": x[s : s + BATCH], "t": t[s : s + BATCH]} for s in starts]


def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def reference(run: str, clip: bool = True) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """One process on the whole batches, clipping the whole gradient by hand."""
    options = RUNS[run]
    window = options.get("grad_accumulation_steps", 1)
    torch.manual_seed(0)
    model = Net()
    opt = optimizer(model)
    x, t = data()
    norms = []
    for step in range(STEPS):
        if step % window == 0:
            opt.zero_grad()
        part = slice(step * 2 * BATCH, (step + 1) * 2 * BATCH)
        (model(x[part], t[part])["loss"] / window).backward()
        if (step + 1) % window:
            continue
        if clip and "grad_clip_norm" in options:
            norms.append(
                torch.nn.utils.clip_grad_norm_(model.parameters(), options["grad_clip_norm"])
            )
        elif clip:
            torch.nn.utils.clip_grad_value_(model.parameters(), options["grad_clip_value"])
        opt.step()
    return model, norms


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    weights = getattr(model, "module", model).state_dict()
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in weights.items()}


def train(run: str, kind: str) -> dict[str, Any]:
    torch.manual_seed(0)  # the same initial weights on every rank
    net = ppe.to(Net(), "cpu")
    model: torch.nn.Module
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (ppe.distributed.get_world_size(),))
        for layer in net.body:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    norms: list[torch.Tensor] = []

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def record(manager: Any) -> None:
        if "train/grad_norm" in manager.observation:
            norms.append(manager.observation["train/grad_norm"])

    trainer = ppe.engine.create_trainer(
        model, optimizer(model), 1, options=RUNS[run], extensions=[record]
    )
    trainer.run(rank_batches(ppe.distributed.get_rank()))
    return {"weights": full_weights(model), "norms": norms}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("kind", choices=["ddp", "fsdp"])
    args = parser.parse_args()
    ppe.distributed.init_from_env("cpu")
    results = {run: train(run, args.kind) for run in RUNS}
    torch.save(results, os.path.join(args.out, f"rank{ppe.distributed.get_rank()}.pt"))
    ppe.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
