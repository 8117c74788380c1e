"""The process group from the launcher's environment, and rank helpers that work without one.

``torchrun`` exports ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; ``mpirun`` (Open MPI) exports ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``.
A script started with plain ``python`` has neither, and every helper here then answers as the
only process of a world of one, so the same script runs both ways.

A group ``init_from_env`` creates is also torn down by it: at interpreter exit every rank waits
for the others, then destroys the group, while the interpreter is still whole (see
``shutdown``). Its collectives time out after ``DEFAULT_TIMEOUT`` seconds, not PyTorch's 30
minutes, and a timeout where ppe-core waits raises ``CollectiveTimeoutError``.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, NamedTuple

import torch

from ppe_core.errors import (
    ArgumentTypeError,
    CollectiveTimeoutError,
    ConfigurationError,
    DistributedEnvironmentError,
    DistributedNotInitializedError,
    missing_extra_error,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "ENV_TIMEOUT",
    "CollectiveTimeoutError",
    "DistributedEnvironmentError",
    "WorldInfo",
    "backend_for",
    "barrier",
    "gather_objects",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "group_world",
    "init_from_env",
    "is_distributed",
    "is_main_process",
    "require_group",
    "require_object_collectives",
    "run_collective",
    "shutdown",
    "timeout_error",
]

#: The port rank 0 listens on when an Open MPI job on one node does not export MASTER_PORT.
_DEFAULT_PORT = "29500"
#: Used where torch lacks ``Backend.default_device_backend_map``.
_FALLBACK_BACKENDS = {"cpu": "gloo"}
#: Seconds a collective of a group ``init_from_env`` creates waits for every rank before it
#: fails. Long enough for rank 0 to write a large snapshot while the others wait at its barrier,
#: or for a slow first step; short enough that a frozen rank stops the job in minutes, not after
#: PyTorch's 30.
DEFAULT_TIMEOUT = 600.0
#: Environment variable (seconds) replacing ``DEFAULT_TIMEOUT``; read when ``init_from_env``
#: runs, and overridden by its ``timeout`` argument.
ENV_TIMEOUT = "PPE_DISTRIBUTED_TIMEOUT"


class _Created:
    """The default group ``init_from_env`` created (None once torn down) and its timeout.

    Only this group is torn down at exit: a group the user created is theirs to destroy.
    """

    group: Any = None
    timeout: float | None = None
    exit_handler_registered = False


class WorldInfo(NamedTuple):
    """``(world_size, rank, local_rank)`` of this process, in ``initialize_ompi_environment``'s
    order so both unpack alike."""

    world_size: int
    rank: int
    local_rank: int


def _group() -> Any:
    """``torch.distributed`` when its default process group exists, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _int_variable(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise DistributedEnvironmentError(
            f"environment variable {name}={text!r} is not an integer; launch with torchrun "
            f"(or mpirun), which sets it, or unset it to run as a single process"
        ) from None


def _launch_variables(env: Mapping[str, str]) -> tuple[str, int, int, int] | None:
    """``(launcher, world_size, rank, local_rank)`` from the environment, or None if unlaunched.

    torchrun's variables win over Open MPI's when both are present (torchrun under mpirun).
    """
    for launcher, prefix in (("torchrun", ""), ("mpirun", "OMPI_COMM_WORLD_")):
        size_name = "WORLD_SIZE" if not prefix else prefix + "SIZE"
        world_size = _int_variable(env, size_name)
        if world_size is None:
            continue
        rank_name = "RANK" if not prefix else prefix + "RANK"
        rank = _int_variable(env, rank_name)
        if rank is None:
            raise DistributedEnvironmentError(
                f"{size_name} is set ({world_size}) but {rank_name} is not; launch with "
                f"{launcher}, which sets both, or unset {size_name} to run as a single process"
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise DistributedEnvironmentError(
                f"{rank_name}={rank} is not a rank of a world of {size_name}={world_size} "
                f"processes (ranks are 0 to {world_size - 1}); check the launcher's arguments"
            )
        local_rank = _int_variable(env, "LOCAL_RANK" if not prefix else prefix + "LOCAL_RANK")
        return launcher, world_size, rank, local_rank if local_rank is not None else 0
    return None


def _rendezvous(env: Mapping[str, str], launcher: str, world_size: int) -> tuple[str, str]:
    """``(MASTER_ADDR, MASTER_PORT)``; defaults only where they cannot be wrong (one node)."""
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    one_node = launcher == "mpirun" and env.get("OMPI_COMM_WORLD_LOCAL_SIZE") == str(world_size)
    if not addr:
        if not one_node:
            raise DistributedEnvironmentError(
                f"WORLD_SIZE={world_size} is set but MASTER_ADDR is not, so the processes "
                "cannot find rank 0: launch with torchrun (it sets MASTER_ADDR/MASTER_PORT), "
                "or export MASTER_ADDR=<rank 0's host> and MASTER_PORT=<free port> (with "
                "mpirun: mpirun -x MASTER_ADDR -x MASTER_PORT ...)"
            )
        addr = "127.0.0.1"
    if not port:
        if not one_node:
            raise DistributedEnvironmentError(
                f"MASTER_ADDR={addr} is set but MASTER_PORT is not; export MASTER_PORT=<free "
                "port on rank 0's host> (torchrun sets it) and launch again"
            )
        port = _DEFAULT_PORT
    try:
        port_number = int(port)
    except ValueError:
        port_number = -1
    if not 0 < port_number < 65536:
        raise DistributedEnvironmentError(
            f"MASTER_PORT={port!r} is not a port number; export a free TCP port, e.g. 29500"
        )
    return addr, port


def backend_for(device: str | torch.device | None) -> str | None:
    """The collective backend PyTorch pairs with ``device``'s type (``None``: torch decides).

    ``"cpu"`` gives ``"gloo"``; accelerator types get the backend PyTorch lists for them
    (``torch.distributed.Backend.default_device_backend_map``). Only the device string is
    read: no device is queried.

    Raises:
        ConfigurationError: ``device`` is not a device string, or PyTorch knows no backend for
            its type.
    """
    if device is None:
        return None
    given: object = device  # checked at run time: callers need not be type-checked
    if not isinstance(given, (str, torch.device)):
        raise ArgumentTypeError(
            f"device must be a str or torch.device (e.g. 'cpu'), got {type(given).__name__}"
        )
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ConfigurationError(
            f"device {device!r} is not a device string; pass e.g. 'cpu' or a type with an "
            f"index such as 'cuda:0' ({exc})"
        ) from None
    import torch.distributed as dist

    known = dict(getattr(dist.Backend, "default_device_backend_map", _FALLBACK_BACKENDS))
    backend = known.get(kind)
    if backend is None:
        raise ConfigurationError(
            f"PyTorch has no collective backend for device type {kind!r} (it knows "
            f"{sorted(known)}); pass backend= explicitly"
        )
    return str(backend)


def _resolve_timeout(timeout: float | timedelta | None, env: Mapping[str, str]) -> timedelta:
    """The argument, else ``PPE_DISTRIBUTED_TIMEOUT``, else ``DEFAULT_TIMEOUT``, as a timedelta."""
    if timeout is None:
        text = env.get(ENV_TIMEOUT, "").strip()
        if not text:
            return timedelta(seconds=DEFAULT_TIMEOUT)
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise DistributedEnvironmentError(
                f"environment variable {ENV_TIMEOUT}={text!r} is not a positive number of "
                f"seconds; set e.g. {ENV_TIMEOUT}=300, or unset it for the default "
                f"({DEFAULT_TIMEOUT:g} s)"
            )
        return timedelta(seconds=seconds)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = timedelta(seconds=timeout)
    elif not isinstance(timeout, timedelta):
        raise ArgumentTypeError(
            f"timeout must be seconds or a datetime.timedelta, got {type(timeout).__name__}"
        )
    if timeout.total_seconds() <= 0:
        raise ConfigurationError(f"timeout must be positive, got {timeout.total_seconds():g} s")
    return timeout


def init_from_env(
    device: str | torch.device | None = None,
    backend: str | None = None,
    *,
    timeout: float | timedelta | None = None,
) -> WorldInfo:
    """Creates the default process group from the launcher's environment, if launched.

    Under ``torchrun`` (``WORLD_SIZE``/``RANK`` set) or ``mpirun`` (``OMPI_COMM_WORLD_*`` set)
    it calls ``torch.distributed.init_process_group`` over ``MASTER_ADDR:MASTER_PORT``, also
    for a world of one, so DDP and the distributed evaluator work the same at every size.
    Started with plain ``python`` it does nothing and returns ``(1, 0, 0)`` at once. An existing
    group is kept (calling twice is harmless).

    A group it creates is torn down at interpreter exit (``shutdown``: a barrier, then
    ``destroy_process_group``), so scripts need no teardown of their own.

    Args:
        device: The device this process trains on; its type picks the backend (``"cpu"``:
            gloo, ``"cuda"``: nccl). ``None`` leaves the choice to PyTorch.
        backend: An explicit backend (``"gloo"``, ``"nccl"``, ...); overrides ``device``.
        timeout: How long a collective waits for every rank before it fails, in seconds or
            as a ``timedelta``. When None: ``PPE_DISTRIBUTED_TIMEOUT`` (seconds) if set, else
            ``DEFAULT_TIMEOUT`` (600 s).

    Returns:
        ``WorldInfo(world_size, rank, local_rank)``.

    Raises:
        DistributedEnvironmentError: The launch variables are inconsistent, e.g. ``WORLD_SIZE``
            without ``RANK`` or without ``MASTER_ADDR``, or ``PPE_DISTRIBUTED_TIMEOUT`` is not
            a positive number (a ``ValueError``).
        ConfigurationError: ``device``, ``backend`` or ``timeout`` cannot be used.
    """
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ArgumentTypeError(
            f"backend must be a backend name such as 'gloo' or 'nccl', got {backend!r}; or "
            "leave it out and pass device= to pick it"
        )
    env = os.environ
    launched = _launch_variables(env)
    group = _group()
    if group is not None:
        return WorldInfo(
            int(group.get_world_size()),
            int(group.get_rank()),
            launched[3] if launched is not None else 0,
        )
    if launched is None:
        return WorldInfo(1, 0, 0)
    launcher, world_size, rank, local_rank = launched
    if world_size > 1:  # before a group whose first object collective would fail
        require_object_collectives(f"training with {world_size} processes")
    chosen = backend if backend is not None else backend_for(device)
    addr, port = _rendezvous(env, launcher, world_size)
    wait = _resolve_timeout(timeout, env)
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedEnvironmentError(
            f"launched by {launcher} (WORLD_SIZE={world_size}) but this PyTorch build has no "
            "torch.distributed; install a PyTorch build with distributed support"
        )
    attempt = env.get("TORCHELASTIC_RESTART_COUNT")
    if launcher == "torchrun" and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and attempt:
        # torchrun's agent serves one store for the whole job and keeps the keys of every
        # attempt: after a restart, a rank could read a dead peer's address from the attempt
        # before and fail ("Gloo connectFullMesh failed ... Connection refused"). Each attempt
        # gets keys of its own.
        # (torch re-exports these without declaring them, hence the ignores)
        client = dist.TCPStore(  # type: ignore[attr-defined]
            addr, int(port), world_size, is_master=False, timeout=wait
        )
        store = dist.PrefixStore(f"ppe_core/attempt_{attempt}/", client)  # type: ignore[attr-defined]
        dist.init_process_group(chosen, store=store, world_size=world_size, rank=rank, timeout=wait)
    else:
        if launcher == "torchrun":
            # env:// joins the store torchrun's agent already serves on MASTER_PORT
            # (TORCHELASTIC_USE_AGENT_STORE); a tcp:// URL would try to serve that port again.
            url = "env://"
        else:
            url = f"tcp://[{addr}]:{port}" if ":" in addr else f"tcp://{addr}:{port}"
        dist.init_process_group(
            chosen, init_method=url, world_size=world_size, rank=rank, timeout=wait
        )
    _Created.group, _Created.timeout = dist.group.WORLD, wait.total_seconds()
    if not _Created.exit_handler_registered:
        # atexit runs before the interpreter starts finalizing: the backend's threads can still
        # take the GIL, which they cannot once finalization began (the process aborts then).
        atexit.register(_shutdown_at_exit)
        _Created.exit_handler_registered = True
    return WorldInfo(world_size, rank, local_rank)


def is_distributed() -> bool:
    """Whether the default ``torch.distributed`` process group exists."""
    return _group() is not None


def get_rank() -> int:
    """This process's global rank: the group's, else the launcher's ``RANK``, else 0."""
    group = _group()
    if group is not None:
        return int(group.get_rank())
    launched = _launch_variables(os.environ)
    return launched[2] if launched is not None else 0


def get_world_size() -> int:
    """The number of processes: the group's, else the launcher's ``WORLD_SIZE``, else 1."""
    group = _group()
    if group is not None:
        return int(group.get_world_size())
    launched = _launch_variables(os.environ)
    return launched[1] if launched is not None else 1


def group_world() -> tuple[int, int]:
    """``(world_size, rank)`` of the default process group; ``(1, 0)`` without one.

    For code that issues collectives or splits work among the group's members (which rank
    writes a snapshot, prints a report, gathers states): unlike :func:`get_rank`, it never
    reads the launcher's variables, since a process without a group shares nothing with the
    others. A process that never imported ``torch.distributed`` has no group, so this costs no
    import there.
    """
    if "torch.distributed" not in sys.modules:
        return 1, 0
    group = _group()
    if group is None:
        return 1, 0
    return int(group.get_world_size()), int(group.get_rank())


def require_group(owner: str, fix: str = "or use the non-distributed variant") -> None:
    """Raises unless the default process group exists (``owner`` names the feature).

    Raises:
        DistributedNotInitializedError: No process group (a ``RuntimeError``, as in PPE).
    """
    if _group() is None:
        raise DistributedNotInitializedError(
            f"{owner} needs torch.distributed to be initialised; call "
            f"torch.distributed.init_process_group(...) first (torchrun sets up the "
            f"environment), {fix}"
        )


def require_object_collectives(feature: str) -> None:
    """Raises when numpy is missing: ``feature`` exchanges Python objects between ranks.

    torch.distributed's object collectives (``all_gather_object``, ``broadcast_object_list``,
    and DCP's planning, which uses them) read the received bytes through ``Tensor.numpy()``;
    without numpy they fail inside the collective ("Numpy is not available"), for DCP in its
    background thread, long after the cause. Checked once where such a feature starts.

    Raises:
        OptionalDependencyError: numpy is not installed (an ``ImportError``).
    """
    if not _numpy_installed():
        raise missing_extra_error(
            f"{feature} (torch.distributed's object collectives read through numpy)",
            "numpy",
            "distributed",
        )


@functools.cache
def _numpy_installed() -> bool:
    try:
        import numpy  # noqa: F401  (torch has imported it already when it is installed)
    except ImportError:
        return False
    return True


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank of the default group, in rank order (``all_gather_object``)."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def get_local_rank() -> int:
    """This process's rank on its node (``LOCAL_RANK``), e.g. to pick ``f"cuda:{n}"``; else 0."""
    launched = _launch_variables(os.environ)
    return launched[3] if launched is not None else 0


def is_main_process() -> bool:
    """Whether this process is rank 0 (True when not distributed): the one that writes output."""
    return get_rank() == 0


def barrier() -> None:
    """Waits until every rank arrives; does nothing without a process group.

    The barrier's work is kept (:func:`run_collective`): a script's last barrier is usually
    followed by its exit, the case where gloo's release of the work could abort the process.
    """
    group = _group()
    if group is not None:
        run_collective(group.barrier)


def shutdown() -> None:
    """Waits for every rank, then destroys the default process group; no-op without one.

    Call it where a script is done with collectives before it ends (a group ``init_from_env``
    created is shut down at exit anyway). The barrier is what makes the teardown safe: a rank
    that destroys its group while a peer is still inside a collective (the last all-reduce of
    an evaluation, say) closes the connections that peer is reading from, and the peer fails,
    or aborts while its interpreter exits. Every rank must call it, as any collective.

    Raises:
        CollectiveTimeoutError: A peer did not reach the barrier within the group's timeout
            (the group is destroyed all the same).
    """
    dist = _group()
    if dist is None:
        return
    try:
        with timeouts_explained("waiting for the other ranks to shut down"):
            if dist.get_world_size() > 1:
                _wait_for_every_rank(dist)
    finally:
        _destroy(dist)


#: The work handles of ppe-core's most recent collectives (see :func:`run_collective`).
_RETAINED: collections.deque[Any] = collections.deque(maxlen=16)


def run_collective(collective: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Runs ``collective(*args, async_op=True, **kwargs)``, waits for it, and keeps its work.

    Seen in core dumps of aborted torchrun runs (a rerun of the DDP example on a finished
    output directory, about 1 run in 10 on a loaded machine): gloo's worker thread drops its
    reference to a finished collective's work a moment after the waiting rank was released.
    When that is the last reference, the worker frees the work's tensors, which needs the GIL;
    if the main thread has meanwhile begun finalizing the interpreter, the worker is ended by
    ``pthread_exit`` inside a C++ destructor and the process aborts ("terminate called without
    an active exception") although training finished. Keeping the work handle referenced from
    Python makes the worker's release a plain decrement: the work is freed later, by Python,
    holding the GIL. The last few collectives before exit are the ones at risk, so a short
    bounded history of handles is kept (their tensors are small).
    """
    work = collective(*args, async_op=True, **kwargs)
    _RETAINED.append(work)
    work.wait()


def _wait_for_every_rank(dist: Any) -> None:
    """A barrier whose work outlives the backend's hold on it (see :func:`run_collective`)."""
    if dist.get_backend() != "gloo":
        dist.barrier()  # a device tensor would be needed
        return
    run_collective(dist.all_reduce, torch.zeros(1))


def _destroy(dist: Any) -> None:
    if _Created.group is dist.group.WORLD:
        _Created.group = None
    dist.destroy_process_group()


def _shutdown_at_exit() -> None:
    """``shutdown`` for the group ``init_from_env`` created, if the script left it alive.

    After an uncaught exception (``sys.last_value`` is set) it skips the barrier: the peers may
    be waiting in a collective this rank will never join, and destroying the group at once
    ends their wait with an error instead of letting them wait out the timeout.
    """
    dist = _group()
    created, _Created.group = _Created.group, None
    if dist is None or created is None or created is not dist.group.WORLD:
        return  # gone already, or the user's own group (theirs to destroy)
    if getattr(sys, "last_value", None) is not None:
        dist.destroy_process_group()
        return
    try:
        shutdown()
    except RuntimeError as exc:  # an exception in an atexit handler would only be printed
        print(f"ppe_core.distributed: at exit: {exc}", file=sys.stderr, flush=True)


def timeout_error(exc: BaseException, during: str) -> CollectiveTimeoutError | None:
    """A ``CollectiveTimeoutError`` explaining ``exc`` if it is a collective's timeout, else None.

    For ppe-core's callers of collectives (the trainer's step, the evaluator's all-reduce,
    ``shutdown``): they raise the result ``from exc``. Backends word timeouts differently
    ("Timed out waiting 3000ms for recv" from gloo); all say "timed out" or "timeout".
    """
    if isinstance(exc, CollectiveTimeoutError) or not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if "timed out" not in text.lower() and "timeout" not in text.lower():
        return None
    configured = _Created.timeout if _Created.group is not None else None  # not a user's group
    limit = f"its timeout of {configured:g} s" if configured is not None else "its timeout"
    return CollectiveTimeoutError(
        f"rank {get_rank()} waited longer than the process group's timeout while "
        f"{during}: a peer rank stopped responding (frozen, deadlocked, or far slower than "
        f"this one), so the collective could not complete within {limit}. Look at the other "
        f"ranks' output for the cause. If the peers are only slow (e.g. rank 0 writing a large "
        f"snapshot), wait longer: init_from_env(timeout=<seconds>) or "
        f"{ENV_TIMEOUT}=<seconds> (default {DEFAULT_TIMEOUT:g}). Backend's message: {text}"
    )


@contextlib.contextmanager
def timeouts_explained(during: str) -> Iterator[None]:
    """Raises a collective's timeout in the block as :func:`timeout_error`'s
    ``CollectiveTimeoutError`` (``during``: what the collectives do), from the backend's error;
    other errors pass unchanged."""
    try:
        yield
    except RuntimeError as exc:
        timed_out = timeout_error(exc, during)
        if timed_out is None:
            raise
        raise timed_out from exc
