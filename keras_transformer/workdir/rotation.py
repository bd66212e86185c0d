"""Checkpoint rotation, and the readers that pin checkpoints against it: no reader loses a file it reads.

A running `train` deletes its oldest checkpoints after each save (`rotate_checkpoints`, the one place that deletes
them); a reader (`workdir.checkpoints.load_models`, `average_workdir`) holds them in place while it lists and reads
them (`pinned_checkpoints`), through a shared lock on `checkpoints/.readers.lock`. Standard library only.
"""

import contextlib
import logging
import os
import pathlib
from collections.abc import Iterator

from keras_transformer.files import exclusive_unless_shared, shared_lock
from keras_transformer.workdir.layout import CHECKPOINTS_DIR

log = logging.getLogger("keras_transformer")

READERS_LOCK = ".readers.lock"  # in checkpoints/: held shared by readers, taken by `rotate_checkpoints`


@contextlib.contextmanager
def pinned_checkpoints(workdir: str | os.PathLike[str]) -> Iterator[None]:
    """Keeps the checkpoints of `workdir` in place while the `with` block lists and reads them.

    A running `train` with `training.keep_checkpoints` deletes its oldest checkpoints after each epoch (and
    `checkpoint_every_steps` its oldest step checkpoints). A reader (`load_models`: translate, evaluate,
    export; `average_workdir`) holds a shared lock on `checkpoints/.readers.lock` for as long as it reads;
    `rotate_checkpoints`, the one place that deletes checkpoints, deletes only when no reader holds it, and
    otherwise leaves the old files to its next rotation. So a reader never lists a checkpoint that is gone
    before it is read, and a training run never waits for a reader. (New checkpoints are renamed into place
    whole: a reader sees a file or none.) Without `flock` (Windows), or in a read-only folder that has no
    lock file, nothing is pinned.

    Example:

    >>> import tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> (run / "checkpoints").mkdir()
    >>> for epoch in (1, 2):
    ...     _ = (run / "checkpoints" / f"ckpt-{epoch:04d}.weights.h5").write_bytes(b"")
    >>> with pinned_checkpoints(run):
    ...     rotate_checkpoints(run / "checkpoints", keep=1)   # a reader is reading: nothing is deleted
    []
    >>> [path.name for path in rotate_checkpoints(run / "checkpoints", keep=1)]   # the next rotation
    ['ckpt-0001.weights.h5']
    """
    directory = pathlib.Path(workdir) / CHECKPOINTS_DIR
    if not directory.is_dir():
        yield
        return
    with shared_lock(directory / READERS_LOCK):
        yield


def rotate_checkpoints(directory: str | os.PathLike[str], keep: int,
                       pattern: str = "ckpt-[0-9][0-9][0-9][0-9].weights.h5") -> list[pathlib.Path]:
    """Deletes all but the newest `keep` checkpoints named like `pattern` in `directory`, unless a reader holds
    them (`pinned_checkpoints`): then it deletes nothing and returns at once; the next rotation deletes them.
    What the training loop's checkpoint callbacks call after each save.

    Returns:
        The paths deleted.

    Example:

    >>> import tempfile
    >>> directory = pathlib.Path(tempfile.mkdtemp())
    >>> for epoch in (1, 2, 3):
    ...     _ = (directory / f"ckpt-{epoch:04d}.weights.h5").write_bytes(b"")
    >>> [path.name for path in rotate_checkpoints(directory, keep=2)]
    ['ckpt-0001.weights.h5']
    """
    directory = pathlib.Path(directory)
    old = sorted(directory.glob(pattern))[:-int(keep)]
    if not old:
        return []
    with exclusive_unless_shared(directory / READERS_LOCK) as free:
        if not free:
            log.debug("Not deleting %d old checkpoint(s) of %s now: a reader holds them.", len(old), directory)
            return []
        old = sorted(directory.glob(pattern))[:-int(keep)]
        for path in old:
            path.unlink(missing_ok=True)
    return old
