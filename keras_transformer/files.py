"""Small file helpers shared by every layer. Standard library only.

Every file the package writes for later reading (checkpoints, configs,
history, arrays, translations) is written under a temporary name of its own
process in the same folder, flushed to disk, and renamed into place, so that a
process killed at any moment (or a full disk) leaves either the old file or
the new one, never half of one. Folders (exports, vocabularies) are built
under a temporary name and swapped in the same way.

A process that writes into a training workdir holds its lock
(`exclusive_lock`) for as long as it writes: a second writer is refused at
once, and the lock goes with the process that holds it, however it ends.
"""

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import re
import secrets
import shutil
import socket
import tempfile
import time

from keras_transformer.errors import WorkdirBusyError

try:
    import fcntl  # POSIX: the writer lock's flock
except ImportError:  # Windows: no lock is taken
    fcntl = None

LOCK_FILE = ".keras_transformer.lock"  # in a locked folder; never deleted (deleting a lock file races)

# `.NAME.tmp-PID...`: this module's temporaries; also the fixed names earlier versions used (`.NAME.tmp...`,
# `history.csv.tmp`).
_TEMPORARY = re.compile(r"^\.[^/]*?\.tmp(?:-(?P<pid>\d+)[^./]*)?(?:\..*)?$|^history\.csv\.tmp$")


def temporary_path(path):
    """A hidden name beside `path`, unique to this process, that keeps its suffixes (writers such as h5py and
    numpy check them).

    Example:

    >>> name = temporary_path("run/checkpoints/ckpt-0003.weights.h5").name
    >>> name == f".ckpt-0003.tmp-{os.getpid()}.weights.h5", is_temporary(name)
    (True, True)
    """
    path = pathlib.Path(path)
    stem = path.name.split(".")[0]
    return path.with_name(f".{stem}.tmp-{os.getpid()}{''.join(path.suffixes)}")


def is_temporary(name):
    """Whether a file name is one of the package's temporaries (see `temporary_path`).

    >>> is_temporary(".vocab.tmp"), is_temporary("history.csv.tmp"), is_temporary("ckpt-0001.weights.h5")
    (True, True, False)
    """
    return bool(_TEMPORARY.match(name))


