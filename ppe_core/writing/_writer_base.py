"""The ``Writer`` base class: the one place where ppe-core writes files, crash-safely."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import socket
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import IO, Any, NoReturn, Protocol, TypeAlias, TypeVar

from ppe_core.errors import (
    ConfigurationError,
    DiskFullError,
    WriterError,
    WriterFinalizedError,
)

__all__ = [
    "HOST_TAG",
    "DiskFullError",
    "FileSystem",
    "SaveFun",
    "Target",
    "Writer",
    "WriterError",
    "WriterFinalizedError",
    "disk_full_error",
    "process_is_dead",
    "run_job",
]

#: ``savefun(target, file_object, **kwargs)`` serializes ``target`` into an open binary file,
#: like ``torch.save``.
SaveFun: TypeAlias = Callable[..., object]

#: What writers save: a state dictionary, a log (list of dicts) or any object ``savefun`` takes.
Target: TypeAlias = Mapping[str, Any] | Sequence[Any] | Any


_T = TypeVar("_T")

#: Called with the output directory before each file a writer writes there: the run lock's
#: check that this process still holds the directory (``training._run_lock`` sets it).
_before_write: Callable[[str], None] | None = None


class FileSystem(Protocol):
    """The file operations a writer needs; ``fs=`` objects (e.g. PFIO's) provide them."""

    def open(self, file_path: str, mode: str = "rb") -> IO[Any]: ...

    def makedirs(self, file_path: str, mode: int = 0o777, exist_ok: bool = False) -> None: ...

    def exists(self, file_path: str) -> bool: ...

    def rename(self, src: str, dst: str) -> None: ...

    def remove(self, file_path: str, recursive: bool = False) -> None: ...


class _LocalFileSystem:
    """The default :class:`FileSystem`: the local POSIX/Windows file system."""

    def open(self, file_path: str, mode: str = "rb") -> IO[Any]:
        return open(file_path, mode)

    def makedirs(self, file_path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        os.makedirs(file_path, mode, exist_ok)

    def exists(self, file_path: str) -> bool:
        return os.path.exists(file_path)

    def rename(self, src: str, dst: str) -> None:
        # os.replace overwrites atomically on POSIX and Windows, unlike os.rename on Windows.
        os.replace(src, dst)

    def remove(self, file_path: str, recursive: bool = False) -> None:
        if recursive:
            import shutil

            shutil.rmtree(file_path)
        elif os.path.isdir(file_path):
            os.rmdir(file_path)
        else:
            os.remove(file_path)

    def fsync_dir(self, dir_path: str) -> None:
        """Makes a rename or a file creation in ``dir_path`` durable (POSIX only)."""
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
        try:
            fd = os.open(dir_path or ".", flags)
        except OSError:  # Windows cannot open directories; renames there are durable anyway
            return
        try:
            os.fsync(fd)
        except OSError:  # some file systems (network, tmpfs variants) refuse directory fsync
            pass
        finally:
            os.close(fd)


def _sync_file(file_obj: IO[Any]) -> None:
    """Flushes Python's buffer and asks the OS to put the bytes on the storage device."""
    file_obj.flush()
    try:
        fileno = file_obj.fileno()
    except (AttributeError, OSError, ValueError):  # not backed by a local descriptor
        return
    os.fsync(fileno)


#: How many appended files a writer keeps open at once (the least recently opened closes).
_OPEN_APPENDS = 8

#: How many destination paths a writer remembers (see :meth:`Writer._destination`).
_FLAT_DESTINATIONS = 64


class _Kept:
    """A handle kept open between appends to one file, with what the writer knows of it."""

    __slots__ = ("file", "identity", "positional", "size")

    def __init__(
        self, file: IO[bytes], identity: tuple[int, int], positional: bool, size: int | None
    ) -> None:
        self.file = file
        #: ``(st_dev, st_ino)`` of the file it opened.
        self.identity = identity
        #: Opened without ``O_APPEND`` (for a savefun that writes at offsets).
        self.positional = positional
        #: The file's size after the last positional append (None: unknown, ``fstat`` it).
        self.size = size


class _AppendFiles:
    """Local files kept open for appending between a writer's appends, by destination path.

    Opening, checking for and closing a log file per entry cost about as much as writing it.
    A kept handle is used without a look at the path (no system call but the write) until its
    file is due for an ``fsync`` (see :meth:`Writer._append_local`); then :meth:`open` checks
    that the path still names the file it opened (one ``stat``), so a file replaced (a
    rewrite's rename) or removed meanwhile is reopened, and created again. Each append is
    still flushed to the OS before it returns; only the open is saved. Pickles empty (a
    process writer's worker opens its own), and a forked child drops its parent's. A handle is
    opened for appending (``O_APPEND``), or without ``O_APPEND`` (which moves every write to
    the end) for a savefun that writes at offsets it chooses (see :class:`Writer`,
    ``positional``).
    """

    def __init__(self) -> None:
        #: dest -> its kept handle.
        self.files: dict[str, _Kept] = {}
        _LIVE_APPEND_FILES.add(self)
        # A writer dropped without finalize() closes its handles quietly. Not __del__: in a
        # reference cycle (manager, extensions, writer) the garbage collector may finalize a
        # handle before its owner, and a file closed by its own finalizer warns
        # (ResourceWarning). The finalizer holds the dict, so the handles stay out of the cycle.
        weakref.finalize(self, _close_files, self.files)

    def __reduce__(self) -> tuple[type[_AppendFiles], tuple[()]]:
        return (_AppendFiles, ())

    def forget(self) -> None:
        """Drops the handles: in a forked child they are copies of the parent's, not its own.

        Closed here (the child's descriptors only; their buffers are flushed after every
        append, so nothing is written), as dropping them would at garbage collection.
        """
        _close_files(self.files)

    def open(self, dest: str, positional: bool = False) -> tuple[_Kept, bool, bool]:
        """The handle for ``dest``, checked against the path (a ``stat``), opened if need be.

        Args:
            dest: The file's path.
            positional: Open it without ``O_APPEND`` (mode ``'wb'``, not truncated), for a
                savefun that writes at offsets (``os.pwrite``); otherwise for appending
                (mode ``'ab'``).

        Returns:
            The kept handle; whether this call created the file; and whether the handle kept
            before this call named another file than the path now does (or none: removed).
        """
        try:
            stat = os.stat(dest)
        except FileNotFoundError:
            identity = None
        else:
            identity = (stat.st_dev, stat.st_ino)
        kept = self.files.get(dest)
        replaced = False
        if kept is not None:
            if kept.identity == identity:
                if kept.positional == positional:
                    kept.size = stat.st_size
                    return kept, False, False
            else:
                replaced = True
            self.close(dest)
        if len(self.files) >= _OPEN_APPENDS:
            self.close(next(iter(self.files)))
        file_obj: IO[bytes]
        if positional:
            flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0)
            fd = os.open(dest, flags, 0o666)
            try:  # an existing descriptor: "wb" truncates nothing
                file_obj = open(fd, "wb")  # noqa: SIM115 (kept open; closed by close())
            except BaseException:
                os.close(fd)
                raise
        else:
            file_obj = open(dest, "ab")  # noqa: SIM115 (kept open; closed by close())
        opened = os.fstat(file_obj.fileno())
        kept = _Kept(file_obj, (opened.st_dev, opened.st_ino), positional, opened.st_size)
        self.files[dest] = kept
        return kept, identity is None, replaced

    def close(self, dest: str) -> None:
        """Closes the handle kept for ``dest``, if any."""
        kept = self.files.pop(dest, None)
        if kept is not None:
            with contextlib.suppress(OSError):  # its bytes were flushed after each append
                kept.file.close()

    def close_all(self) -> None:
        _close_files(self.files)


def _close_files(files: dict[str, _Kept]) -> None:
    """Closes and forgets every handle in ``files`` (the dict is emptied in place)."""
    while files:
        file_obj = files.popitem()[1].file
        with contextlib.suppress(OSError):  # its bytes were flushed after each append
            file_obj.close()


#: Every _AppendFiles of this process, for the fork handler below.
_LIVE_APPEND_FILES: weakref.WeakSet[_AppendFiles] = weakref.WeakSet()


def _forget_append_files() -> None:
    """In a forked child: no writer appends through the parent's handles (checked at fork,
    not by a ``getpid`` per append)."""
    for files in list(_LIVE_APPEND_FILES):
        files.forget()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_forget_append_files)


