"""The model and data that the crash, resume and interrupt scripts share (imported by name:
a script's own folder is the first entry of ``sys.path``).

:class:`Net` is an MLP with dropout, so that a resume which replays an RNG state wrongly shows
in the weights; :func:`labelled_points` are the seeded points it classifies.
"""

from __future__ import annotations

import torch


class Net(torch.nn.Module):
    """Linear(6, 16)-ReLU-Dropout(0.3)-Linear(16, 2), trained with cross-entropy on ``t``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.body(x), t)}


def labelled_points(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points of 6 features drawn with ``seed``, labelled 1 where they sum above 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x.sum(1) > 0).long()
