"""The checks `train --dry-run` makes of a run's data files before any data work: each file exists, and the
files of a split count the same number of lines (streamed, not read into memory)."""

import pathlib
import typing

from keras_transformer.data.textfile import count_lines
from keras_transformer.errors import ConfigError


def check_data_files(files: typing.Mapping[str, typing.Any]) -> None:
    """Raises `ConfigError` naming the first file of `files` (`{data key: path or None}`) that is missing or is
    a folder; None is a file not given.

    Example:

    >>> check_data_files({"train_source": None})
    >>> check_data_files({"train_source": "/nonexistent.en"})
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: data.train_source: file not found: /nonexistent.en
    """
    for name, path in files.items():
        if path is None:
            continue
        path = pathlib.Path(path)
        if path.is_dir():
            raise ConfigError(f"data.{name}: {path} is a directory, not a file.")
        if not path.is_file():
            raise ConfigError(f"data.{name}: file not found: {path}")


def count_split_lines(splits: typing.Mapping[str, typing.Mapping[str, typing.Any]]) -> dict[str, int]:
    """Counts the lines of each split's files (streaming, `textfile.count_lines`) and refuses files that
    disagree: line N of a source file must translate line N of its target (and of its tokenized references).

    Args:
        splits: `{split: {data key: path or None}}`; the first file given of a split is the one the others are
            compared with.

    Returns:
        `{split: lines}` for the splits with a file given.

    Raises:
        ConfigError: two files of a split differ in length (both keys, files and counts are named).

    Example:

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for name, text in (("a.en", "One.\\nTwo.\\n"), ("a.de", "Eins.\\nZwei.\\n")):
    ...     _ = (folder / name).write_text(text, encoding="utf-8")
    >>> count_split_lines({"train": {"train_source": folder / "a.en", "train_target": folder / "a.de"},
    ...                    "test": {"test_source": None}})
    {'train': 2}
    """
    counts = {}
    for split, paths in splits.items():
        lines = [(name, path, count_lines(path)) for name, path in paths.items() if path is not None]
        for name, path, count in lines[1:]:
            first, first_path, first_count = lines[0]
            if count != first_count:
                raise ConfigError(f"data.{first} ({first_path}) has {first_count} lines but data.{name} "
                                  f"({path}) has {count}: line N of one must translate line N of the other.")
        if lines:
            counts[split] = lines[0][2]
    return counts