#: This host's tag in temporary names: a kill leaves a temporary file behind, and only a
#: process on the host that wrote it can tell whether its writer (the pid beside the tag) died.
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]

#: ``.<name>.<host tag>-<pid>-<random>.tmp``, the temporary files :func:`_temporary_path` makes.
_TEMPORARY_NAME = re.compile(r"\..+\.(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[0-9a-f]{8}\.tmp")


def _temporary_path(dest: str) -> str:
    """A fresh temporary name beside ``dest``, hidden, renamed onto ``dest`` when complete."""
    parent, base = os.path.split(dest)
    # Same directory as the destination, so the final rename never crosses file systems.
    # The random part keeps concurrent writers (threads, processes, ranks) apart; host and
    # pid tell a later run whether the writer of a leftover is dead (see _remove_dead_temps).
    name = f".{base}.{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    return os.path.join(parent, name)


def process_is_dead(pid: int) -> bool:
    """Whether no process ``pid`` exists on this host (a zombie still counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists, owned by another user
        return False
    return False


#: How many directory levels below the output directory are searched for leftovers: files
#: go there or one level down (sharded snapshots, ``snapshots_on_error/``), or two (sharded
#: error snapshots); no deeper, so that an output directory such as ``.`` is not walked whole.
_TEMP_DEPTH = 2


def _remove_dead_temps(directory: str) -> list[str]:
    """Removes the temporary files under ``directory`` whose writer process died on this host.

    A writer killed mid-save (SIGKILL, OOM) leaves its temporary file, possibly gigabytes.
    Only files named by :func:`_temporary_path` with this host's tag and the pid of a process
    that no longer exists are removed: a live writer's (this run's, another rank's, another
    host's on a shared file system) is never touched. POSIX only: elsewhere there is no
    side-effect-free way to probe a pid, and nothing is removed.

    Returns:
        The removed paths.
    """
    if os.name != "posix":
        return []
    removed = []
    top = directory.rstrip(os.sep).count(os.sep)
    for parent, subdirs, names in os.walk(directory):
        if parent.rstrip(os.sep).count(os.sep) - top >= _TEMP_DEPTH:
            subdirs.clear()  # deeper than any file a writer puts there (see _TEMP_DEPTH)
        for name in names:
            match = _TEMPORARY_NAME.fullmatch(name)
            if match is None or match["host"] != HOST_TAG:
                continue
            if process_is_dead(int(match["pid"])):
                path = os.path.join(parent, name)
                try:
                    os.remove(path)
                except OSError:  # removed meanwhile, or not ours to remove: leave it
                    continue
                removed.append(path)
    return removed


#: Below this many free bytes after a failed write, the file system counts as full: writes
#: fill it to the last block before failing, so a full disk has (almost) nothing left.
_FULL_DISK_BYTES = 1 << 20


def disk_full_error(exc: BaseException, path: str) -> DiskFullError | None:
    """A :class:`DiskFullError` naming ``path`` if ``exc`` was caused by a full file system.

    ``ENOSPC``/``EDQUOT`` say so directly; torch's serializer reports a failed write as a
    ``RuntimeError`` without the errno, so then the free space left decides. Must be called
    before the partial file is removed (which frees its space).
    """
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        full = True
    elif isinstance(exc, (OSError, RuntimeError)):
        try:
            stat = os.statvfs(os.path.dirname(path) or ".")
        except (OSError, AttributeError):  # no statvfs on Windows
            return None
        full = stat.f_bavail * stat.f_frsize < _FULL_DISK_BYTES
    else:
        full = False
    if not full:
        return None
    return DiskFullError(
        errno.ENOSPC,
        f"no space left on the device (the disk is full or over quota) while writing "
        f"{os.path.basename(path)!r} ({type(exc).__name__}: {exc}); the previous file of that "
        "name is untouched. Free some space or point out_dir at another disk",
        path,
    )


def run_job(job: Callable[[], _T], future: Future[_T]) -> None:
    """Runs ``job`` and puts its result or failure into ``future``, whose owner collects it."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = job()
    except BaseException as exc:  # the submitter's to report (see Writer.submit)
        future.set_exception(exc)
    else:
        future.set_result(result)


