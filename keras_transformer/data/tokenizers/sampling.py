"""Sentences drawn uniformly from text of any size in one pass, what a vocabulary is learned from: from an
iterable (`reservoir_sample`) or from files (`sample_files`, decoding only the lines drawn). No TensorFlow."""

import itertools
import math
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from keras_transformer.data import corpus, textfile


def check_text_files(files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> None:
    """Raises FileNotFoundError naming the first of `files` (one path or a list) that is not a file.

    Example:

    >>> check_text_files("/nonexistent/train.en")
    Traceback (most recent call last):
    ...
    FileNotFoundError: No such file: /nonexistent/train.en (it does not exist); a vocabulary is learned from ...
    """
    for path in [files] if isinstance(files, (str, os.PathLike)) else files:
        if not os.path.isfile(path):
            found = "a folder, not a text file" if os.path.isdir(path) else "it does not exist"
            raise FileNotFoundError(f"No such file: {os.fspath(path)} ({found}); a vocabulary is learned from text "
                                    "files of one sentence per line.")


def reservoir_sample(items: Iterable[Any], size: int | None, seed: int | Sequence[int] = 0) -> tuple[list[Any], int]:
    """A uniform sample of at most `size` items of an iterable of any length, drawn in one pass.

    Every subset of `size` items is equally likely (Li's "Algorithm L", ACM
    TOMS 1994: a reservoir of `size` items whose next replacement is found by
    skipping a geometrically distributed number of items). Memory holds the
    reservoir only, and random numbers are drawn only for the replacements
    (about ``size * log(n / size)`` of them), so one pass over a corpus of any
    size costs its reading. The sample is a pure function of the items and `seed`.

    Args:
        items: any iterable, read once.
        size: the sample's size; None takes every item.
        seed: an int or a sequence of ints (through `numpy.random.SeedSequence`).

    Returns:
        ``(sample, count)``: a list of ``min(size, count)`` items (in no
        particular order) and the number of items read.

    Example:

    >>> sample, count = reservoir_sample(range(1000), 5, seed=1)
    >>> len(sample), count, len(set(sample)), all(0 <= item < 1000 for item in sample)
    (5, 1000, 5, True)
    >>> reservoir_sample(range(3), 5)
    ([0, 1, 2], 3)
    """
    if size is None:
        sample = list(items)
        return sample, len(sample)
    iterator = iter(items)
    chunks = ((chunk, None) for chunk in iter(lambda: list(itertools.islice(iterator, 1 << 16)), []))
    sample, count = _reservoir(chunks, size, seed)
    return [item for _, _, item in sample], count


def _reservoir(chunks: Iterable[tuple[Sequence[Any], Any]], size: int,
               seed: int | Sequence[int]) -> tuple[list[tuple[Any, int, Any]], int]:
    """`reservoir_sample` over `(items, tag)` chunks: `([(tag, index in its chunk, item), ...], count)`.

    The random numbers, and so the sample, depend only on the items' positions
    in the whole stream, not on how it is cut into chunks; work is done per item
    drawn, not per item read, so a chunk's items cost only their reading.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"A sample size must be a positive integer or None, got {size!r}.")
    # Python's generator (seeded through numpy's SeedSequence, which takes an int or a sequence of ints): a draw
    # costs a tenth of a numpy scalar draw, and a large sample takes about size * log(n / size) of them.
    rng = random.Random(int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0]))

    def uniform() -> float:  # in (0, 1]: its logarithm is finite
        return 1.0 - rng.random()

    def skip() -> int:
        return math.floor(math.log(uniform()) / math.log1p(-weight)) if weight < 1 else 0

    reservoir: list[tuple[Any, int, Any]]
    weight: Any  # a float once the reservoir is full
    pick: int | None
    reservoir, count, weight, pick = [], 0, None, None  # pick: the stream position drawn next
    for items, tag in chunks:
        first, count = count, count + len(items)
        if len(reservoir) < size:
            taken = min(size - len(reservoir), len(items))
            reservoir.extend((tag, index, items[index]) for index in range(taken))
            if len(reservoir) == size:
                weight = math.exp(math.log(uniform()) / size)
                pick = first + taken + skip()
        while pick is not None and pick < count:
            reservoir[rng.randrange(size)] = (tag, pick - first, items[pick - first])
            weight *= math.exp(math.log(uniform()) / size)
            pick += 1 + skip()
    return reservoir, count


def sample_files(files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], size: int | None,
                 seed: int | Sequence[int] = 0, errors: str = "strict",
                 max_lines: int | list[int | None] | tuple[int | None, ...] | None = None) -> tuple[list[str], int]:
    """A uniform sample of at most `size` lines of one file or a list of files, read in one pass; blank lines
    drawn are dropped.

    The files (plain or gzip UTF-8) are read in large blocks split into lines
    of bytes; `reservoir_sample`'s draws index into them, and only the lines
    drawn are decoded (and checked: the training pipeline reads every line and
    checks them all), so the pass runs at the speed of reading.

    Args:
        files: one path or a list of paths; every one is checked before any is read.
        size: the sample's size; None takes every line.
        seed: the seed of the draw.
        errors: ``"strict"`` (invalid UTF-8 raises `corpus.CorpusError` naming file and line) or ``"replace"``.
        max_lines: read only the first lines of each file: one count for all, or a list of counts (or None)
            matching `files`; None reads every line.

    Returns:
        ``(sentences, count)``: the sampled lines that are not blank, and the number of lines read.

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_text("".join(f"line {i}\\n" for i in range(100)), encoding="utf-8")
    >>> sentences, count = sample_files(path, 10, seed=0)
    >>> len(sentences), count, sentences == sample_files(path, 10, seed=0)[0]
    (10, 100, True)
    >>> sorted(sample_files(path, None, max_lines=3)[0])
    ['line 0', 'line 1', 'line 2']
    """
    if errors not in textfile.ERROR_MODES:
        raise ValueError(f"errors must be one of {textfile.ERROR_MODES}, got {errors!r}.")
    check_text_files(files)
    paths = [os.fspath(path) for path in ([files] if isinstance(files, (str, os.PathLike)) else files)]
    limits = list(max_lines) if isinstance(max_lines, (list, tuple)) else [max_lines] * len(paths)
    if len(limits) != len(paths):
        raise ValueError(f"max_lines has {len(limits)} counts for {len(paths)} files.")
    sample: list[tuple[Any, int, Any]]
    if size is None:
        sample, count = [], 0
        for lines, tag in _line_blocks(paths, limits):
            sample.extend((tag, index, line) for index, line in enumerate(lines))
            count += len(lines)
    else:
        sample, count = _reservoir(_line_blocks(paths, limits), size, seed)
    sentences = []
    for (path, first), index, raw in sample:
        raw, number = raw.rstrip(b"\r"), first + index
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
            raw = raw[3:]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            if errors == "strict":
                raise corpus.CorpusError(f"{path}:{number}: invalid UTF-8 (byte {error.start} of the line: "
                                         f"{raw[error.start:error.end]!r}); fix the file or read it with "
                                         "errors='replace' to replace bad bytes with U+FFFD.") from None
            line = raw.decode("utf-8", errors="replace")
        if line.strip():
            sentences.append(line)
    return sentences, count


def _line_blocks(paths: Sequence[str], limits: Sequence[int | None],
                 block: int = 1 << 22) -> Iterator[tuple[list[bytes], tuple[str, int]]]:
    """The lines of `paths` (bytes, split on ``\\n`` only, as `textfile` splits) in lists of a block's lines,
    each with its tag `(path, number of its first line)`; a path's limit (None: no limit) ends it after that
    many lines."""
    for path, limit in zip(paths, limits):
        number, rest = 1, b""
        with textfile.open_binary(path) as handle:
            try:
                while limit is None or number <= limit:
                    data = handle.read(block)
                    if not data:
                        break
                    lines = (rest + data).split(b"\n")
                    rest = lines.pop()
                    if limit is not None and number + len(lines) > limit:
                        lines, rest = lines[:limit - number + 1], b""
                    yield lines, (path, number)
                    number += len(lines)
            except EOFError:
                raise ValueError(f"{path}: the gzip data ends before its end marker (a truncated file?)") from None
        if rest and (limit is None or number <= limit):
            yield [rest], (path, number)
