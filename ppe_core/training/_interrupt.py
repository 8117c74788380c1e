"""Preemption and Ctrl-C: SIGTERM/SIGINT stop a Trainer after the current iteration.

While ``Trainer.run`` runs in the main thread, :class:`Interrupt` replaces the SIGTERM and
SIGINT handlers with one that only sets a flag (the first signal) and gives both signals back
to the default disposition, so a second one ends the process at once. The trainer reads
one attribute (:attr:`Interrupt.stop`) per iteration. Alone, the flag stops training at the
end of the iteration in progress. Under a process group of several ranks the ranks may be
signalled at different iterations, so the flag is agreed on every :data:`ENV_CHECK_EVERY`
iterations by :class:`InterruptAgreement` (one small all-reduce, scheduled as an extension:
nothing runs on the other steps), and every rank stops at that iteration.

The train loader's DataLoader workers outlive the first signal (:func:`protect_workers` wraps
its ``worker_init_fn``): a scheduler signals the whole process group, and torch's workers would
die, failing the main process with "DataLoader worker ... exited unexpectedly" while ranks
train on to the agreed iteration or mid-snapshot; the loader stops them when the run ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
from typing import Any

import torch

from ppe_core.distributed import device_of, group_world, run_collective
from ppe_core.errors import ConfigurationError
from ppe_core.training._extension import PRIORITY_WRITER, Extension

__all__ = ["DEFAULT_CHECK_EVERY", "ENV_CHECK_EVERY", "Interrupt", "InterruptAgreement"]

#: Environment variable: under torch.distributed, the ranks agree on a pending signal every
#: this many iterations (read when ``run()`` starts).
ENV_CHECK_EVERY = "PPE_INTERRUPT_CHECK_EVERY"
#: Its default.
DEFAULT_CHECK_EVERY = 10

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def check_every() -> int:
    """The agreement interval: :data:`ENV_CHECK_EVERY` if set, else the default."""
    text = os.environ.get(ENV_CHECK_EVERY)
    if text is None:
        return DEFAULT_CHECK_EVERY
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(
            f"{ENV_CHECK_EVERY}={text!r} is not a positive whole number of iterations; set it "
            f"to e.g. {DEFAULT_CHECK_EVERY} or unset it"
        )
    return value


class Interrupt:
    """The signal flag of one ``Trainer.run``: installed on enter, the old handlers restored
    on exit (nothing is installed outside the main thread)."""

    def __init__(self, distributed: bool) -> None:
        #: The first signal's number, 0 until one arrived.
        self.signum = 0
        #: Whether the trainer stops after the current iteration (agreed under a group).
        self.stop = False
        #: Whether the ranks of a process group must agree (:class:`InterruptAgreement`).
        self.distributed = distributed
        self._previous: dict[int, Any] = {}
        self._loader: Any = None
        self._user_init: Any = None

    def install(self, loader: Any) -> None:
        """Installs the handlers (main thread only) and protects ``loader``'s workers."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in _SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        self._loader, self._user_init = loader, protect_workers(loader)

    def uninstall(self) -> None:
        """Restores the previous handlers and the loader's ``worker_init_fn``."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._previous:
            unprotect_workers(self._loader, self._user_init)
        self._previous.clear()

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        if not self.signum:  # also in a forked child, where the parent's copy stops
            self.signum = signum
            self.stop = self.stop or not self.distributed
            # A second signal takes the default action in the kernel, at once: were it to
            # run Python here, a DataLoader worker killed by the same group signal could
            # raise through torch's SIGCHLD handler first (a "training failed" exit 143
            # instead of death by the signal).
            for other in _SIGNALS:
                signal.signal(other, signal.SIG_DFL)
            return
        # A second signal that reached this handler anyway (it was set again): the default.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def agree(self, device: torch.device | None = None) -> None:
        """Every rank's flag, all-reduced (MAX): sets :attr:`stop` on every rank alike."""
        flag = torch.tensor([self.signum], dtype=torch.int64, device=device)
        run_collective(torch.distributed.all_reduce, flag, op=torch.distributed.ReduceOp.MAX)
        agreed = int(flag.item())
        if agreed:
            self.signum = self.signum or agreed
            self.stop = True


