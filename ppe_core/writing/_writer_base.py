"""The ``Writer`` base class: the one place where ppe-core writes files, crash-safely."""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401 - its exit handler must be registered before ours
import os
import secrets
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol, TypeAlias, TypeVar

from ppe_core.errors import ConfigurationError, PPEError

__all__ = [
    "FileSystem",
    "SaveFun",
    "Target",
    "Writer",
    "WriterError",
    "WriterFinalizedError",
]

#: ``savefun(target, file_object, **kwargs)`` serializes ``target`` into an open binary file,
#: like ``torch.save``.
SaveFun: TypeAlias = Callable[..., object]

#: What writers save: a state dictionary, a log (list of dicts) or any object ``savefun`` takes.
Target: TypeAlias = Mapping[str, Any] | Sequence[Any] | Any


_T = TypeVar("_T")


class WriterError(PPEError, RuntimeError):
    """Saving a file failed in a writer's background thread or process."""


class WriterFinalizedError(PPEError, RuntimeError):
    """A writer was asked to save after :meth:`Writer.finalize` shut it down."""


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


def _temporary_path(dest: str) -> str:
    """A fresh temporary name beside ``dest``, hidden, renamed onto ``dest`` when complete."""
    parent, base = os.path.split(dest)
    # Same directory as the destination, so the final rename never crosses file systems.
    # The random part keeps concurrent writers (threads, processes, ranks) apart.
    return os.path.join(parent, f".{base}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


class Writer:
    """Base class of writers: saves objects into files under an output directory.

    Extensions (snapshots, logs) call a writer instead of opening files themselves. Every save
    is crash-safe: the object is written to a temporary file next to the destination, flushed,
    ``fsync``-ed and then renamed onto the final name (and the directory is synced), so a kill
    at any moment leaves either the previous file or the new one under the final name, never a
    partial one. With ``append=True`` the bytes are appended to the existing file instead,
    which never loses what the file already held (at worst the last record is partial).

    Subclasses decide where the save runs (this thread, another thread, another process) by
    overriding :meth:`__call__`; all of them end up in :meth:`save`.

    Args:
        fs: File system to write through; the local file system by default. An object with
            PFIO's interface (``open``, ``makedirs``, ``exists``, ``rename``, ``remove``) works.
        out_dir: Directory this writer writes into. When set (non-empty) it takes precedence
            over the ``out_dir`` passed to :meth:`__call__`.
    """

    def __init__(self, fs: FileSystem | None = None, out_dir: str | None = None) -> None:
        self.fs: FileSystem = _LocalFileSystem() if fs is None else fs
        self.out_dir = out_dir
        self._post_save_hooks: list[Callable[[], object]] = []
        self._initialized = False

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

        Args:
            out_dir: The directory to create (the writer's own ``out_dir`` wins when set).
        """
        directory = self.out_dir or out_dir
        if directory:  # "" means the current directory, which exists
            self.fs.makedirs(directory, exist_ok=True)
        self._initialized = True

    def finalize(self) -> None:
        """Waits for pending saves and releases resources; later calls do nothing.

        Raises:
            WriterError: A background save failed.
        """

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
            Exception: Whatever ``savefun`` or the file system raised; the temporary file is
                removed first and the destination is left untouched.
        """
        dest = self._destination(filename, out_dir)
        if append:
            self._append(dest, target, savefun, savefun_kwargs)
        else:
            self._replace(dest, target, savefun, savefun_kwargs)
        self._post_save()

    @property
    def writes_local_files(self) -> bool:
        """Whether this writer writes to the local file system (so :meth:`save_via_path` works)."""
        return isinstance(self.fs, _LocalFileSystem)

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
        except BaseException:
            self._discard(tmp)
            raise
        self._sync_dir(parent)
        self._post_save()
        return result

    def _destination(self, filename: str, out_dir: str) -> str:
        """``out_dir/filename`` (the writer's own ``out_dir`` wins), its directories created."""
        if self.out_dir:
            out_dir = self.out_dir
        if not self._initialized:
            self.initialize(out_dir)
        dest = os.path.join(out_dir, filename)
        parent = os.path.dirname(dest)
        if parent and parent != out_dir:
            self.fs.makedirs(parent, exist_ok=True)
        return dest

    def _append(
        self, dest: str, target: Target, savefun: SaveFun, kwargs: Mapping[str, Any]
    ) -> None:
        created = not self.fs.exists(dest)
        with self.fs.open(dest, "ab") as file_obj:
            savefun(target, file_obj, **kwargs)
            _sync_file(file_obj)
        if created:
            self._sync_dir(os.path.dirname(dest))

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
        except BaseException:
            self._discard(tmp)
            raise
        self._sync_dir(parent)

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


# Background writers finalized at interpreter exit, so pending saves complete even when the
# user never called finalize(). atexit runs before multiprocessing reaps its children.
_LIVE_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def _register_for_exit(writer: Writer) -> None:
    with _LIVE_LOCK:
        _LIVE_WRITERS.add(writer)


def _finalize_live_writers() -> None:
    with _LIVE_LOCK:
        writers = list(_LIVE_WRITERS)
    for writer in writers:
        try:
            writer.finalize()
        except Exception as exc:  # at exit there is nobody left to raise to
            print(f"ppe_core: {type(writer).__name__} failed at exit: {exc}", file=sys.stderr)


# Registered after multiprocessing's own handler, so (handlers run last-in first-out) queue
# consumers are told to stop before multiprocessing joins its child processes.
atexit.register(_finalize_live_writers)
