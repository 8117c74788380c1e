"""PPE's custom-logic MNIST pattern on synthetic MNIST-shaped data.

A ``ppe.handler.Logic`` subclass that accumulates gradients over several steps (its own
``train_step`` and ``train_step_optimizers``) passed as ``create_trainer(logic=...)``, PPE's lazy
layers initialized by a dummy forward before the optimizer is built, ``CollateAsDict`` batches,
``ppe.to`` (PPE 0.9 requires it also on CPU, where the example skipped it) and a snapshot every
epoch.
Usage: ``python custom_logic.py OUT [--epochs N] [--steps-per-update K]``.
"""

import argparse
import json
import os
from typing import Any

import pytorch_pfn_extras as ppe
import torch
import torch.nn.functional as F

LOSSES: list[float] = []


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ppe.nn.LazyConv2d(None, 6, 5)
        self.conv2 = ppe.nn.LazyConv2d(None, 8, 5)
        self.fc1 = ppe.nn.LazyLinear(None, 32)
        self.fc2 = ppe.nn.LazyLinear(None, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(h.flatten(1)))), dim=1)


class AccumulatingLogic(ppe.handler.Logic):
    """Zeroes the gradients every ``steps_per_update`` batches and steps after the last one."""

    def __init__(self, steps_per_update: int) -> None:
        self.steps_per_update = steps_per_update
        super().__init__()

    def train_step(
        self,
        models: dict[str, torch.nn.Module],
        optimizers: dict[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        if batch_idx % self.steps_per_update == 0:
            optimizers[self.model_name].zero_grad()
        outs = models[self.model_name](**batch)
        for value in outs.values():
            value.backward()
        return outs

    def train_step_optimizers(
        self,
        models: dict[str, torch.nn.Module],
        optimizers: dict[str, torch.optim.Optimizer],
        batch_idx: int,
    ) -> None:
        if (batch_idx + 1) % self.steps_per_update == 0:
            optimizers[self.model_name].step()


class WithLoss(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, data: torch.Tensor, target: torch.Tensor) -> dict[str, Any]:
        output = self.model(data)
        if self.training:
            loss = F.nll_loss(output, target)
            ppe.reporting.report({"train/loss": loss.item()})
            LOSSES.append(loss.item())
            return {"loss": loss}
        return {
            "loss": F.nll_loss(output, target).item(),
            "output": output.argmax(dim=1, keepdim=True),
        }


def synthetic_mnist(n: int) -> torch.utils.data.TensorDataset:
    images = torch.randn(n, 1, 28, 28)
    labels = torch.randint(0, 10, (n,))
    return torch.utils.data.TensorDataset(images, labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps-per-update", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    collate = ppe.dataloaders.utils.CollateAsDict(names=["data", "target"])
    train_loader = torch.utils.data.DataLoader(
        synthetic_mnist(80), batch_size=16, shuffle=True, collate_fn=collate
    )
    val_loader = torch.utils.data.DataLoader(synthetic_mnist(32), batch_size=16, collate_fn=collate)
    model = Classifier()
    model(train_loader.dataset[0][0].unsqueeze(0))  # the dummy forward sizes the lazy layers
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)

    E = ppe.training.extensions
    with_loss = WithLoss(model)
    trainer = ppe.engine.create_trainer(
        with_loss,
        optimizer,
        args.epochs,
        device="cpu",
        extensions=[
            E.LogReport(),
            E.observe_lr(optimizer=optimizer),
            E.ParameterStatistics(model, prefix="model"),
            E.PrintReport(["epoch", "iteration", "train/loss", "lr", "val/loss", "val/accuracy"]),
            E.snapshot(),
        ],
        evaluator=ppe.engine.create_evaluator(
            with_loss,
            device="cpu",
            metrics=[ppe.training.metrics.AccuracyMetric("target", "output")],
            options={"eval_report_keys": ["loss", "accuracy"]},
        ),
        options={"train_report_keys": ["loss"]},
        logic=AccumulatingLogic(args.steps_per_update),
        out_dir=os.path.join(args.out, "result"),
    )
    ppe.to(with_loss, "cpu")
    trainer.run(train_loader, val_loader)

    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(LOSSES, f)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
