"""The Evaluator's progress bar: tqdm on a terminal or in Jupyter, and one plain summary line
per pass in logs and pipes (PPE draws its terminal bar, control codes included, everywhere)."""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["make_bar"]


def make_bar(total: int | None) -> Any:
    """A tqdm bar on a terminal or in Jupyter; one plain summary line anywhere else."""
    from ppe_core._console import in_notebook, is_terminal

    out = sys.stdout
    if is_terminal(out) or in_notebook():
        from tqdm.auto import tqdm  # imported when used: keeps ``import ppe_core`` cheap

        return tqdm(total=total, desc="validation", unit="batch", leave=False, file=out)
    return _PlainBar(total, out)


class _PlainBar:
    """For logs and pipes: no cursor control, a single line when the pass ends."""

    def __init__(self, total: int | None, out: Any) -> None:
        self._total = total
        self._done = 0
        self._out = out
        self._start = time.perf_counter()

    def update(self, n: int) -> None:
        self._done += n

    def close(self) -> None:
        seconds = time.perf_counter() - self._start
        rate = self._done / seconds if seconds > 0 else float("inf")
        print(
            f"validation: {self._done}{'' if self._total is None else f'/{self._total}'} "
            f"batches in {seconds:.2f}s ({rate:.1f} it/s)",
            file=self._out,
            flush=True,
        )
