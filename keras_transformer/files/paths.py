"""Checks of the paths a command writes to, before the work: not one of its inputs, and writable."""

import os
import pathlib
import tempfile  # noqa: F401 (the examples of the docstrings use it)
from collections.abc import Iterable


def same_file(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (links and relative paths resolved; a missing file by its path).

    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> same_file(folder / "a.txt", folder / "x" / ".." / "a.txt"), same_file(folder / "a", folder / "b")
    (True, False)
    """
    first, second = pathlib.Path(first), pathlib.Path(second)
    if first.exists() and second.exists():
        return os.path.samefile(first, second)
    return first.resolve() == second.resolve()


def is_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether `path` lies in `folder` or below it (both resolved).

    >>> is_inside("/runs/a/checkpoints/x.h5", "/runs/a"), is_inside("/runs/ab", "/runs/a")
    (True, False)
    """
    path, folder = pathlib.Path(path).resolve(), pathlib.Path(folder).resolve()
    return path == folder or folder in path.parents


def check_not_an_input(output: str | os.PathLike[str], inputs: Iterable[object], option: str = "--output") -> None:
    """Refuses an output path that is one of a command's input files.

    Raises:
        ValueError: `output` is the same file as one of `inputs` (named).

    >>> check_not_an_input("a.txt", ["b.txt", "a.txt"])
    Traceback (most recent call last):
    ...
    ValueError: --output a.txt is one of this command's input files (a.txt): writing it would destroy that input. ...
    """
    for source in inputs:
        if isinstance(source, (str, os.PathLike)) and same_file(output, source):
            raise ValueError(f"{option} {output} is one of this command's input files ({source}): writing it "
                             f"would destroy that input. Choose another file.")


def check_output_file(output: str | os.PathLike[str], what: str = "the translations") -> None:
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
