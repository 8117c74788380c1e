"""The ``create_trainer`` flow of PPE's user-guide quick start, on in-memory batches.

A model that computes its own loss, ``create_trainer(models=, optimizers=, max_epochs=,
evaluator=create_evaluator(...), device=, options=)``, then ``trainer.extend`` of LogReport,
ProgressBar, PrintReport and ``snapshot(target=model)``, ``ppe.to(model, device=...)`` and
``trainer.run(train_loader=..., val_loader=...)`` over lists of dict batches.
Usage: ``python quick_start.py OUT [--epochs N]``.
"""

import argparse
import json
import os

import pytorch_pfn_extras as ppe
import torch

LOSSES: list[float] = []


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features=64, out_features=2)
        self.criterion = torch.nn.NLLLoss()

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = self.criterion(self.linear(x).log_softmax(dim=1), target)
        if self.training:
            LOSSES.append(loss.item())
        return {"loss": loss}


def batches(n: int, size: int) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.rand(size, 64), "target": torch.randint(0, 2, (size,))} for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    device = "cpu"
    trainer = ppe.engine.create_trainer(
        models=model,
        optimizers=optimizer,
        max_epochs=args.epochs,
        evaluator=ppe.engine.create_evaluator(
            models=model, device=device, options={"eval_report_keys": ["loss"]}
        ),
        device=device,
        options={"train_report_keys": ["loss"]},
        out_dir=os.path.join(args.out, "result"),
    )
    trainer.extend(ppe.training.extensions.LogReport())
    trainer.extend(ppe.training.extensions.ProgressBar())
    trainer.extend(
        ppe.training.extensions.PrintReport(
            ["epoch", "iteration", "elapsed_time", "train/loss", "val/loss"]
        )
    )
    trainer.extend(ppe.training.extensions.snapshot(target=model))
    ppe.to(model, device=device)

    trainer.run(train_loader=batches(6, 10), val_loader=batches(3, 10))

    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(LOSSES, f)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
