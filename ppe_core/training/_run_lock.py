"""One run per output directory: an OS-level lock on ``out_dir`` held while a manager runs.

Two training processes writing into one directory overwrite each other's snapshots and logs
(or one autoloads the other's half-written files). A manager whose extensions write into its
output directory therefore takes an exclusive ``flock`` on ``<out_dir>/.ppe_core_run.lock``
when it starts, and releases it when it is finalized. The lock belongs to an open file, so
it dies with the process: a SIGKILLed holder leaves no live lock, only a file whose content
(pid, host, start time, job id) the next run reports when it takes the lock over.

A lock file deleted (or replaced) while its run holds it no longer protects the directory: a
second run would find no lock. The holder notices at its next write into ``out_dir`` (the
writer asks :func:`check_before_write`, one ``os.stat``; never per step) and takes the lock
again with a :class:`RunLockWarning`, or, if a second run took the directory meanwhile,
raises :class:`OutputDirectoryInUseError` before writing anything more.

Within one process the lock is shared: managers of the same process on the same directory
(a notebook re-running a cell after an error, tests) do not refuse each other; the lock is
released when the last of them finishes. Under ``torch.distributed`` only rank 0 takes it,
so the ranks of one job never refuse each other.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from ppe_core.errors import ConfigurationError, OutputDirectoryInUseError, RunLockWarning
from ppe_core.writing import _writer_base

__all__ = [
    "RUN_LOCK_FILENAME",
    "ManagerRunLock",
    "OutputDirectoryInUseError",
    "RunLock",
    "RunLockWarning",
    "acquire_run_lock",
    "check_before_write",
]

#: The lock file's name inside ``out_dir``; hidden, so PPE's autoload never considers it.
RUN_LOCK_FILENAME = ".ppe_core_run.lock"
# How long a refused run waits for the holder's details to appear (it writes them right
# after locking, so an empty file means it is between the two).
_DETAILS_WAIT_S = 1.0
# errno values meaning "this file system does not do locks" (some network file systems).
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
# errno values of a lock file this process may not create or open (a read-only directory, a
# stale lock file of another user); a run there cannot be protected, but need not fail.
_NO_ACCESS = {errno.EACCES, errno.EPERM, errno.EROFS}


if sys.platform == "win32":
    import msvcrt

    # Windows locks are mandatory: the locked byte lies far past the holder's details so that a
    # refused process can still read them.
    _LOCK_OFFSET = 1 << 30

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, _LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EDEADLK):
                return False
            raise
        finally:
            os.lseek(fd, 0, os.SEEK_SET)
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, _LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


class _Held:
    """One directory's lock as this process holds it: the open file, its identity (device,
    inode) and how many hold it."""

    __slots__ = ("count", "fd", "ident", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.ident = _ident(os.fstat(fd))
        self.count = 0


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


# This process's locks by lock-file path, guarded by _guard (managers may start in threads).
# Reentrant: garbage collection may release an abandoned manager's share (a weakref
# finalizer) while this thread is inside the guarded block.
_held: dict[str, _Held] = {}
_guard = threading.RLock()
# Output directories as writers name them (``manager.out``) -> their lock file's path, so that
# the check before a write needs no path resolution.
_lock_paths: dict[str, str] = {}


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker, a ProcessWriter) inherits the open lock files. It
    # closes its copies (which leaves the parent's lock in place; flock is released only when
    # every copy is closed) so that the lock dies with the process that took it.
    global _guard
    _guard = threading.RLock()
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _held.clear()
    _lock_paths.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class RunLock:
    """This manager's share of its process's lock on an output directory.

    :meth:`release` (or garbage collection, or the process ending) gives the share back; the
    last share unlocks the directory and removes the lock file.
    """

    def __init__(self, path: str) -> None:
        #: The lock file's path.
        self.path = path
        self._finalizer = weakref.finalize(self, _release, path)

    def release(self) -> None:
        """Gives this share back (later calls do nothing)."""
        self._finalizer()


def _release(path: str) -> None:
    with _guard:
        held = _held.get(path)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _held[path]
        for key in [key for key, value in _lock_paths.items() if value == path]:
            del _lock_paths[key]
        # On POSIX the file is removed while still locked: a process that opened it meanwhile
        # sees that it is no longer the file at ``path`` and retries (see _lock_file). Windows
        # cannot remove an open file, so there it goes after closing. A file at ``path`` that
        # is not ours (ours was deleted and another run locked a new one) stays.
        ours = _still_at(held.fd, path)
        with contextlib.suppress(OSError):
            if ours and sys.platform != "win32":
                os.unlink(path)
            _unlock(held.fd)
        os.close(held.fd)
        if ours and sys.platform == "win32":
            with contextlib.suppress(OSError):
                os.unlink(path)


def _is_rank_zero() -> bool:
    from ppe_core.distributed import get_rank

    return get_rank() == 0


def acquire_run_lock(out_dir: str) -> RunLock | None:
    """Takes the run lock on ``out_dir`` for this process (rank 0 only under distributed).

    Args:
        out_dir: The output directory (an existing local directory).

    Returns:
        The share to release when the run ends; None on ranks other than 0, and where the
        file system cannot lock (after a :class:`RunLockWarning`).

    Raises:
        OutputDirectoryInUseError: Another live process holds the lock.
    """
    if not _is_rank_zero():
        return None
    # The real path: managers of this process reaching the directory by other names share.
    directory = os.path.realpath(out_dir or ".")
    path = os.path.join(directory, RUN_LOCK_FILENAME)
    with _guard:
        while True:
            held = _held.get(path)
            if held is None:
                fd = _lock_file(directory, path)
                if fd is None:
                    return None
                held = _held[path] = _Held(fd, path)
            held.count += 1
            if _held.get(path) is held:
                break
            # Garbage collection released the last other share between the two lines above:
            # that lock is gone, so take the directory afresh.
        _lock_paths[os.fspath(out_dir)] = path
    return RunLock(path)


def check_before_write(out_dir: str) -> None:
    """Makes sure this process still holds the run lock of ``out_dir``, before a write there.

    Writers call it before each file they write (not per step: a log appended every step
    reaches it once per sync interval). Directories this process holds no lock on cost one
    dictionary lookup; a held one costs one ``os.stat``, comparing the file at the lock path
    with the file this process locked. If they differ (the lock file was deleted, or replaced
    by another file), the lock is taken again with a :class:`RunLockWarning`.

    Raises:
        OutputDirectoryInUseError: Another live process locked the directory after the lock
            file was deleted (a second run started there); this run must not write on.
        ConfigurationError: Something that is not a file now sits at the lock path.
    """
    path = _lock_paths.get(out_dir)
    if path is None:
        return
    held = _held.get(path)
    if held is None:
        return
    try:
        current: tuple[int, int] | None = _ident(os.stat(path))
    except FileNotFoundError:
        current = None
    except OSError:
        return  # cannot tell (permissions changed): leave the lock as it is
    if current != held.ident:
        _retake(held, deleted=current is None)


def _retake(held: _Held, *, deleted: bool) -> None:
    """Locks the file now at ``held.path`` for this process in place of the lost one."""
    path = held.path
    directory = os.path.dirname(path)
    with _guard:
        if _held.get(path) is not held:
            return  # released meanwhile
        with contextlib.suppress(OSError):
            if _ident(os.stat(path)) == held.ident:
                return  # another thread (a background writer's) took it again meanwhile
        what = "deleted" if deleted else "replaced by another file"
        while True:
            _refuse_non_file(path)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                locked = _try_lock(fd)
            except OSError:
                os.close(fd)
                raise
            if not locked:
                holder = _read_details(fd, wait=_DETAILS_WAIT_S)
                os.close(fd)
                who = "another process" if holder is None else _describe(holder)
                raise OutputDirectoryInUseError(
                    f"the run lock file {path} of this run's output directory was deleted or "
                    "replaced while this run held it, and another training run now holds the "
                    f"directory: {who}. Two runs writing into one directory overwrite each "
                    "other's snapshots and logs, so this run stops before writing anything "
                    "more. Let that run finish and restart this one with another out_dir (or "
                    "stop that run); never delete the lock file of a live run"
                )
            if _still_at(fd, path):
                break
            os.close(fd)  # removed between our open and lock: take the file there now
        _write_details(fd)
        old, held.fd, held.ident = held.fd, fd, _ident(os.fstat(fd))
        with contextlib.suppress(OSError):
            _unlock(old)
        os.close(old)
    warnings.warn(
        RunLockWarning(
            f"the run lock file {path} was {what} while this run held it, so another run "
            f"could have started in {directory!r}; none holds it, so this run took the lock "
            "again. Do not delete the lock file of a live run"
        ),
        stacklevel=4,
    )


def _refuse_non_file(path: str) -> None:
    """Raises if something other than a regular file (a directory, a FIFO, ...) is at ``path``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    raise ConfigurationError(
        f"the run lock path {path} is {kind}, not a lock file: ppe-core locks the output "
        f"directory {os.path.dirname(path)!r} through a file of that name (one run per "
        "directory). It is not ppe-core's: remove it, or pass another out_dir"
    )


