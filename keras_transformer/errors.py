"""The package's error types. Standard library only: every other module may import it.

A message always names the key, the value or the file at fault. The command
line prints these errors without a traceback.
"""


class ConfigError(ValueError):
    """An experiment config that cannot be used; the message names the key or file."""


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint, training backup or model folder that cannot be read; the message names the file.

    The one error type of `keras_transformer.workdir`, which knows the on-disk
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
