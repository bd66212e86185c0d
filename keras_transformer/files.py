"""Small file helpers shared by every layer. Standard library only.

Every file the package writes for later reading (checkpoints, configs,
history, arrays, translations) is written under a temporary name in the same
folder and renamed, so that a process killed at any moment leaves either the
old file or the new one, never half of one.
"""

import os
import pathlib


def temporary_path(path):
    """A hidden name beside `path` that keeps its suffixes (writers such as h5py and numpy check them).

    Example:

    >>> temporary_path("run/checkpoints/ckpt-0003.weights.h5").name
    '.ckpt-0003.tmp.weights.h5'
    """
    path = pathlib.Path(path)
    stem = path.name.split(".")[0]
    return path.with_name(f".{stem}.tmp{''.join(path.suffixes)}")


def atomic_write(path, write):
    """Calls `write(temporary)` with a path beside `path`, then renames it to `path`.

    Args:
        path: the file to write; its folder is created.
        write: a function that writes a file at the path it is given.

    Returns:
        `path`, as a `pathlib.Path`.

    Example:

    >>> import tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out" / "note.txt"
    >>> _ = atomic_write(target, lambda p: pathlib.Path(p).write_text("done"))
    >>> target.read_text(), sorted(p.name for p in target.parent.iterdir())
    ('done', ['note.txt'])
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    write(str(temporary))
    os.replace(temporary, path)
    return path


def atomic_write_text(path, text):
    """Writes `text` (UTF-8) to `path` atomically (see `atomic_write`).

    Example:

    >>> import tempfile
    >>> atomic_write_text(pathlib.Path(tempfile.mkdtemp()) / "a.txt", "x").read_text()
    'x'
    """
    return atomic_write(path, lambda temporary: pathlib.Path(temporary).write_text(text, encoding="utf-8"))
