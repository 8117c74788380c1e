"""PPE's manual-manager MNIST pattern on synthetic MNIST-shaped data.

A hand-written loop under ``manager.run_iteration(step_optimizers=["main"])`` with ``ppe.nn.ensure``
in the model, the example's extension set (two LogReports, one writing through a TensorBoard
writer when tensorboard is installed, ProgressBar, observe_lr, ParameterStatistics, an Evaluator
with an ``eval_func``, PrintReport, snapshot; PlotReport and VariableStatisticsPlot when matplotlib
is installed), and resuming with ``--snapshot PATH`` (torch.load + load_state_dict) or
``--autoload``. Usage: ``python mnist_manager.py OUT [--epochs N] [--snapshot P] [--autoload]``.
"""

import argparse
import importlib.util
import json
import os

import pytorch_pfn_extras as ppe
import torch
import torch.nn.functional as F

LOSSES: list[float] = []


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5)
        self.conv2 = torch.nn.Conv2d(6, 8, 5)
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = self.fc2(F.relu(self.fc1(h.flatten(1))))
        ppe.nn.ensure(h, shape=(None, 10))
        return F.log_softmax(h, dim=1)


def synthetic_mnist(n: int) -> torch.utils.data.TensorDataset:
    images = torch.randn(n, 1, 28, 28)
    labels = torch.randint(0, 10, (n,))
    return torch.utils.data.TensorDataset(images, labels)


def validate(model: torch.nn.Module, data: torch.Tensor, target: torch.Tensor) -> None:
    model.eval()
    output = model(data)
    ppe.reporting.report({"val/loss": F.nll_loss(output, target).item()})
    correct = output.argmax(dim=1).eq(target).sum().item()
    ppe.reporting.report({"val/acc": correct / len(data)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--snapshot", default=None)
    parser.add_argument("--autoload", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    result = os.path.join(args.out, "result")

    # No shuffling, so a resumed run sees the batches an uninterrupted one does.
    train_loader = torch.utils.data.DataLoader(synthetic_mnist(64), batch_size=16)
    val_loader = torch.utils.data.DataLoader(synthetic_mnist(32), batch_size=16)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)

    E = ppe.training.extensions
    extensions = [
        E.LogReport(),
        E.ProgressBar(),
        E.observe_lr(optimizer=optimizer),
        E.ParameterStatistics(model, prefix="model"),
        E.Evaluator(
            val_loader,
            model,
            eval_func=lambda data, target: validate(model, data, target),
            progress_bar=True,
        ),
        E.PrintReport(["epoch", "iteration", "train/loss", "lr", "val/loss", "val/acc"]),
        E.snapshot(autoload=args.autoload),
    ]
    if importlib.util.find_spec("tensorboard") is not None:
        writer = ppe.writing.TensorBoardWriter(out_dir=os.path.join(args.out, "runs"))
        extensions.append(E.LogReport(writer=writer, trigger=(1, "iteration")))
    if importlib.util.find_spec("matplotlib") is not None:
        extensions.append(E.VariableStatisticsPlot(model))
        extensions.append(E.PlotReport(["train/loss", "val/loss"], "epoch", filename="loss.png"))

    manager = ppe.training.ExtensionsManager(
        model,
        optimizer,
        args.epochs,
        extensions=extensions,
        iters_per_epoch=len(train_loader),
        out_dir=result,
    )
    if args.snapshot is not None:
        manager.load_state_dict(torch.load(args.snapshot))

    while not manager.stop_trigger:
        model.train()
        for data, target in train_loader:
            with manager.run_iteration(step_optimizers=["main"]):
                loss = F.nll_loss(model(data), target)
                ppe.reporting.report({"train/loss": loss.item()})
                LOSSES.append(loss.item())
                loss.backward()

    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(LOSSES, f)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
