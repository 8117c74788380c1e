"""A third-party style script on PPE helpers: ``ppe.nn`` checks, lazy layers, ``ppe.dataloaders``.

An ``ExtendedSequential`` (extended with ``repeat``) of PPE's lazy layers (``LazyConv2d``,
``LazyLinear``, ``LazyBatchNorm1d``, the input size given as ``None``) guarded by ``ppe.nn.Ensure``
and ``ppe.nn.ensure`` (shape, dtype, ``broadcastable``, ``can_cast``); batches from
``ppe.dataloaders.DataLoader`` with ``utils.CollateAsDict``; the optimizer is built after a dummy
forward, as PPE's docs say; a manual ``ExtensionsManager`` loop with LogReport and
MicroAverage. Usage: ``python ensure_collate.py OUT [--epochs N]``.
"""

import argparse
import json
import os

import pytorch_pfn_extras as ppe
import torch
import torch.nn.functional as F


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # Ensure checks its input and returns nothing, so it sits beside the layers.
        self.check_input = ppe.nn.Ensure(shape=(None, 1, 28, 28), dtype=torch.float32)
        self.check_output = ppe.nn.Ensure(shape=(None, 10), broadcastable=True)
        hidden = ppe.nn.ExtendedSequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
        self.layers = ppe.nn.ExtendedSequential(
            ppe.nn.LazyConv2d(None, 4, 5, stride=2),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            ppe.nn.LazyLinear(None, 16),
            ppe.nn.LazyBatchNorm1d(None),
            hidden.repeat(2),
            ppe.nn.LazyLinear(None, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        y = self.layers(x)
        self.check_output(y)
        return y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    images = torch.randn(48, 1, 28, 28)
    labels = torch.randint(0, 10, (48,))
    loader = ppe.dataloaders.DataLoader(
        list(zip(images, labels, strict=True)),
        batch_size=12,
        shuffle=True,
        collate_fn=ppe.dataloaders.utils.CollateAsDict(names=["image", "label"]),
    )
    model = Classifier()
    model(torch.zeros(2, 1, 28, 28))  # materializes the lazy parameters
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    E = ppe.training.extensions
    manager = ppe.training.ExtensionsManager(
        {"main": model},
        {"main": optimizer},
        args.epochs,
        iters_per_epoch=len(loader),
        extensions=[
            E.MicroAverage("main/correct", "main/total", "main/accuracy"),
            E.LogReport(trigger=(2, "iteration")),
        ],
        out_dir=os.path.join(args.out, "result"),
    )
    losses: list[float] = []
    while not manager.stop_trigger:
        for batch in loader:
            with manager.run_iteration():
                image, label = batch["image"], batch["label"]
                ppe.nn.ensure(image, shape=(None, 1, 28, 28), dtype=torch.float32)
                ppe.nn.ensure(label, dtype=torch.int64, can_cast=True)
                output = model(image)
                loss = F.cross_entropy(output, label)
                correct = int((output.argmax(1) == label).sum())
                ppe.reporting.report(
                    {"main/loss": loss.item(), "main/correct": correct, "main/total": len(label)}
                )
                losses.append(loss.item())
                loss.backward()

    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(losses, f)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
