"""Per-step overhead of the Trainer over a raw PyTorch loop on a tiny CPU model.

Both loops do the same work per step (zero_grad, forward, backward, step) on the same
pre-built batches; the Trainer adds the handler, reporting and the extensions. Runs are
interleaved and the median is reported to damp machine noise.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from typing import Any

import torch

import ppe_core as ppe

STEPS = 2000
BATCHES = 100


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"x": torch.randn(8, 16, generator=g), "t": torch.randint(0, 4, (8,), generator=g)}
        for _ in range(BATCHES)
    ]


def raw(data: list[dict[str, torch.Tensor]]) -> float:
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for _ in range(STEPS // BATCHES):
        for batch in data:
            opt.zero_grad()
            loss = model(**batch)["loss"]
            loss.backward()
            opt.step()
    return (time.perf_counter() - start) / STEPS


def trainer(data: list[dict[str, torch.Tensor]], extensions: bool) -> float:
    torch.manual_seed(0)
    model = ppe.to(Tiny(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = io.StringIO()
    ext: list[Any] = []
    if extensions:
        E = ppe.training.extensions
        ext = [
            E.LogReport(),
            E.PrintReport(["epoch", "iteration", "train/loss"], out=out),
            E.ProgressBar(out=out),
        ]
    with tempfile.TemporaryDirectory() as tmp:
        t = ppe.engine.create_trainer(model, opt, STEPS // BATCHES, extensions=ext, out_dir=tmp)
        start = time.perf_counter()
        t.run(data)
        return (time.perf_counter() - start) / STEPS


def main(rounds: int = 7) -> None:
    torch.set_num_threads(1)
    data = batches()
    raw(data), trainer(data, True)  # warm-up
    results: dict[str, list[float]] = {"raw": [], "trainer": [], "trainer+ext": []}
    for _ in range(rounds):
        results["raw"].append(raw(data))
        results["trainer"].append(trainer(data, False))
        results["trainer+ext"].append(trainer(data, True))
    base = statistics.median(results["raw"])
    for name, values in results.items():
        med = statistics.median(values)
        print(
            f"{name:12s} {med * 1e6:8.1f} us/step  ratio {med / base:5.3f}  "
            f"overhead {(med - base) * 1e6:+6.1f} us/step"
        )


if __name__ == "__main__":
    main()
