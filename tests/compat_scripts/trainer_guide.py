"""The "Trainer and Evaluator" user guide's pattern: a model that reports its own loss.

``forward`` reports ``{f"{prefix}/loss": loss.item()}`` (``prefix`` ``train`` or ``val``) and
returns ``{"loss": loss}``; ``create_trainer`` and ``create_evaluator`` run with their default
options (no report keys), LogReport and PrintReport. With ``--scale S`` the model reports
``S * loss.item()`` instead: a value that differs from the returned loss, under the same key.
Usage: ``python trainer_guide.py OUT [--epochs N] [--scale S]``.
"""

import argparse
import json
import os

import pytorch_pfn_extras as ppe
import torch
import torch.nn.functional as F

LOSSES: list[float] = []


class MyModel(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.w = torch.nn.Linear(16, 3)
        self.scale = scale

    def forward(self, *, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.w(x).log_softmax(dim=1)
        loss = F.nll_loss(y, target)
        prefix = "train" if self.training else "val"
        ppe.reporting.report({f"{prefix}/loss": self.scale * loss.item()})
        if self.training:
            LOSSES.append(loss.item())
        return {"loss": loss}


def batches(n: int) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.rand(4, 16), "target": torch.randint(0, 3, (4,))} for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    torch.manual_seed(0)

    model = MyModel(args.scale)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    extensions = [
        ppe.training.extensions.LogReport(),
        ppe.training.extensions.PrintReport(["epoch", "iteration", "train/loss", "val/loss"]),
    ]
    device = "cpu"
    trainer = ppe.engine.create_trainer(
        model,
        optim,
        args.epochs,
        evaluator=ppe.engine.create_evaluator(model, device=device),
        device=device,
        extensions=extensions,
        out_dir=os.path.join(args.out, "result"),
    )
    ppe.to(model, device)
    trainer.run(batches(7), batches(5))

    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(LOSSES, f)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