class Writer:
    """Base class of writers: saves objects into files under an output directory.

    Extensions (snapshots, logs) call a writer instead of opening files themselves. Every save
    is crash-safe: the object is written to a temporary file next to the destination, flushed,
    ``fsync``-ed and then renamed onto the final name (and the directory is synced), so a kill
    at any moment leaves either the previous file or the new one under the final name, never a
    partial one. With ``append=True`` the bytes are appended to the existing file instead,
    which never loses what the file already held (at worst the last record is partial). An
    append costs the same however long the file is: the bytes reach the operating system
    before the call returns (a killed process loses nothing appended before), and on the
    local file system they are ``fsync``-ed at most every :attr:`append_sync_interval`
    seconds and by :meth:`finalize`, so a machine crash (power loss) loses at most the appends
    of that interval. A ``savefun`` whose ``positional`` attribute is true extends a file at
    offsets it chooses (``os.pwrite``; LogReport's JSON log writes its new entries over the
    array's closing bracket): on the local file system its appends get a handle opened without
    ``O_APPEND`` and the keyword argument ``size`` (the file's size before the append, which
    the writer keeps between appends: the savefun returns the size after it), and otherwise the
    same sync and flush as any append. An appended file kept open is checked against its path
    only when due for its ``fsync`` (see :attr:`append_reopens`). A caller that appends to one
    file again and again (a log written every step) takes an :meth:`appender` of it, which
    writes most appends with one system call where the writer saves in the calling thread.

    Subclasses decide where the save runs (this thread, another thread, another process) by
    overriding :meth:`__call__`; all of them end up in :meth:`save`. Work made of several
    dependent files (a snapshot: its data file, its manifest, then retiring old snapshots) is
    handed over whole with :meth:`submit`, so that each writer has one background mechanism.

    Args:
        fs: File system to write through; the local file system by default. An object with
            PFIO's interface (``open``, ``makedirs``, ``exists``, ``rename``, ``remove``) works.
        out_dir: Directory this writer writes into. When set (non-empty) it takes precedence
            over the ``out_dir`` passed to :meth:`__call__`.
    """

    #: Whether :meth:`submit` runs jobs in a background worker (False: at once, in the caller).
    in_background = False

    #: Seconds between two ``fsync`` of a file appended to (``append=True``) on the local file
    #: system; each append is flushed to the operating system at once. An append at least this
    #: long after the file's previous sync syncs it, and :meth:`finalize` syncs the rest. 0
    #: syncs every append (an ``fsync`` costs milliseconds on many disks). It is also how
    #: long an append may go, unnoticed, into a file that was replaced or removed under the
    #: writer (see :attr:`append_reopens`).
    append_sync_interval: float = 1.0

    #: How many times an append found that the file kept open for it had been replaced or
    #: removed under this writer (and reopened the path, creating it if need be). The path is
    #: checked when the file is due for its ``fsync`` (at most every
    #: :attr:`append_sync_interval` seconds), not per append, so the appends made within that
    #: interval went to the replaced file. LogReport rewrites its log whole when this grows.
    append_reopens: int = 0

    def __init__(
        self, fs: FileSystem | None = None, out_dir: str | os.PathLike[str] | None = None
    ) -> None:
        self.fs: FileSystem = _LocalFileSystem() if fs is None else fs
        # A pathlib.Path is accepted (PPE 0.9 does); paths are kept as str from here on.
        self.out_dir = None if out_dir is None else os.fspath(out_dir)
        self._post_save_hooks: list[Callable[[], object]] = []
        self._initialized = False
        # Appended files: when each was last fsync-ed, and those appended to since.
        self._synced_at: dict[str, float] = {}
        self._unsynced: set[str] = set()
        self._append_files = _AppendFiles()
        # (out_dir, filename) -> destination, for names without a directory part.
        self._flat_destinations: dict[tuple[str, str], str] = {}

    def __call__(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        *,
        savefun: SaveFun | None = None,
        append: bool = False,
    ) -> None:
        """Saves ``target`` into ``out_dir/filename`` (possibly in the background).

        Args:
            filename: Name of the file, relative to the output directory; it may contain
                sub-directories, which are created.
            out_dir: Output directory (usually ``manager.out``); ignored when the writer has
                its own ``out_dir``.
            target: The object to save. Background writers read it later, so it must not be
                modified after the call (pass a copy of live tensors).
            savefun: ``savefun(target, file_object)``; the writer's default when None.
            append: Append to the file instead of replacing it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def initialize(self, out_dir: str) -> None:
        """Creates the output directory; called by the manager and before the first save.

        On the local file system it also removes the temporary files that writers killed
        mid-save left there, when their process is dead (see :func:`_remove_dead_temps`).

        Args:
            out_dir: The directory to create (the writer's own ``out_dir`` wins when set).

        Raises:
            ConfigurationError: The directory (or a parent) is an existing file.
        """
        directory = self.out_dir or os.fspath(out_dir)
        if directory:  # "" means the current directory, which exists
            try:
                self.fs.makedirs(directory, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise ConfigurationError(
                    f"the output directory {directory!r} cannot be created: it or one of its "
                    "parents is an existing file. Pass a directory path as out_dir (or move "
                    "the file away)"
                ) from None
        if self.writes_local_files:
            # Temporary files of writers killed mid-save in an earlier run of this directory.
            _remove_dead_temps(directory or ".")
        self._initialized = True

    def finalize(self) -> None:
        """Waits for pending saves and releases resources; later calls do nothing.

        This base class syncs the files appended to since their last ``fsync`` (see
        :attr:`append_sync_interval`); subclasses do so once their saves are done.

        Raises:
            WriterError: A background save failed.
        """
        self.sync_appends()

    def submit(self, job: Callable[[], _T]) -> Future[_T]:
        """Runs ``job`` where this writer does its background work, after the saves before it.

        ``job`` writes its files with :meth:`save` or :meth:`save_via_path` (in the worker, so
        they are crash-safe as any save) and may do its bookkeeping between them. Background
        writers (:attr:`in_background`) run it in their worker: :class:`ThreadWriter` and
        :class:`ThreadQueueWriter` in their thread, in order with their saves; the process
        writers in a thread of this process, one job at a time, since a job is a closure over
        this process's state. This base class runs it at once, in the calling thread.
        :meth:`finalize` waits for submitted jobs.

        Returns:
            A future holding what ``job`` returned or raised. A failure is the submitter's to
            collect: neither later saves nor :meth:`finalize` report it.

        Raises:
            WriterFinalizedError: The writer was finalized (background writers).
            WriterError: An earlier background save failed (background writers).
        """
        future: Future[_T] = Future()
        run_job(job, future)
        return future

    def save(
        self,
        filename: str,
        out_dir: str,
        target: Target,
        savefun: SaveFun,
        append: bool,
        **savefun_kwargs: Any,
    ) -> None:
        """Writes ``target`` with ``savefun`` crash-safely, in the calling thread.

        Args:
            filename: File name relative to the output directory.
            out_dir: Output directory; the writer's own ``out_dir`` wins when set.
            target: The object to save.
            savefun: ``savefun(target, file_object, **savefun_kwargs)``.
            append: Append to the file instead of atomically replacing it.
            **savefun_kwargs: Passed on to ``savefun``.

        Raises:
            DiskFullError: The file system is full; the message names the file.
            Exception: Whatever ``savefun`` or the file system raised; the temporary file is
                removed first and the destination is left untouched.
        """
        dest = self._destination(filename, out_dir)
        if not append:
            self._replace(dest, target, savefun, savefun_kwargs)
        elif isinstance(self.fs, _LocalFileSystem):  # writes_local_files, without the call
            self._append_local(dest, target, savefun, savefun_kwargs)
        else:
            self._append_remote(dest, target, savefun, savefun_kwargs)
        if self._post_save_hooks:
            self._post_save()

    @property
    def writes_local_files(self) -> bool:
        """Whether this writer writes to the local file system (so :meth:`save_via_path` works)."""
        return isinstance(self.fs, _LocalFileSystem)

    def appender(self, filename: str, out_dir: str, savefun: SaveFun) -> Appender:
        """An :class:`Appender` of ``out_dir/filename``, for a caller that appends to it often.

        ``appender(target)`` appends as ``self(filename, out_dir, target, savefun=savefun,
        append=True)`` does and tells whether the file is still the one the appender began
        with. This base class's appender calls the writer for every append (its saves may run
        elsewhere); :class:`~ppe_core.writing.SimpleWriter`'s writes most appends itself.
        """
        return Appender(self, filename, out_dir, savefun, direct=False)

    def save_via_path(self, filename: str, out_dir: str, write: Callable[[str], _T]) -> _T:
        """Like :meth:`save`, but ``write(path)`` creates the temporary file itself.

        For serializers that are faster given a path than a Python file object: ``torch.save``
        to a path writes from C++ without holding the GIL, so a save in a background thread
        does not stall the training thread. The file is then ``fsync``-ed and renamed onto
        ``out_dir/filename`` exactly as :meth:`save` does. Runs in the calling thread.

        Args:
            filename: File name relative to the output directory.
            out_dir: Output directory; the writer's own ``out_dir`` wins when set.
            write: ``write(path)`` writes the whole file at ``path`` (which does not exist yet).

        Returns:
            What ``write`` returned (e.g. the digest of the bytes it wrote).

        Raises:
            ConfigurationError: The writer's ``fs`` is not the local file system (see
                :attr:`writes_local_files`); use :meth:`save` with a file-object ``savefun``.
            DiskFullError: The file system is full; the message names the file.
            Exception: Whatever ``write`` or the file system raised; the temporary file is
                removed first and the destination is left untouched.
        """
        if not self.writes_local_files:
            raise ConfigurationError(
                f"save_via_path needs the local file system, but this writer writes through "
                f"{type(self.fs).__name__}; call save() with a savefun taking a file object"
            )
        dest = self._destination(filename, out_dir)
        parent = os.path.dirname(dest)
        tmp = _temporary_path(dest)
        try:
            result = write(tmp)
            fd = os.open(tmp, os.O_RDWR | getattr(os, "O_BINARY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self.fs.rename(tmp, dest)
        except BaseException as exc:
            self._fail(exc, tmp, dest)
        self._sync_dir(parent)
        self._post_save()
        return result

    def _destination(self, filename: str, out_dir: str) -> str:
        """``out_dir/filename`` (the writer's own ``out_dir`` wins), its directories created."""
        out_dir = self.out_dir or os.fspath(out_dir)
        filename = os.fspath(filename)
        if not self._initialized:
            self.initialize(out_dir)
        if _before_write is not None:  # the run lock, once ppe_core.training is imported
            _before_write(out_dir)
        key = (out_dir, filename)
        dest = self._flat_destinations.get(key)
        if dest is not None:  # a log appended to per entry: no path arithmetic each time
            return dest
        dest = os.path.join(out_dir, filename)
        parent = os.path.dirname(dest)
        if parent and parent != out_dir:
            # Created at every save (not remembered), so a directory removed meanwhile is too.
            self.fs.makedirs(parent, exist_ok=True)
        else:
            if len(self._flat_destinations) >= _FLAT_DESTINATIONS:  # e.g. one name per entry
                self._flat_destinations.clear()
            self._flat_destinations[key] = dest
        return dest

    def _append_local(
        self, dest: str, target: Target, savefun: SaveFun, kwargs: Mapping[str, Any]
    ) -> None:
        """Appends to a local file through a handle kept open between appends (see
        :class:`_AppendFiles`); the bytes reach the OS before returning, as with a fresh open.

        The path is looked at (a ``stat``) only when the file is due for its ``fsync`` (at
        most every :attr:`append_sync_interval` seconds), not per append: an append within the
        interval is one ``write`` (``pwrite``) system call.
        """
        positional = getattr(savefun, "positional", False)
        synced_at = self._synced_at.get(dest)
        due = synced_at is None or time.monotonic() - synced_at >= self.append_sync_interval
        kept = self._append_files.files.get(dest)
        created = False
        if due or kept is None or kept.positional != positional:
            kept, created, replaced = self._append_files.open(dest, positional)
            if replaced:
                self.append_reopens += 1
        file_obj = kept.file
        try:
            if positional:  # it writes at offsets, from the size the writer keeps; returns it
                size = savefun(target, file_obj, size=kept.size, **kwargs)
                kept.size = size if isinstance(size, int) else None
            else:
                savefun(target, file_obj, **kwargs)
            if due or created:
                _sync_file(file_obj)
                self._synced_at[dest] = time.monotonic()
                self._unsynced.discard(dest)
            else:
                file_obj.flush()  # in the OS: a killed process loses nothing of it
                self._unsynced.add(dest)
        except Exception as exc:
            self._append_failed(exc, dest)
        if created:
            self._sync_dir(os.path.dirname(dest))

    def _append_failed(self, exc: Exception, dest: str) -> NoReturn:
        """Closes the handle kept for ``dest``, whose append failed with ``exc`` (the next
        append reopens and re-checks the file), and raises: :class:`DiskFullError` naming
        ``dest`` when the disk is full, ``exc`` itself otherwise."""
        self._append_files.close(dest)
        full = disk_full_error(exc, dest)
        if full is not None:
            raise full from exc
        raise exc

    def _append_remote(
        self, dest: str, target: Target, savefun: SaveFun, kwargs: Mapping[str, Any]
    ) -> None:
        """Appends through ``fs`` (not the local file system): opened, written, synced."""
        created = not self.fs.exists(dest)
        with self.fs.open(dest, "ab") as file_obj:
            savefun(target, file_obj, **kwargs)
            _sync_file(file_obj)
        if created:
            self._sync_dir(os.path.dirname(dest))

    def sync_appends(self) -> None:
        """``fsync`` the local files appended to since their last sync (:meth:`finalize` does;
        a background writer calls it after its worker's appends)."""
        # Saves of one writer run one at a time, and finalize() waits for them first.
        pending, self._unsynced = self._unsynced, set()
        now = time.monotonic()
        for dest in sorted(pending):
            self._synced_at[dest] = now
            kept = self._append_files.files.get(dest)
            if kept is not None:  # the file appended to, even if replaced or removed since
                with contextlib.suppress(OSError, ValueError):
                    os.fsync(kept.file.fileno())
                continue
            try:
                fd = os.open(dest, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except OSError:  # replaced or removed since: nothing of ours left to sync
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._append_files.close_all()  # the end of the appends: their handles go

    def _replace(
        self, dest: str, target: Target, savefun: SaveFun, kwargs: Mapping[str, Any]
    ) -> None:
        parent = os.path.dirname(dest)
        tmp = _temporary_path(dest)
        try:
            with self.fs.open(tmp, "xb" if isinstance(self.fs, _LocalFileSystem) else "wb") as f:
                savefun(target, f, **kwargs)
                _sync_file(f)
            self.fs.rename(tmp, dest)
        except BaseException as exc:
            self._fail(exc, tmp, dest)
        self._append_files.close(dest)  # a handle kept for appends names the old file
        self._unsynced.discard(dest)  # appends to the replaced file no longer matter
        self._synced_at[dest] = time.monotonic()
        self._sync_dir(parent)

    def _fail(self, exc: BaseException, tmp: str, dest: str) -> NoReturn:
        """Removes the temporary file of a failed save and raises: :class:`DiskFullError`
        naming ``dest`` when the disk is full, ``exc`` itself otherwise."""
        full = disk_full_error(exc, dest) if self.writes_local_files else None
        self._discard(tmp)
        if full is not None:
            raise full from exc
        raise exc

    def _discard(self, tmp: str) -> None:
        """Removes the temporary file of a failed save, if any, without masking the failure."""
        try:
            if self.fs.exists(tmp):
                self.fs.remove(tmp)
        except OSError:
            pass  # the original error matters more than a leftover temporary file

    def _sync_dir(self, dir_path: str) -> None:
        fsync_dir = getattr(self.fs, "fsync_dir", None)
        if fsync_dir is not None:
            fsync_dir(dir_path)

    def _add_cleanup_hook(self, hook_fun: Callable[[], object]) -> None:
        """Registers ``hook_fun()`` to run after every successful save (e.g. old-file cleanup).

        Args:
            hook_fun: Callable without arguments; it runs where the save ran.
        """
        self._post_save_hooks.append(hook_fun)

    def _post_save(self) -> None:
        for hook in self._post_save_hooks:
            hook()


def _no_chunk(target: Target, size: int | None) -> None:
    """The ``append_chunk`` of an :class:`Appender` that writes nothing itself."""
    return None


class Appender:
    """Appends to one file through a writer: the per-entry path of a log written every step.

    Made by :meth:`Writer.appender`. ``appender(target)`` does what ``writer(filename,
    out_dir, target, savefun=savefun, append=True)`` does. Through the writer an append is a
    dozen Python calls and as many attribute and dictionary lookups (destination, kept handle,
    sync clock, flushes, hooks): run cold between training steps, several times the one system
    call it needs. So where the writer saves in the calling thread on the local file system
    (``direct``: :class:`~ppe_core.writing.SimpleWriter`) and ``savefun`` can tell the bytes
    of an append (``savefun.append_chunk(target, size)``: ``(offset, data)``, ``offset``
    None for the end of the file, or None to decline), the appender binds the destination,
    the handle the writer keeps open for it and when the file is next due for its ``fsync``,
    and an append is those bytes and one ``write`` (``pwrite`` at ``offset``). With the same
    guarantees as the writer's: the bytes reach the OS before the call returns, the file is
    left for :meth:`Writer.finalize` to sync, a failed write closes the handle (a full disk
    raises :class:`DiskFullError` naming the file), post-save hooks run.

    Anything else goes through the writer, which syncs the file, checks its path (a file
    replaced or removed is reopened, see :attr:`Writer.append_reopens`) and rebinds: the sync
    falling due (once per :attr:`Writer.append_sync_interval`; the interval is read at each
    sync), a handle the writer closed or replaced meanwhile (its finalize, a rewrite of the
    file, the handle of another file displacing it, a fork), a target ``append_chunk``
    declines, and every append of other writers (background, remote or custom ones).
    """

    __slots__ = (
        "_chunk",
        "_deadline",
        "_dest",
        "_fd",
        "_files",
        "_hooks",
        "_kept",
        "_reopens",
        "filename",
        "out_dir",
        "savefun",
        "writer",
    )

    def __init__(
        self, writer: Writer, filename: str, out_dir: str, savefun: SaveFun, *, direct: bool
    ) -> None:
        self.writer = writer
        self.filename = filename
        self.out_dir = out_dir
        self.savefun = savefun
        self._reopens = writer.append_reopens
        chunk: Callable[[Target, int | None], tuple[int | None, bytes] | None] | None = None
        if direct and writer.writes_local_files:
            chunk = getattr(savefun, "append_chunk", None)
        if getattr(savefun, "positional", False) and not hasattr(os, "pwrite"):
            chunk = None  # Windows: the savefun positions the handle and writes itself
        self._chunk = _no_chunk if chunk is None else chunk
        self._kept: _Kept | None = None  # None: the next append goes through the writer
        self._fd = -1
        self._deadline = 0.0
        self._files: dict[str, _Kept] = {}
        self._hooks: list[Callable[[], object]] = []
        self._dest = ""
        if chunk is not None:
            self._dest = writer._destination(filename, out_dir)
            self._files = writer._append_files.files
            self._hooks = writer._post_save_hooks

    def __call__(self, target: Target) -> bool:
        """Appends ``target``.

        Returns:
            False once the writer found the file replaced or removed under it (at this append
            or an earlier one; :attr:`Writer.append_reopens` grew since the appender was made):
            the appends since went elsewhere, so the caller writes the file whole again (and
            makes a new appender). True otherwise.
        """
        kept = self._kept
        if kept is not None and self._files.get(self._dest) is kept:
            chunk = self._chunk(target, kept.size) if time.monotonic() < self._deadline else None
            if chunk is not None:
                offset, data = chunk
                fd = self._fd
                try:
                    if offset is None:  # the handle appends (O_APPEND): to the end
                        done = os.write(fd, data)
                        while done < len(data):  # a short write (a signal, the disk's last block)
                            done += os.write(fd, data[done:])
                    else:
                        done = os.pwrite(fd, data, offset)
                        while done < len(data):
                            done += os.pwrite(fd, data[done:], offset + done)
                        kept.size = offset + done
                except Exception as exc:
                    self._kept = None
                    self.writer._append_failed(exc, self._dest)
                self.writer._unsynced.add(self._dest)
                if self._hooks:
                    self.writer._post_save()
                return True
        writer = self.writer
        writer(self.filename, self.out_dir, target, savefun=self.savefun, append=True)
        if self._chunk is not _no_chunk:
            self._bind()
        return writer.append_reopens == self._reopens

    def _bind(self) -> None:
        """Binds the handle the writer now keeps for the file, and its next ``fsync`` time."""
        writer = self.writer
        kept = self._files.get(self._dest)
        synced_at = writer._synced_at.get(self._dest)
        if kept is None or synced_at is None:
            self._kept = None
            return
        self._kept = kept
        self._fd = kept.file.fileno()
        self._deadline = synced_at + writer.append_sync_interval
