"""PPE's ``create_trainer`` MNIST pattern on synthetic MNIST-shaped data.

A model wrapper that reports ``train/loss`` and returns a dict, batches built by
``ppe.dataloaders.utils.CollateAsDict``, ``ppe.engine.create_trainer`` with a
``create_evaluator`` (``AccuracyMetric``, ``eval_report_keys``), ``train_report_keys``,
``ppe.to``, the example's extensions, and ``--trace`` (the manager's ``enable_trace``; the traced
section names go to ``trace.json``). Usage: ``python mnist_trainer.py OUT [--epochs N] [--trace]``.
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
        return F.log_softmax(self.fc2(F.relu(self.fc1(h.flatten(1)))), dim=1)


class WithLoss(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, data: torch.Tensor, target: torch.Tensor) -> dict[str, object]:
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
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    collate = ppe.dataloaders.utils.CollateAsDict(names=["data", "target"])
    train_loader = torch.utils.data.DataLoader(
        synthetic_mnist(64), batch_size=16, shuffle=True, collate_fn=collate
    )
    val_loader = torch.utils.data.DataLoader(
        synthetic_mnist(32), batch_size=16, shuffle=True, collate_fn=collate
    )
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)

    E = ppe.training.extensions
    extensions = [
        E.LogReport(),
        E.ProgressBar(),
        E.observe_lr(optimizer=optimizer),
        E.ParameterStatistics(model, prefix="model"),
        E.PrintReport(["epoch", "iteration", "train/loss", "lr", "val/loss", "val/accuracy"]),
        E.snapshot(),
    ]
    if importlib.util.find_spec("matplotlib") is not None:
        extensions.append(E.VariableStatisticsPlot(model))
        extensions.append(E.PlotReport(["train/loss", "val/loss"], "epoch", filename="loss.png"))

    with_loss = WithLoss(model)
    trainer = ppe.engine.create_trainer(
        with_loss,
        optimizer,
        args.epochs,
        device="cpu",
        extensions=extensions,
        evaluator=ppe.engine.create_evaluator(
            with_loss,
            device="cpu",
            progress_bar=True,
            metrics=[ppe.training.metrics.AccuracyMetric("target", "output")],
            options={"eval_report_keys": ["loss", "accuracy"]},
        ),
        options={"train_report_keys": ["loss"]},
        out_dir=os.path.join(args.out, "result"),
        enable_trace=args.trace,
    )
    ppe.to(with_loss, "cpu")
    tracer = ppe.profiler.get_tracer()
    tracer.clear()

    trainer.run(train_loader, val_loader)

    if args.trace:
        events = tracer.state_dict()["_event_list"]
        events = json.loads(events) if isinstance(events, str) else events
        with open(os.path.join(args.out, "trace.json"), "w") as f:
            json.dump([event["name"] for event in events], f)
        tracer.clear()
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(LOSSES, f)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
