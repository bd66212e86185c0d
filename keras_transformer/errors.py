"""The package's error types. Standard library only: every other module may import it.

A message always names the key, the value or the file at fault. The command
line prints these errors without a traceback: `describe_fault` gives each fault (these errors, a full disk,
a denied permission, exhausted memory, a stop by SIGTERM) its one line and its exit status (`EXIT_CODES`).
"""

import contextlib
import errno
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class ConfigError(ValueError):
    """An experiment config that cannot be used; the message names the key or file."""


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint, training backup or model folder that cannot be read; the message names the file.

    The one error type of `keras_transformer.workdir.checkpoints`, which knows the on-disk
    layout of runs and exports. It is a `ValueError` (an unreadable or
    mismatched file) and, as it always was, a `RuntimeError`.

    Example:

    >>> issubclass(CheckpointError, ValueError), issubclass(CheckpointNotFoundError, FileNotFoundError)
    (True, True)
    """


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint or model folder that does not exist (also a `FileNotFoundError`)."""


class WorkdirBusyError(RuntimeError):
    """Another process holds the folder a command writes to (`files.exclusive_lock`); the message names it."""


class ExportDamagedError(CheckpointError):
    """An export whose files differ from its manifest (a file missing, truncated or changed); the message names
    the file. Raised by `keras-transformer verify` and, on sizes, by every loader of an export.

    Example:

    >>> issubclass(ExportDamagedError, CheckpointError)
    True
    """


class CorruptFileError(CheckpointError):
    """A file the package wrote (model.yaml, a tokenizer's model, a weights file) that cannot be read as what it
    should be; the message names the file, what is wrong with it and what to do."""


class DocumentError(ValueError):
    """A document that cannot be translated as one: binary data, invalid UTF-8, markup that cannot be parsed, or
    more than the size limit; the message names the problem (a byte offset, a line and column, the limit).

    Example:

    >>> issubclass(DocumentError, ValueError)
    True
    """


class RunStopped(BaseException):
    """A command stopped by a signal (SIGTERM): a training run after writing a backup at the batch it had reached,
    any other command (or a run not yet training) where it stood, its files written whole or not at all.

    A `BaseException`, as `KeyboardInterrupt` is: no `except Exception` on its way takes it for a fault of its own
    (a backup that would not load, say).

    Args:
        signal_name: the signal, e.g. "SIGTERM".
        position: `(epochs finished, batches of the next epoch trained)`, what the backup resumes at; None when
            no training was under way.
        backup_dir: the folder of that backup.

    Example:

    >>> print(RunStopped("SIGTERM", (1, 3), "runs/x/backup"))
    stopped by SIGTERM at epoch 2, batch 3 (the backup in runs/x/backup resumes there)
    >>> print(RunStopped("SIGTERM"))
    stopped by SIGTERM
    """

    def __init__(self, signal_name: str, position: tuple[int, int] | None = None,
                 backup_dir: str | os.PathLike[str] | None = None) -> None:
        self.signal_name, self.backup_dir = signal_name, backup_dir and str(backup_dir)
        self.position = tuple(position) if position is not None else None
        if self.position is None:
            super().__init__(f"stopped by {signal_name}")
            return
        epoch, done = self.position
        where = f"epoch {epoch + 1}, batch {done}" if done else f"the end of epoch {epoch}"
        super().__init__(f"stopped by {signal_name} at {where} (the backup in {backup_dir} resumes there)")


