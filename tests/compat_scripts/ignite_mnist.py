"""PPE's Ignite MNIST pattern on synthetic MNIST-shaped data.

Ignite's ``create_supervised_trainer``/``create_supervised_evaluator`` (``Accuracy``, ``Loss``)
driven by ``ppe.training.IgniteExtensionsManager`` with the example's extensions, among them
``IgniteEvaluator``; the loss is reported from an ``ITERATION_COMPLETED`` handler, and a model
with dropout draws from the seeded generator. Usage: ``python ignite_mnist.py OUT [--epochs N]``.
"""

import argparse
import importlib.util
import json
import os

import pytorch_pfn_extras as ppe
import torch
import torch.nn.functional as F
from ignite.engine import Engine, Events, create_supervised_evaluator, create_supervised_trainer
from ignite.metrics import Accuracy, Loss


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(4, 8, kernel_size=5)
        self.drop = torch.nn.Dropout2d()
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 24)
        self.fc2 = torch.nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(F.max_pool2d(self.conv1(x), 2))
        h = F.relu(F.max_pool2d(self.drop(self.conv2(h)), 2))
        h = F.dropout(F.relu(self.fc1(h.flatten(1))), training=self.training)
        return F.log_softmax(self.fc2(h), dim=-1)


def synthetic_mnist(n: int) -> torch.utils.data.TensorDataset:
    images = torch.randn(n, 1, 28, 28)
    labels = torch.randint(0, 10, (n,))
    return torch.utils.data.TensorDataset(images, labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    train_loader = torch.utils.data.DataLoader(synthetic_mnist(64), batch_size=16, shuffle=True)
    val_loader = torch.utils.data.DataLoader(synthetic_mnist(32), batch_size=16)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    trainer = create_supervised_trainer(model, optimizer, F.nll_loss, device="cpu")
    evaluator = create_supervised_evaluator(
        model, metrics={"acc": Accuracy(), "loss": Loss(F.nll_loss)}, device="cpu"
    )

    E = ppe.training.extensions
    extensions = [
        E.LogReport(),
        E.ProgressBar(),
        E.observe_lr(optimizer=optimizer),
        E.ParameterStatistics(model, prefix="model"),
        E.snapshot(),
        E.IgniteEvaluator(evaluator, val_loader, model, progress_bar=True),
        E.PrintReport(["epoch", "iteration", "train/loss", "lr", "val/loss", "val/acc"]),
    ]
    if importlib.util.find_spec("matplotlib") is not None:
        extensions.append(E.VariableStatisticsPlot(model))
        extensions.append(E.PlotReport(["train/loss"], "epoch", filename="loss.png"))
    ppe.training.IgniteExtensionsManager(
        trainer,
        {"main": model},
        {"main": optimizer},
        args.epochs,
        extensions=extensions,
        out_dir=os.path.join(args.out, "result"),
    )

    losses: list[float] = []

    @trainer.on(Events.ITERATION_COMPLETED)
    def report_loss(engine: Engine) -> None:
        ppe.reporting.report({"train/loss": engine.state.output})
        losses.append(engine.state.output)

    trainer.run(train_loader, max_epochs=args.epochs)

    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(losses, f)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
