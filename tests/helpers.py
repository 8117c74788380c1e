"""Builders and launchers shared by the tests (imported as ``helpers``: tests/ is on sys.path)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from ppe_core.reporting import report
from ppe_core.training.manager import ExtensionsManager


def linear_manager(
    out: Path, extensions: list[Any], *, max_epochs: int, iters_per_epoch: int, **kwargs: Any
) -> ExtensionsManager:
    """A manager over a seeded Linear(4, 1) and SGD, writing into ``out``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return ExtensionsManager(
        model,
        optimizer,
        max_epochs,
        iters_per_epoch=iters_per_epoch,
        out_dir=str(out),
        extensions=extensions,
        **kwargs,
    )


def profile_entry_steps(manager: Any, steps: int) -> tuple[list[str], list[Any]]:
    """Trains ``steps`` steps of ``linear_manager``'s model, profiling the training thread's
    extension calls after the first step: ``file:function`` of each Python function called
    and the ``self`` of each C-level ``append`` called."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    files: list[str] = []
    appended_to: list[Any] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            files.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "c_call" and getattr(arg, "__name__", "") == "append":
            appended_to.append(getattr(arg, "__self__", None))

    for step in range(steps):
        with manager.run_iteration(step_optimizers=["main"]):
            loss = manager.models["main"](x).square().mean()
            loss.backward()
            report({"train/loss": loss})
            if step:  # the first step initializes the extensions
                sys.setprofile(profile)
        sys.setprofile(None)
    return files, appended_to


#: torchrun's variables, dropped from a launched script's environment (pytest may run under one).
_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(
    script: Path,
    *args: str,
    processes: int = 2,
    timeout: float = 120,
    torchrun: tuple[str, ...] = (),
) -> tuple[int, str]:
    """Runs ``script`` in ``processes`` gloo processes (0: plain python); ``(returncode, stderr)``.

    ``torchrun``: more of torchrun's options (``"--max-restarts=2"``).

    A run still going after ``timeout`` seconds (a hang) is stopped with all its processes and
    fails the test.
    """
    command = [sys.executable, str(script), *args]
    if processes:
        command[1:1] = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={processes}",
            *torchrun,
        ]
    # stderr goes to a file: a pipe would stay open as long as any worker lives.
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            env=_env(),
            start_new_session=True,
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # torchrun runs each worker in a session of its own and stops them on SIGTERM.
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            stderr.seek(0)
            pytest.fail(
                f"{script.name} {' '.join(args)} hung for {timeout} s:\n{stderr.read()[-3000:]}"
            )
        stderr.seek(0)
        return process.returncode, stderr.read()


#: Fixture distributions (third-party plugins) that tests pip-install outside the repository.
FIXTURES = Path(__file__).parent / "fixtures"


def pip_install_fixtures(root: Path, names: tuple[str, ...]) -> Path:
    """pip-install fixture distributions, copied out of the repository, into ``root/site``."""
    target = root / "site"
    sources = []
    for name in names:
        shutil.copytree(FIXTURES / name, root / name)
        sources.append(str(root / name))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            *sources,
        ],
        check=True,
    )
    return target


def run_python(
    code: str = "",
    *,
    path: Path | None = None,
    env: dict[str, str] | None = None,
    module: str = "",
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (or ``-m module``) in a fresh interpreter with ``path`` on PYTHONPATH and no
    ``PPE_`` variable of this process: state a test must not leave in its own process (the
    emulated device, a first backward pass, a plugin host). Output captured; never raises on a
    failure."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    if path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(path), full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    args = [sys.executable, "-m", *module.split()] if module else [sys.executable, "-c", code]
    return subprocess.run(
        args, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
