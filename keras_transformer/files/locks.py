"""One writer per folder, and readers that keep a deleting writer away: advisory `flock` locks.

A process that writes into a training workdir, or an export folder, holds its lock (`exclusive_lock`) for as
long as it writes: a second writer is refused at once, and the lock goes with the process that holds it, however
it ends. Readers that must not lose files a writer deletes hold `shared_lock` on a file that the writer takes
with `exclusive_unless_shared` before deleting. Where the platform has no `flock` (Windows), no lock is taken.
"""

import contextlib
import errno
import json
import os
import pathlib
import socket
import tempfile  # noqa: F401 (the examples of the docstrings use it)
import time
from collections.abc import Iterator
from typing import Any

from keras_transformer.errors import WorkdirBusyError

try:
    import fcntl  # POSIX: the writer lock's flock
except ImportError:  # Windows: no lock is taken
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".keras_transformer.lock"  # in a locked folder; never deleted (deleting a lock file races)


# ------------------------------------------------------------------ one writer per folder
# Real path of a lock file -> [file descriptor, depth] (the lock is re-entrant in a process).
_HELD: dict[str, list[int]] = {}


def lock_file(folder: str | os.PathLike[str], beside: bool = False) -> pathlib.Path:
    """The lock file of `folder`: `folder/.keras_transformer.lock` (a workdir, which stays in place), or with
    `beside` the hidden `.NAME.lock` beside it (an export, which is replaced as a whole).

    >>> lock_file("runs/a").name, lock_file("saved_models/en_de", beside=True).name
    ('.keras_transformer.lock', '.en_de.lock')
    """
    folder = pathlib.Path(folder)
    return folder.with_name(f".{folder.name}.lock") if beside else folder / LOCK_FILE


def lock_holder(folder: str | os.PathLike[str], beside: bool = False) -> dict[str, Any]:
    """What the lock file of `folder` says of the process that last took it (a dict; empty without one)."""
    try:
        return json.loads(lock_file(folder, beside).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _busy(folder: str | os.PathLike[str], beside: bool = False) -> WorkdirBusyError:
    holder = lock_holder(folder, beside)
    who = (f"process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
           f"({holder.get('command', '?')}, started {holder.get('started', '?')})") if holder else "another process"
    what = "an export folder" if beside else "a workdir"
    return WorkdirBusyError(
        f"{folder} is in use by {who}: one command writes to {what} at a time. Wait for it to finish, or stop "
        f"it; the lock goes with the process, so the same command can then be run again.")


def check_unlocked(folder: str | os.PathLike[str], beside: bool = False) -> None:
    """Raises `WorkdirBusyError` (as `exclusive_lock` would) when another process holds `folder`'s lock; creates
    nothing. For a command that checks before its slow start (the lock itself is taken later)."""
    path = lock_file(folder, beside)
    if fcntl is None or os.path.realpath(path) in _HELD or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # its holder just finished and removed it
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise _busy(folder, beside) from None
    finally:
        os.close(fd)


def _take(path: pathlib.Path, folder: pathlib.Path, beside: bool) -> int:
    """An open descriptor of the lock file `path`, locked; raises `WorkdirBusyError` when another process holds
    it. A lock file that its last holder removed while this process opened it is opened again (`beside` lock
    files are removed by their holder at release, so the one locked must still be the one at `path`)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise _busy(folder, beside) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(folder: str | os.PathLike[str], command: str, beside: bool = False) -> Iterator[pathlib.Path]:
    """Holds `folder`'s writer lock for the `with` block; another process that asks for it meanwhile fails.

    The lock is an advisory `flock` on `folder/.keras_transformer.lock` (a
    workdir), or with `beside` on `.NAME.lock` beside the folder (an export,
    which is replaced as a whole: the lock cannot live inside it; its holder
    removes that file at release). The file records the host, process id,
    command and start time of its holder. The operating system releases the
    lock when the process ends, however it ends (kill -9 included), so a
    command run again after a crash is never blocked. Nested calls in one
    process for the same folder are allowed. Where the platform has no `flock`
    (Windows), no lock is taken.

    Args:
        folder: the folder (created if needed, unless `beside`: then its parent is).
        command: what holds it, for the message a second writer gets (e.g. "train").
        beside: lock a folder that is replaced as a whole (see above).

    Raises:
        WorkdirBusyError: another process holds the lock; the message names its host, process and command.

    Example:

    >>> folder = tempfile.mkdtemp()
    >>> with exclusive_lock(folder, "train"):
    ...     lock_holder(folder)["command"], lock_holder(folder)["pid"] == os.getpid()
    ('train', True)
    """
    folder = pathlib.Path(folder)
    (folder.parent if beside else folder).mkdir(parents=True, exist_ok=True)
    path = lock_file(folder, beside)
    key = os.path.realpath(path)
    if fcntl is None or key in _HELD:
        if key in _HELD:
            _HELD[key][1] += 1
        try:
            yield folder
        finally:
            if key in _HELD:
                _HELD[key][1] -= 1
        return
    fd = _take(path, folder, beside)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "command": command,
              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
    _HELD[key] = [fd, 1]
    try:
        yield folder
    finally:
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            del _HELD[key]
            if beside:  # removed while held: whoever opened it meanwhile finds it gone and opens a new one
                with contextlib.suppress(OSError):
                    os.unlink(path)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


# ------------------------------------------------------------------ readers and a writer that deletes
def _open_for_lock(path: str | os.PathLike[str]) -> int | None:
    """A descriptor of the lock file `path`, created where it can be; None where it cannot be opened or there
    is no `flock`."""
    if fcntl is None:
        return None
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        try:
            return os.open(path, os.O_RDONLY)  # a folder this account may read but not write
        except OSError:
            return None


@contextlib.contextmanager
def shared_lock(path: str | os.PathLike[str]) -> Iterator[bool]:
    """Holds a shared `flock` on the file `path` for the `with` block: any number of readers hold it together,
    and `exclusive_unless_shared` on the same file fails meanwhile. Yields whether a lock is held: False where
    the file cannot be opened or created (a read-only folder without one) or the platform has no `flock`.

    Example:

    >>> path = pathlib.Path(tempfile.mkdtemp()) / ".readers.lock"
    >>> with shared_lock(path) as held, exclusive_unless_shared(path) as free:
    ...     held, free
    (True, False)
    """
    fd = _open_for_lock(path)
    if fd is None:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while `exclusive_unless_shared` holds it: an instant
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def exclusive_unless_shared(path: str | os.PathLike[str]) -> Iterator[bool]:
    """Holds an exclusive `flock` on the file `path` for the `with` block if no one holds `shared_lock` on it,
    without waiting. Yields whether it is held (True where the platform has no `flock`).

    Example:

    >>> path = pathlib.Path(tempfile.mkdtemp()) / ".readers.lock"
    >>> with exclusive_unless_shared(path) as free:
    ...     free
    True
    """
    if fcntl is None:
        yield True
        return
    fd = _open_for_lock(path)
    if fd is None:
        yield True  # nobody can have taken a shared lock on a file that cannot be opened
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
