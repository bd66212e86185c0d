"""Small file helpers shared by every layer. Standard library only.

Every file the package writes for later reading (checkpoints, configs,
history, arrays, translations) is written under a temporary name of its own
process in the same folder, flushed to disk, and renamed into place, so that a
process killed at any moment (or a full disk) leaves either the old file or
the new one, never half of one. Folders (exports, vocabularies) are built
under a temporary name and swapped in the same way (`replace_folder`: one
atomic exchange where the OS has one).

A process that writes into a training workdir, or an export folder, holds its
lock (`exclusive_lock`) for as long as it writes: a second writer is refused at
once, and the lock goes with the process that holds it, however it ends.
Readers that must not lose files a writer deletes hold `shared_lock` on a file
that the writer takes with `exclusive_unless_shared` before deleting.
"""

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import pathlib
import platform
import re
import secrets
import shutil
import socket
import sys
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


def file_digest(path, algorithm="blake2b"):
    """The digest (hex) of a file's bytes, read a MiB at a time: BLAKE2b is what a backup's metadata records of
    its weights file, SHA-256 what an export's manifest records of each file.

    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a"
    >>> _ = path.write_bytes(b"abc")
    >>> file_digest(path)[:16], file_digest(path, "sha256")[:16]
    ('ba80a53f981c4d0d', 'ba7816bf8f01cfea')
    """
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def remove_entry(entry):
    """Removes a file, link or folder (with what it holds), as far as it can: what cannot go is left.

    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> (folder / "sub").mkdir(); _ = (folder / "sub" / "a").write_text("x")
    >>> remove_entry(folder / "sub"); remove_entry(folder / "gone"); list(folder.iterdir())
    []
    """
    entry = pathlib.Path(entry)
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            entry.unlink()


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
        remove_entry(entry)
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


# Linux's renameat2(2) flag that swaps two paths in one step (kernel 3.15+, on most local file systems).
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_RENAMEAT2_SYSCALL = {"x86_64": 316, "amd64": 316, "aarch64": 276, "arm64": 276, "riscv64": 276, "ppc64le": 357,
                      "s390x": 347}