class ManagerRunLock:
    """A manager's run lock: taken when its extensions start, released when it is finalized."""

    def __init__(self) -> None:
        self._lock: RunLock | None = None

    def take(self, out_dir: str, writes: bool) -> None:
        """Locks ``out_dir`` for this run when the run writes there (``writes``).

        Only a manager's extensions write (through the writer or into its ``out``), so a
        manager without extensions takes no lock, nor does one whose output directory is not
        on this machine (a writer with a remote ``fs=``: the writer's ``initialize`` created no
        local directory).

        Raises:
            OutputDirectoryInUseError: Another live process trains into the same directory.
        """
        if self._lock is None and writes and os.path.isdir(out_dir or "."):
            self._lock = acquire_run_lock(out_dir)

    def release(self) -> None:
        """Releases the lock if held (later calls do nothing)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    @contextlib.contextmanager
    def released_after(self) -> Iterator[None]:
        """Releases the lock when the block ends, also when it raises (the run is over)."""
        try:
            yield
        finally:
            self.release()

    @contextlib.contextmanager
    def released_on_error(self) -> Iterator[None]:
        """Releases the lock when the block raises: the run never started, so another may use
        the directory."""
        try:
            yield
        except BaseException:
            self.release()
            raise


def _lock_file(directory: str, path: str) -> int | None:
    """Opens, locks and stamps ``path``; the open descriptor, or None if locks are unsupported."""
    while True:
        _refuse_non_file(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno == errno.EISDIR:  # a directory appeared there since the check
                _refuse_non_file(path)
            if exc.errno not in _NO_ACCESS:
                raise
            _warn_unprotected(directory, f"the lock file cannot be opened: {exc}")
            return None
        try:
            locked = _try_lock(fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise
            _warn_unprotected(directory, f"its file system does not support file locks: {exc}")
            return None
        if not locked:
            holder = _read_details(fd, wait=_DETAILS_WAIT_S)
            os.close(fd)
            raise OutputDirectoryInUseError(_in_use_message(directory, path, holder))
        if not _still_at(fd, path):
            # The holder finished and removed this file between our open and lock: retry on
            # the file now at ``path`` (or a new one).
            os.close(fd)
            continue
        previous = _read_details(fd, wait=0.0)
        if previous is not None:
            warnings.warn(
                RunLockWarning(
                    f"taking over the run lock of {directory!r} from {_describe(previous)}: "
                    "that run did not finish cleanly (killed or crashed) and no process holds "
                    "the lock any more; this run now owns the directory"
                ),
                stacklevel=5,
            )
        _write_details(fd)
        return fd


def _warn_unprotected(directory: str, why: str) -> None:
    warnings.warn(
        RunLockWarning(
            f"cannot lock the output directory {directory!r} ({why}); this run goes on "
            "without protection against a second run writing into the same directory"
        ),
        stacklevel=6,
    )


def _still_at(fd: int, path: str) -> bool:
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)


def _details() -> dict[str, Any]:
    job = next(
        (
            f"{name}={os.environ[name]}"
            for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
            if os.environ.get(name)
        ),
        None,
    )
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "job": job,
        "command": " ".join(sys.argv)[:200],
    }


def _write_details(fd: int) -> None:
    data = json.dumps(_details()).encode()
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)


def _read_details(fd: int, *, wait: float) -> dict[str, Any] | None:
    """The holder's details from the lock file; None if it has none (yet)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            raw = os.read(fd, 64 * 1024)
        except OSError:
            return None
        try:
            details = json.loads(raw.decode()) if raw.strip() else None
        except (UnicodeDecodeError, ValueError):
            details = {"unreadable": raw[:80].decode(errors="replace")}
        if isinstance(details, dict) or time.monotonic() >= deadline:
            return details if isinstance(details, dict) else None
        time.sleep(0.05)


def _describe(details: dict[str, Any]) -> str:
    if "pid" not in details:
        return f"an unknown process (lock file content {details.get('unreadable', '')!r})"
    text = f"pid {details['pid']} on host {details.get('host', '?')!r}"
    if details.get("job"):
        text += f" (job {details['job']})"
    if details.get("since"):
        text += f", running since {details['since']}"
    if details.get("command"):
        text += f", command {details['command']!r}"
    return text


def _in_use_message(directory: str, path: str, holder: dict[str, Any] | None) -> str:
    who = "another process" if holder is None else _describe(holder)
    return (
        f"the output directory {directory!r} is in use by another training run: {who}. Two "
        "runs writing into one directory overwrite each other's snapshots and logs, so this "
        "one does not start. Wait for that run to finish, or pass another out_dir; if that "
        f"process is gone (e.g. it ran on another host sharing this directory), delete {path}"
    )


# The writers ask before each file they write into a directory (see check_before_write).
_writer_base._before_write = check_before_write