def fsync_file(path):
    """Flushes a written file's data to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_folder(path):
    """Flushes a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_temporary(path, write):
    """Calls `write(temporary)` with a path beside `path` (see `temporary_path`) and flushes it to disk.

    The caller renames it into place (`os.replace`) when it is ready; a failing
    `write` removes the temporary. An `OSError` that names no file (a full disk
    reported by a write) is raised again naming `path`.

    Returns:
        The temporary path, as a `pathlib.Path`.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    try:
        write(str(temporary))
        fsync_file(temporary)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, OSError) and error.errno is not None and not error.filename:
            raise OSError(error.errno, error.strerror or os.strerror(error.errno), str(path)) from error
        raise
    return temporary


def atomic_write(path, write):
    """Calls `write(temporary)` with a path beside `path`, flushes it to disk, then renames it to `path`.

    A failing `write` leaves `path` as it was and removes the temporary.

    Args:
        path: the file to write; its folder is created.
        write: a function that writes a file at the path it is given.

    Returns:
        `path`, as a `pathlib.Path`.

    Example:

    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out" / "note.txt"
    >>> _ = atomic_write(target, lambda p: pathlib.Path(p).write_text("done"))
    >>> target.read_text(), sorted(p.name for p in target.parent.iterdir())
    ('done', ['note.txt'])
    """
    path = pathlib.Path(path)
    temporary = write_temporary(path, write)
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    fsync_folder(path.parent)
    return path


def atomic_write_text(path, text):
    """Writes `text` (UTF-8) to `path` atomically (see `atomic_write`).

    Example:

    >>> atomic_write_text(pathlib.Path(tempfile.mkdtemp()) / "a.txt", "x").read_text()
    'x'
    """
    return atomic_write(path, lambda temporary: pathlib.Path(temporary).write_text(text, encoding="utf-8"))


def atomic_copy(source, path):
    """Copies `source` to `path` atomically: a hard link where the file system has them, else a copy.

    Example:

    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a").write_text("x")
    >>> atomic_copy(folder / "a", folder / "b").read_text()
    'x'
    """
    def copy(temporary):
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)
    return atomic_write(path, copy)


def file_digest(path):
    """The BLAKE2b digest (hex) of a file's bytes: what a backup's metadata records of its weights file.

    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a"
    >>> _ = path.write_bytes(b"abc")
    >>> file_digest(path)[:16]
    'ba80a53f981c4d0d'
    """
    digest = hashlib.blake2b()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def remove_stale_temporaries(folder):
    """Removes the temporaries (files and folders, see `is_temporary`) that other processes left in `folder`,
    not recursively. Call it while holding the folder's `exclusive_lock`: no other writer is then alive.

    Temporaries named after a process that is still alive on this machine are
    kept (the lock covers one folder's writer; the workers of a multi-worker
    run write their data files beside the chief's).

    Returns:
        The paths removed.

    Example:

    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / ".ckpt-0002.tmp-99999999.weights.h5").write_bytes(b"torn")
    >>> _ = (folder / "ckpt-0001.weights.h5").write_bytes(b"kept")
    >>> [p.name for p in remove_stale_temporaries(folder)], [p.name for p in folder.iterdir()]
    (['.ckpt-0002.tmp-99999999.weights.h5'], ['ckpt-0001.weights.h5'])
    """
    folder = pathlib.Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for entry in sorted(folder.iterdir()):
        match = _TEMPORARY.match(entry.name)
        if not match or (match.group("pid") and _alive(int(match.group("pid")))):
            continue  # not a temporary, or one a live process is writing (this one, a worker of a cluster)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


def _alive(pid):
    """Whether a process `pid` runs on this machine."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


def same_file(first, second):
    """Whether two paths name one file (links and relative paths resolved; a missing file by its path).

    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> same_file(folder / "a.txt", folder / "x" / ".." / "a.txt"), same_file(folder / "a", folder / "b")
    (True, False)
    """
    first, second = pathlib.Path(first), pathlib.Path(second)
    if first.exists() and second.exists():
        return os.path.samefile(first, second)
    return first.resolve() == second.resolve()


def is_inside(path, folder):
    """Whether `path` lies in `folder` or below it (both resolved).

    >>> is_inside("/runs/a/checkpoints/x.h5", "/runs/a"), is_inside("/runs/ab", "/runs/a")
    (True, False)
    """
    path, folder = pathlib.Path(path).resolve(), pathlib.Path(folder).resolve()
    return path == folder or folder in path.parents


def check_not_an_input(output, inputs, option="--output"):
    """Refuses an output path that is one of a command's input files.

    Raises:
        ValueError: `output` is the same file as one of `inputs` (named).

    >>> check_not_an_input("a.txt", ["b.txt", "a.txt"])
    Traceback (most recent call last):
    ...
    ValueError: --output a.txt is one of this command's input files (a.txt): writing it would destroy that input. Choose another file.
    """
    for source in inputs:
        if isinstance(source, (str, os.PathLike)) and same_file(output, source):
            raise ValueError(f"{option} {output} is one of this command's input files ({source}): writing it "
                             f"would destroy that input. Choose another file.")


def check_output_file(output, what="the translations"):
    """Refuses an output file that could not be written, before the work whose result it would hold.

    Raises:
        IsADirectoryError, FileNotFoundError, PermissionError: naming the path.
    """
    path = pathlib.Path(output)
    folder = path.parent
    if path.is_dir():
        raise IsADirectoryError(f"Cannot write {what} to {path}: it is a directory.")
    if not folder.is_dir():
        raise FileNotFoundError(f"Cannot write {what} to {path}: the folder {folder} does not exist.")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise PermissionError(f"Cannot write {what} to {path}: permission denied.")