def _renameat2():
    """libc's `renameat2`, or a call of its system call number, or None (not Linux, or an unknown machine)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    function = getattr(libc, "renameat2", None)  # glibc 2.28+, musl 1.2.2+
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        return function
    number = _RENAMEAT2_SYSCALL.get(platform.machine().lower())
    if number is None or not hasattr(libc, "syscall"):
        return None
    return lambda *args: libc.syscall(ctypes.c_long(number), *(  # variadic: integers passed as longs
        ctypes.c_long(arg) if isinstance(arg, int) else arg for arg in args))


def exchange_paths(first, second):
    """Swaps two existing paths (folders) in one atomic step: Linux's `renameat2(RENAME_EXCHANGE)`.

    Raises:
        OSError: the platform or the file system has no atomic exchange (`errno.ENOSYS`, `EINVAL`, ...), or the
            exchange failed; the two paths are then as they were.

    Example:

    >>> parent = pathlib.Path(tempfile.mkdtemp())
    >>> (parent / "a").mkdir(); (parent / "b").mkdir(); _ = (parent / "a" / "x").write_text("a")
    >>> try:
    ...     exchange_paths(parent / "a", parent / "b")
    ... except OSError:  # no atomic exchange here: swap by hand for the example
    ...     _ = os.replace(parent / "a", parent / "b")
    >>> sorted(p.name for p in (parent / "b").iterdir())
    ['x']
    """
    function = _renameat2()
    if function is None:
        raise OSError(errno.ENOSYS, "no atomic exchange of paths on this platform", os.fspath(first))
    result = function(_AT_FDCWD, os.fsencode(os.fspath(first)), _AT_FDCWD, os.fsencode(os.fspath(second)),
                      _RENAME_EXCHANGE)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), os.fspath(first), None, os.fspath(second))


def replace_folder(staging, path):
    """Puts the finished folder `staging` at `path` so that `path` holds a whole folder at every instant, then
    deletes the old one.

    Where the operating system can swap two paths atomically (Linux, `exchange_paths`), the new folder and the
    old one trade places in one step and the old one, now at the staging name, is deleted. Elsewhere (another
    OS, a file system without the exchange) the old folder is first renamed to `.NAME.tmp-PID-old` and the new
    one renamed to `path`: a kill between those two renames leaves no folder at `path` for an instant's worth
    of bad luck, and `recover_replaced_folder` (run by the next export and by every loader) renames the old one
    back. A folder left at a staging name by a kill is deleted by the next writer (`remove_stale_staging`).

    Example:

    >>> parent = pathlib.Path(tempfile.mkdtemp())
    >>> (parent / "out").mkdir(); _ = (parent / "out" / "v").write_text("old")
    >>> staging = staging_folder(parent / "out"); _ = (staging / "v").write_text("new")
    >>> _ = replace_folder(staging, parent / "out")
    >>> (parent / "out" / "v").read_text(), sorted(p.name for p in parent.iterdir())
    ('new', ['out'])
    """
    staging, path = pathlib.Path(staging), pathlib.Path(path)
    if not (path.exists() or path.is_symlink()):
        os.replace(staging, path)
        fsync_folder(path.parent)
        return path
    try:
        exchange_paths(staging, path)
        old = staging  # the old folder now lies at the staging name
    except OSError as error:
        if error.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EXDEV):
            raise
        old = _old_name(path)
        if old.exists():
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        os.replace(path, old)
        os.replace(staging, path)
    fsync_folder(path.parent)
    shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    return path


def _old_name(path):
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-old")


def _staging_names(path):
    """The staging folders (and old folders) beside `path` that a writer of `path` made, newest first."""
    path = pathlib.Path(path)
    prefix = f".{path.name}.tmp-"
    if not path.parent.is_dir():
        return []
    found = [entry for entry in path.parent.iterdir() if entry.name.startswith(prefix)
             and re.fullmatch(r"\d+-[^/]+", entry.name[len(prefix):])]
    return sorted(found, key=lambda entry: entry.lstat().st_mtime, reverse=True)


def recover_replaced_folder(path):
    """Renames an old folder back to `path` when a writer was killed between the two renames of
    `replace_folder`'s fallback (`path` missing, `.NAME.tmp-PID-old` beside it). Call it while holding `path`'s
    lock (`exclusive_lock(path, ..., beside=True)`).

    Returns:
        The folder renamed back, or None.

    Example:

    >>> parent = pathlib.Path(tempfile.mkdtemp())
    >>> (parent / ".out.tmp-99999999-old").mkdir()
    >>> recover_replaced_folder(parent / "out").name, sorted(p.name for p in parent.iterdir())
    ('.out.tmp-99999999-old', ['out'])
    """
    path = pathlib.Path(path)
    if path.exists() or path.is_symlink():
        return None
    for entry in _staging_names(path):
        if entry.name.endswith("-old") and entry.is_dir():
            os.replace(entry, path)
            fsync_folder(path.parent)
            return entry
    return None


def remove_stale_staging(path):
    """Removes the staging and old folders (`.NAME.tmp-PID-...`) that earlier writers of `path` left beside it,
    this process's own excepted. Call it while holding `path`'s lock (`exclusive_lock(path, ..., beside=True)`):
    no other writer of `path` is then alive, whatever the process ids say (one may have been reused).

    Returns:
        The paths removed.

    Example:

    >>> parent = pathlib.Path(tempfile.mkdtemp())
    >>> (parent / ".out.tmp-99999999-1a2b3c4d").mkdir(); (parent / ".other.tmp-99999999-5e6f").mkdir()
    >>> [p.name for p in remove_stale_staging(parent / "out")], sorted(p.name for p in parent.iterdir())
    (['.out.tmp-99999999-1a2b3c4d'], ['.other.tmp-99999999-5e6f'])
    """
    removed = []
    mine = f".{pathlib.Path(path).name}.tmp-{os.getpid()}-"
    for entry in _staging_names(path):
        if entry.name.startswith(mine):
            continue
        remove_entry(entry)
        removed.append(entry)
    return removed


# ------------------------------------------------------------------ one writer per folder
_HELD = {}  # real path of a lock file -> [file descriptor, depth] (the lock is re-entrant in a process)


def lock_file(folder, beside=False):
    """The lock file of `folder`: `folder/.keras_transformer.lock` (a workdir, which stays in place), or with
    `beside` the hidden `.NAME.lock` beside it (an export, which is replaced as a whole).

    >>> lock_file("runs/a").name, lock_file("saved_models/en_de", beside=True).name
    ('.keras_transformer.lock', '.en_de.lock')
    """
    folder = pathlib.Path(folder)
    return folder.with_name(f".{folder.name}.lock") if beside else folder / LOCK_FILE


def lock_holder(folder, beside=False):
    """What the lock file of `folder` says of the process that last took it (a dict; empty without one)."""
    try:
        return json.loads(lock_file(folder, beside).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _busy(folder, beside=False):
    holder = lock_holder(folder, beside)
    who = (f"process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
           f"({holder.get('command', '?')}, started {holder.get('started', '?')})") if holder else "another process"
    what = "an export folder" if beside else "a workdir"
    return WorkdirBusyError(
        f"{folder} is in use by {who}: one command writes to {what} at a time. Wait for it to finish, or stop "
        f"it; the lock goes with the process, so the same command can then be run again.")


def check_unlocked(folder, beside=False):
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


def _take(path, folder, beside):
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
def exclusive_lock(folder, command, beside=False):
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
def _open_for_lock(path):
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
def shared_lock(path):
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
def exclusive_unless_shared(path):
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
