"""Per-step overhead of the Trainer over a raw PyTorch loop on a tiny CPU model.

Both loops do the same work per step (zero_grad, forward, backward, step) on the same
pre-built batches; the Trainer adds the handler, reporting and the extensions. Each variant
is timed for a short and a long run and the per-step cost is the difference divided by the
extra steps, so one-off set-up (creating the trainer, opening files) is excluded while
per-epoch work (LogReport writing its file, PrintReport printing a row) is included. Epochs
are 500 steps. Runs are interleaved and the median is reported to damp machine noise.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from typing import Any

import torch

import ppe_core as ppe

BATCHES = 500  # steps per epoch
SHORT, LONG = 1, 5  # epochs


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


def raw(data: list[dict[str, torch.Tensor]], epochs: int) -> float:
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in data:
            opt.zero_grad()
            loss = model(**batch)["loss"]
            loss.backward()
            opt.step()
    return time.perf_counter() - start


def trainer(
    data: list[dict[str, torch.Tensor]], epochs: int, extensions: bool, pkg: Any = ppe
) -> float:
    """A Trainer with or without LogReport, PrintReport and ProgressBar.

    ``pkg`` is ``ppe_core`` or ``pytorch_pfn_extras``: the same code drives both, since
    ppe-core keeps PPE's API.
    """
    torch.manual_seed(0)
    model = pkg.to(Tiny(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = io.StringIO()
    ext: list[Any] = []
    if extensions:
        E = pkg.training.extensions
        ext = [
            E.LogReport(),
            E.PrintReport(["epoch", "iteration", "train/loss"], out=out),
            E.ProgressBar(out=out),
        ]
    with tempfile.TemporaryDirectory() as tmp:
        t = pkg.engine.create_trainer(model, opt, epochs, extensions=ext, out_dir=tmp)
        start = time.perf_counter()
        t.run(data)
        return time.perf_counter() - start


def ppe_peer(data: list[dict[str, torch.Tensor]], epochs: int) -> float:
    """pytorch-pfn-extras with the same three extensions (the API ppe-core follows)."""
    import pytorch_pfn_extras

    return trainer(data, epochs, True, pkg=pytorch_pfn_extras)


def ignite_peer(data: list[dict[str, torch.Tensor]], epochs: int) -> float:
    """Ignite's bare Engine (no handlers): the floor a framework loop adds."""
    from ignite.engine import Engine

    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(engine: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        opt.zero_grad()
        loss = model(**batch)["loss"]
        loss.backward()
        opt.step()
        return loss

    start = time.perf_counter()
    Engine(step).run(data, max_epochs=epochs)
    return time.perf_counter() - start


def peers(data: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """The peers that are installed (``pip install 'ppe-core[bench]'``)."""
    found: dict[str, Any] = {}
    try:
        import pytorch_pfn_extras  # noqa: F401

        found["ppe-0.9+ext"] = lambda epochs: ppe_peer(data, epochs)
    except ImportError:
        pass
    try:
        import ignite  # noqa: F401

        found["ignite-bare"] = lambda epochs: ignite_peer(data, epochs)
    except ImportError:
        pass
    return found


def per_step(run: Any) -> float:
    """Marginal seconds per step: (long run - short run) / extra steps."""
    return (run(LONG) - run(SHORT)) / ((LONG - SHORT) * BATCHES)


def main(rounds: int = 5) -> None:
    torch.set_num_threads(1)
    data = batches()
    variants = {
        "raw": lambda epochs: raw(data, epochs),
        "trainer": lambda epochs: trainer(data, epochs, False),
        "trainer+ext": lambda epochs: trainer(data, epochs, True),
        **peers(data),
    }
    for run in variants.values():
        run(SHORT)  # warm-up
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            results[name].append(per_step(run))
    base = statistics.median(results["raw"])
    print(f"torch {torch.__version__}, 1 thread, {BATCHES} steps/epoch, median of {rounds}")
    for name, values in results.items():
        med = statistics.median(values)
        print(
            f"{name:12s} {med * 1e6:8.1f} us/step  ratio {med / base:5.3f}  "
            f"overhead {(med - base) * 1e6:+6.1f} us/step"
        )


if __name__ == "__main__":
    main()