def staging_folder(path):
    """A new, empty hidden folder beside `path` (same file system, so it can be renamed to `path`), with the
    permissions of any new folder (another account, a server's, can read what is built in it).

    >>> staging = staging_folder(pathlib.Path(tempfile.mkdtemp()) / "export")
    >>> staging.name.startswith(f".export.tmp-{os.getpid()}"), is_temporary(staging.name)
    (True, True)
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # made as `mkdir` makes folders (the umask's permissions), not private as `mkdtemp` does
        staging = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            staging.mkdir()
            return staging
        except FileExistsError:
            continue


def replace_folder(staging, path):
    """Puts the finished folder `staging` at `path`, by renames only; an old `path` is deleted after that.

    Until the first rename `path` is untouched; between the two renames (an instant) the old folder lies at
    `.NAME.tmp-PID-old` beside it, which the next writer's `remove_stale_temporaries` deletes.

    Example:

    >>> parent = pathlib.Path(tempfile.mkdtemp())
    >>> (parent / "out").mkdir(); _ = (parent / "out" / "v").write_text("old")
    >>> staging = staging_folder(parent / "out"); _ = (staging / "v").write_text("new")
    >>> _ = replace_folder(staging, parent / "out")
    >>> (parent / "out" / "v").read_text(), sorted(p.name for p in parent.iterdir())
    ('new', ['out'])
    """
    staging, path = pathlib.Path(staging), pathlib.Path(path)
    old = None
    if path.exists() or path.is_symlink():
        old = path.with_name(f".{path.name}.tmp-{os.getpid()}-old")
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        os.replace(path, old)
    os.replace(staging, path)
    fsync_folder(path.parent)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    return path


# ------------------------------------------------------------------ one writer per folder
_HELD = {}  # real path of a locked folder -> [file descriptor, depth] (the lock is re-entrant in a process)


def lock_holder(folder):
    """What the lock file of `folder` says of the process that last took it (a dict; empty without one)."""
    try:
        return json.loads((pathlib.Path(folder) / LOCK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _busy(folder):
    holder = lock_holder(folder)
    who = (f"process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
           f"({holder.get('command', '?')}, started {holder.get('started', '?')})") if holder else "another process"
    return WorkdirBusyError(
        f"{folder} is in use by {who}: one command writes to a workdir at a time. Wait for it to finish, or stop "
        f"it; the lock goes with the process, so the same command can then be run again.")


def check_unlocked(folder):
    """Raises `WorkdirBusyError` (as `exclusive_lock` would) when another process holds `folder`'s lock; creates
    nothing. For a command that checks before its slow start (the lock itself is taken later)."""
    path = pathlib.Path(folder) / LOCK_FILE
    if fcntl is None or os.path.realpath(folder) in _HELD or not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise _busy(folder) from None
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(folder, command):
    """Holds `folder`'s writer lock for the `with` block; another process that asks for it meanwhile fails.

    The lock is an advisory `flock` on `folder/.keras_transformer.lock`,
    which records the host, process id, command and start time of its holder.
    The operating system releases it when the process ends, however it ends
    (kill -9 included), so a command run again after a crash is never blocked.
    Nested calls in one process for the same folder are allowed. Where the
    platform has no `flock` (Windows), no lock is taken.

    Args:
        folder: the folder (created if needed).
        command: what holds it, for the message a second writer gets (e.g. "train").

    Raises:
        WorkdirBusyError: another process holds the lock; the message names its host, process and command.

    Example:

    >>> folder = tempfile.mkdtemp()
    >>> with exclusive_lock(folder, "train"):
    ...     lock_holder(folder)["command"], lock_holder(folder)["pid"] == os.getpid()
    ('train', True)
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(folder)
    if fcntl is None or key in _HELD:
        if key in _HELD:
            _HELD[key][1] += 1
        try:
            yield folder
        finally:
            if key in _HELD:
                _HELD[key][1] -= 1
        return
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise _busy(folder) from None
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
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
