"""What the run-lock tests share: a real run that holds a directory, and a small trainer.

Imported as ``run_lock_helpers`` (tests/ is on sys.path) by test_run_lock.py and
test_run_lock_damage.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import ppe_core as ppe

SCRIPT = Path(__file__).parent / "scripts" / "locked_training.py"

#: torchrun's variables, dropped from a launched run's environment (pytest may run under one).
_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def clean_env() -> dict[str, str]:
    """This environment without ppe-core's switches and torchrun's variables."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PPE_") and k not in _LAUNCH_VARIABLES
    }


class Holder:
    """A real training run (one process, or a torchrun job) paused while it holds ``out``.

    It runs tests/scripts/locked_training.py, which trains 2 epochs in ``out`` (a LogReport,
    a snapshot per epoch) and pauses after its first iteration until :meth:`finish`; the
    constructor returns once every rank holds the directory.
    """

    def __init__(self, out: Path, *extra: str, torchrun: bool = False) -> None:
        self.release_file = out.parent / f"{out.name}.release"
        launcher = [sys.executable]
        if torchrun:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        self.proc = subprocess.Popen(
            [*launcher, str(SCRIPT), str(out), "--hold", str(self.release_file), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
            start_new_session=True,  # its own process group: close() ends its workers too
        )
        self._finished = False
        #: The pid of each rank, in the order they reported holding the directory.
        self.pids: list[int] = []
        try:
            self._wait_until_held(2 if torchrun else 1)
        except BaseException:
            self.close()  # no process or pipe outlives a failed start
            raise

    def _wait_until_held(self, ranks: int) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        while len(self.pids) < ranks:
            line = self.proc.stdout.readline()
            assert line, f"the holder ended early: {self.proc.communicate()[1][-3000:]}"
            if line.startswith("holding "):
                self.pids.append(int(line.split("pid=")[1]))
            assert time.monotonic() < deadline

    def finish(self) -> tuple[int, str, str]:
        """Lets the run go on; returns its exit status, stdout and stderr."""
        self.release_file.touch()
        out, err = self.proc.communicate(timeout=180)
        self._finished = True
        return self.proc.returncode, out, err

    def close(self) -> None:
        """Ends the run if a failing test left it alive, and closes its pipes.

        A run that did not finish is ended with its whole process group: DataLoader workers
        of a holder killed by the test (which outlive it for up to 5 s, until they notice)
        keep its pipes open, and reading them to the end would wait for them.
        """
        if not self._finished:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=60)


def make_trainer(out: Path, *extensions: Any) -> Any:
    """A one-epoch trainer of a seeded Linear(3, 1) in ``out``, with a LogReport."""
    torch.manual_seed(0)
    model = ppe.to(torch.nn.Linear(3, 1), "cpu")

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = model

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.fc(x).pow(2).mean()}

    net = ppe.to(Loss(), "cpu")
    return ppe.engine.create_trainer(
        net,
        torch.optim.SGD(net.parameters(), lr=0.1),
        1,
        out_dir=str(out),
        extensions=[ppe.training.extensions.LogReport(), *extensions],
    )


def batches(n: int = 4) -> list[dict[str, torch.Tensor]]:
    """``n`` batches of two random samples for :func:`make_trainer`."""
    return [{"x": torch.randn(2, 3)} for _ in range(n)]