class _WorkerSignals:
    """A DataLoader's ``worker_init_fn`` that makes its workers outlive one SIGTERM/SIGINT.

    A scheduler's kill reaches the whole process group: torch's workers would die (their
    SIGTERM handler exits), and the next batch (a rank that trains on to the agreed
    iteration) or the SIGCHLD handler (mid-snapshot) would fail with "DataLoader worker ...
    exited unexpectedly". The main process stops them when it ends; a second signal ends them.
    """

    def __init__(self, user_init: Any) -> None:
        self.user_init = user_init

    def __call__(self, worker_id: int) -> None:
        for signum in _SIGNALS:
            signal.signal(signum, _worker_handler)
        if self.user_init is not None:
            self.user_init(worker_id)


def _worker_handler(signum: int, frame: types.FrameType | None) -> None:
    signal.signal(signum, signal.SIG_DFL)  # the next one ends the worker


def protect_workers(loader: Any) -> Any:
    """Wraps the ``worker_init_fn`` of a DataLoader with workers (see :class:`_WorkerSignals`);
    returns what to restore with :func:`unprotect_workers`."""
    if getattr(loader, "num_workers", 0) <= 0 or not hasattr(loader, "worker_init_fn"):
        return None
    user_init = loader.worker_init_fn
    if isinstance(user_init, _WorkerSignals):
        return None
    loader.worker_init_fn = _WorkerSignals(user_init)
    return user_init


def unprotect_workers(loader: Any, user_init: Any) -> None:
    """Undoes :func:`protect_workers`."""
    if isinstance(getattr(loader, "worker_init_fn", None), _WorkerSignals):
        loader.worker_init_fn = user_init


class InterruptAgreement(Extension):
    """Agrees on a pending SIGTERM/SIGINT among the ranks, every few iterations."""

    priority = PRIORITY_WRITER + 2  # first, so every rank agrees before its other extensions
    collectives = "interrupt agreement"

    def __init__(self, interrupt: Interrupt) -> None:
        self._interrupt = interrupt
        self._device: torch.device | None = None

    def initialize(self, manager: Any) -> None:
        # gloo reduces host tensors; another backend (NCCL) those on the rank's device.
        if "gloo" not in str(torch.distributed.get_backend()):
            self._device = device_of(getattr(manager, "raw_models", {}).values())

    def __call__(self, manager: Any) -> None:
        self._interrupt.agree(self._device)


def save_interrupted(manager: Any) -> str | None:
    """Lets each extension save what a rerun resumes from (:meth:`Extension.on_interrupt`;
    every rank calls it: a snapshot gathers the ranks' resume data); returns the file name
    the first one wrote, or None when none did (no ``snapshot(autoload=True)``)."""
    for _, entry in manager.extensions:
        saved = entry.extension.on_interrupt(manager)
        if saved is not None:
            return str(saved)
    return None


def interrupted_exit(signum: int, iteration: int, what: str) -> SystemExit:
    """Prints (rank 0) what the signal did (``what``: the snapshot's fate), and returns the
    ``SystemExit(128 + signum)`` that ends the run."""
    name = signal.Signals(signum).name
    if group_world()[1] == 0:
        print(f"ppe_core: {name}: interrupted at iteration {iteration}; {what}", file=sys.stderr)
        sys.stderr.flush()
    return SystemExit(128 + signum)


def saved_line(saved: str | None) -> str:
    """The end of the line :func:`interrupted_exit` prints after :func:`save_interrupted`."""
    if saved is None:
        return "no autoloading snapshot extension: nothing saved"
    return f"{saved} written; rerun to resume"


#: After a signal, a failure ends the run without a snapshot (a peer rank gone: torchrun's
#: agent then signals the others).
FAILED_LINE = (
    "training failed after the signal (the error above; e.g. a peer rank gone): no "
    "snapshot written; a rerun resumes from the last periodic snapshot"
)


def distributed() -> bool:
    """Whether a process group of several ranks trains (then the ranks agree on a signal)."""
    return group_world()[0] > 1