@contextlib.contextmanager
def raise_on_sigterm() -> Iterator[None]:
    """While active, SIGTERM raises `RunStopped` wherever the process is (as Ctrl-C raises KeyboardInterrupt),
    so that a command ends in one line and status 143 (`describe_fault`) instead of dying silently; files are
    written atomically, so nothing written is lost. While a run trains, its own handler takes over and first
    writes a backup at the current batch (`trainer.backup.stop_on_sigterm`). Outside the main thread it does
    nothing.

    Example:

    >>> try:
    ...     with raise_on_sigterm():
    ...         signal.raise_signal(signal.SIGTERM)
    ... except RunStopped as stopped:
    ...     print(stopped)
    stopped by SIGTERM
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(number: int, frame: FrameType | None) -> None:
        raise RunStopped(signal.Signals(number).name)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# The exit statuses of the `keras-transformer` command, one per
# kind of fault; `describe_fault` maps an error to its status and its one line. docs/training.md lists them.
EXIT_CODES = {
    0: "success",
    1: "an unexpected error (a bug: the traceback is printed; please report it)",
    2: "bad input: a command-line argument, a config key or value, a missing or mismatched file, a busy folder",
    3: "a corrupt file (named), e.g. a model.yaml that is not YAML, a truncated sentencepiece.model, an export "
       "whose files differ from its manifest",
    4: "out of disk space: nothing was lost; free some space and run the same command again",
    5: "permission denied on a file or folder (named)",
    6: "out of memory: make the model or the batches smaller",
    130: "interrupted (Ctrl-C): run the same command again to resume from the last backup",
    143: "stopped by SIGTERM after writing a backup at the current batch: the same command resumes there",
}
EXIT_BAD_INPUT, EXIT_CORRUPT, EXIT_DISK_FULL, EXIT_PERMISSION, EXIT_MEMORY = 2, 3, 4, 5, 6
EXIT_INTERRUPTED, EXIT_STOPPED = 130, 143


def exit_codes_help() -> str:
    """The exit statuses as the command's `--help` lists them, one per line.

    Example:

    >>> print(exit_codes_help().splitlines()[5])
      4    out of disk space: nothing was lost; free some space and run the same command again
    """
    return ("exit statuses:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items())
            + "\n  (verify answers 0 for a whole export, 3 for a damaged one, 2 for one without a manifest)")


def _errno_of(error: BaseException) -> int | None:
    """The errno an error carries: an `OSError`'s, or the one HDF5 and TensorFlow print in their messages."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    text = str(error)
    if "No space left on device" in text or "errno = 28" in text:
        return errno.ENOSPC
    if "Disk quota exceeded" in text:
        return errno.EDQUOT
    if "Permission denied" in text:
        return errno.EACCES
    if "Read-only file system" in text:
        return errno.EROFS
    return None


def _free_space(path: str | os.PathLike[str] | None) -> int | None:
    """`shutil.disk_usage(...).free` of the disk that holds `path` (its nearest folder that exists), or None."""
    if path is None:
        return None
    path = os.path.abspath(os.fspath(path))
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def format_size(count: float) -> str:
    """A byte count for people.

    >>> format_size(3 * 2**20), format_size(512)
    ('3.0 MiB', '512 bytes')
    """
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count} bytes" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def describe_fault(error: BaseException, command: str = "",
                   path: str | os.PathLike[str] | None = None) -> tuple[str | None, int]:
    """The one line and the exit status (`EXIT_CODES`) of an error that ends a command: the one place that maps
    faults to what the user reads.

    Args:
        error: the exception.
        command: the subcommand (`train`, `export`, ...), for the advice.
        path: the file or folder the command writes, named when the error names none.

    Returns:
        `(message, exit status)`; `(None, 1)` for an error that is no fault of the input or the machine (a bug:
        the caller shows its traceback).

    Example:

    >>> describe_fault(CorruptFileError("runs/x/model.yaml is not valid YAML"))
    ('runs/x/model.yaml is not valid YAML', 3)
    >>> message, status = describe_fault(OSError(errno.EACCES, "Permission denied", "/root/run"), "train")
    >>> message, status
    ('permission denied: /root/run (choose a folder you may write to, or change its permissions)', 5)
    """
    kind = type(error).__name__
    number = _errno_of(error) if isinstance(error, (OSError, RuntimeError)) or kind.endswith("Error") else None
    if isinstance(error, RunStopped):
        again = " to resume" if command in ("train", "train-packed", "pack", "") else ""
        return f"{error}; run the same command again{again}.", EXIT_STOPPED
    if number in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        where = getattr(error, "filename", None) or path
        free = _free_space(where)
        named = f" writing {where}" if where else ""
        left = f" ({format_size(free)} free there)" if free is not None else ""
        again = "to resume from where it stopped" if command in ("train", "train-packed") else "to write it"
        return (f"out of disk space{named}{left}: nothing was lost (the files written before stay whole); free "
                f"some space and run the same command again {again}.", EXIT_DISK_FULL)
    if isinstance(error, PermissionError) or number in (errno.EACCES, errno.EPERM, errno.EROFS):
        if isinstance(error, OSError) and error.errno is None:  # raised by the package: its message names the path
            return str(error), EXIT_PERMISSION
        where = getattr(error, "filename", None) or path
        why = " (a read-only file system)" if number == errno.EROFS else ""
        return (f"permission denied: {where or error}{why} (choose a folder you may write to, or change its "
                f"permissions)", EXIT_PERMISSION)
    if isinstance(error, MemoryError) or kind == "ResourceExhaustedError" or "out of memory" in str(error).lower():
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else kind
        return (f"out of memory ({detail}): lower data.tokens_per_batch (or data.batch_size), or the model's sizes, "
                f"or use a machine with more memory; a training run resumes from its last backup with the same "
                f"command.", EXIT_MEMORY)
    if isinstance(error, (CorruptFileError, ExportDamagedError)):
        return str(error), EXIT_CORRUPT
    if isinstance(error, (ValueError, OSError, RuntimeError, FloatingPointError)):
        return str(error), EXIT_BAD_INPUT
    return None, 1
