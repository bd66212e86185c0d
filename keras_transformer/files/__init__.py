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

This package's own code is the writing: temporaries, atomic writes and copies, and folders swapped in whole.
`locks` holds the folder locks, `paths` the checks of a command's output paths; their names are imported from
here.
"""

import contextlib
import ctypes
import errno
import hashlib
import os
import pathlib
import platform
import re
import secrets
import shutil
import sys
import tempfile  # noqa: F401 (the examples of the docstrings use it)
from collections.abc import Callable
from typing import Any

from keras_transformer.files.locks import (
    LOCK_FILE,
    check_unlocked,
    exclusive_lock,
    exclusive_unless_shared,
    lock_file,
    lock_holder,
    shared_lock,
)
from keras_transformer.files.paths import check_not_an_input, check_output_file, is_inside, same_file

__all__ = ["LOCK_FILE", "atomic_copy", "atomic_write", "atomic_write_text", "check_not_an_input", "check_output_file",
           "check_unlocked", "exchange_paths", "exclusive_lock", "exclusive_unless_shared", "file_digest",
           "fsync_file", "fsync_folder", "is_inside", "is_temporary", "lock_file", "lock_holder",
           "recover_replaced_folder", "remove_entry", "remove_stale_staging", "remove_stale_temporaries",
           "replace_folder", "same_file", "shared_lock", "staging_folder", "temporary_path", "write_temporary"]

# `.NAME.tmp-PID...`: this package's temporaries; also the fixed names earlier versions used (`.NAME.tmp...`,
# `history.csv.tmp`).
_TEMPORARY = re.compile(r"^\.[^/]*?\.tmp(?:-(?P<pid>\d+)[^./]*)?(?:\..*)?$|^history\.csv\.tmp$")


def temporary_path(path: str | os.PathLike[str]) -> pathlib.Path:
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


def is_temporary(name: str) -> bool:
    """Whether a file name is one of the package's temporaries (see `temporary_path`).

    >>> is_temporary(".vocab.tmp"), is_temporary("history.csv.tmp"), is_temporary("ckpt-0001.weights.h5")
    (True, True, False)
    """
    return bool(_TEMPORARY.match(name))


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flushes a written file's data to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_folder(path: str | os.PathLike[str]) -> None:
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


def write_temporary(path: str | os.PathLike[str], write: Callable[[str], object]) -> pathlib.Path:
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


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object]) -> pathlib.Path:
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


def atomic_write_text(path: str | os.PathLike[str], text: str) -> pathlib.Path:
    """Writes `text` (UTF-8) to `path` atomically (see `atomic_write`).

    Example:

    >>> atomic_write_text(pathlib.Path(tempfile.mkdtemp()) / "a.txt", "x").read_text()
    'x'
    """
    return atomic_write(path, lambda temporary: pathlib.Path(temporary).write_text(text, encoding="utf-8"))


def atomic_copy(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> pathlib.Path:
    """Copies `source` to `path` atomically: a hard link where the file system has them, else a copy.

    Example:

    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a").write_text("x")
    >>> atomic_copy(folder / "a", folder / "b").read_text()
    'x'
    """
    def copy(temporary: str) -> None:
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)
    return atomic_write(path, copy)


def file_digest(path: str | os.PathLike[str], algorithm: str = "blake2b") -> str:
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


def remove_entry(entry: str | os.PathLike[str]) -> None:
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


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[pathlib.Path]:
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
    removed: list[pathlib.Path] = []
    if not folder.is_dir():
        return removed
    for entry in sorted(folder.iterdir()):
        match = _TEMPORARY.match(entry.name)
        if not match or (match.group("pid") and _alive(int(match.group("pid")))):
            continue  # not a temporary, or one a live process is writing (this one, a worker of a cluster)
        remove_entry(entry)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
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


def staging_folder(path: str | os.PathLike[str]) -> pathlib.Path:
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


def _renameat2() -> Callable[..., Any] | None:
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


def exchange_paths(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> None:
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


def replace_folder(staging: str | os.PathLike[str], path: str | os.PathLike[str]) -> pathlib.Path:
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


def _old_name(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-old")


def _staging_names(path: str | os.PathLike[str]) -> list[pathlib.Path]:
    """The staging folders (and old folders) beside `path` that a writer of `path` made, newest first."""
    path = pathlib.Path(path)
    prefix = f".{path.name}.tmp-"
    if not path.parent.is_dir():
        return []
    found = [entry for entry in path.parent.iterdir() if entry.name.startswith(prefix)
             and re.fullmatch(r"\d+-[^/]+", entry.name[len(prefix):])]
    return sorted(found, key=lambda entry: entry.lstat().st_mtime, reverse=True)


def recover_replaced_folder(path: str | os.PathLike[str]) -> pathlib.Path | None:
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


def remove_stale_staging(path: str | os.PathLike[str]) -> list[pathlib.Path]:
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
