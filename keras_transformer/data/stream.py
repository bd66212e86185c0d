"""Parallel corpora read as a stream of windows: lazily, line by line, at a memory that does not grow with them.

No TensorFlow here: `pipeline` turns the windows into token-budget batches
inside tf.data. What this module decides:

* **Reading.** Each corpus is two line-aligned files (plain or gzip, detected
  from the content), read a line at a time the way `textfile.iter_stream` reads
  them. A pair with an empty side is dropped and counted; invalid UTF-8 fails
  with the file and line number (or becomes U+FFFD with ``errors="replace"``);
  a file that ends before the other fails as soon as it ends, naming both.
* **Windows.** The stream is cut into windows of `window` lines. One corpus:
  pass ``p`` over it is windows ``0, 1, ...`` of consecutive lines, the last one
  shorter. Several corpora (`Corpus` weights): an endless stream of full
  windows; window ``k`` takes from each corpus a number of lines drawn from the
  multinomial of its weights (seeded by ``(seed, k)``), each corpus going on
  where it stopped and starting again when it runs out.
* **Shards.** With ``shard=(count, index)`` a reader keeps only the lines
  whose 0-based number is ``index`` modulo ``count`` (the others are not even
  decoded): the workers of a multi-worker run read disjoint parts that together
  are the corpus.
* **Positions.** A `Position` ``(pass, window, skip)`` names a point of the
  stream; the windows from there on are the same whatever came before, so a
  resumed run starts reading at its window (lines before it are skipped without
  decoding) and drops the `skip` batches of that window it already trained.
"""

import dataclasses
import io
import itertools
import os
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from keras_transformer.data import textfile

MIX_STREAM = 7  # a constant in the seed of the mixture's draws, apart from the shuffles' seeds


class CorpusError(ValueError):
    """A parallel corpus that cannot be read as given (misaligned files, invalid UTF-8, ...)."""


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One parallel corpus of a training run: two line-aligned files (or lists of sentences) and a weight.

    Example:

    >>> Corpus("news", "news.en.gz", "news.de.gz", weight=2).weight
    2
    """

    name: str  # how logs and errors call it
    source: typing.Any  # source file (plain or gzip), or a list of str
    target: typing.Any  # target file, line N translating line N of `source`, or a list of str
    weight: float = 1  # share of the training pairs drawn from it, relative to the other corpora's weights
    max_pairs: typing.Optional[int] = None  # read only its first N line pairs (as if the files ended there)


@dataclasses.dataclass(frozen=True)
class Position:
    """A point of the stream: window `window` of pass `pass_number`, after its first `skip` batches.

    Example:

    >>> Position.from_dict(Position(2, 5, 3).to_dict())
    Position(pass_number=2, window=5, skip=3)
    """

    pass_number: int = 0  # passes over the corpus before this one (always 0 for several corpora)
    window: int = 0  # windows of this pass before this one
    skip: int = 0  # batches of this window already trained

    def to_dict(self) -> dict[str, int]:
        """A JSON-able dict (`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "Position":
        """The `Position` of `to_dict`."""
        return cls(**{field.name: int(values[field.name]) for field in dataclasses.fields(cls)})


@dataclasses.dataclass
class Window:
    """The pairs of one window, and what reading them dropped or changed."""

    pass_number: int
    index: int  # the window's number in its pass
    sources: list[str]
    targets: list[str]
    lines: int = 0  # lines read (pairs), the dropped ones included
    empty: int = 0  # pairs dropped for an empty side
    replaced: int = 0  # pairs kept with invalid UTF-8 replaced
    last: bool = False  # the last window of its pass


def side_name(side: Any) -> str:
    """How messages call one side of a `Corpus`: its path, or ``<memory>``.

    Example:

    >>> side_name(['a']), side_name('a.en')
    ('<memory>', 'a.en')
    """
    return "<memory>" if isinstance(side, (list, tuple)) else os.fspath(side)


class _PairReader:
    """The line pairs of one corpus (one shard of it), read once from its start; `skip` and `read` go forward."""

    def __init__(self, corpus: Corpus, shard: Sequence[int] = (1, 0), errors: str = "strict") -> None:
        self.corpus, self.errors = corpus, errors
        self.count, self.index = shard
        self.names = (side_name(corpus.source), side_name(corpus.target))
        self.number = 0  # lines of the files read so far (all shards)
        self.limit = corpus.max_pairs  # the files end here for this reader (None: at their end)
        self.done = False  # the files have ended
        self._peeked: tuple[int, tuple[Any, ...]] | None = None  # `(number, pair)` read ahead by `at_end`
        if isinstance(corpus.source, (list, tuple)):
            if len(corpus.source) != len(corpus.target):
                raise CorpusError(f"Misaligned parallel corpus {corpus.name}: {len(corpus.source)} source sentences "
                                  f"but {len(corpus.target)} target sentences.")
            self._handles: tuple[io.BufferedIOBase, ...] = ()
            self._lines: Iterator[tuple[Any, ...]] = zip(corpus.source, corpus.target)
        else:
            self._handles = (textfile.open_binary(corpus.source), textfile.open_binary(corpus.target))
            self._sides = [textfile.complete_lines(handle, name) for handle, name in zip(self._handles, self.names)]
            self._lines = itertools.zip_longest(*self._sides)

    def close(self) -> None:
        for handle in self._handles:
            handle.close()

    def _next_raw(self) -> tuple[int, tuple[Any, ...]] | None:
        """`(line number, pair)`: the next line pair of this shard, raw (bytes or str); None at the end."""
        if self._peeked is not None:
            pair, self._peeked = self._peeked, None
            return pair
        while not self.done:
            if self.limit is not None and self.number >= self.limit:
                self.done = True
                return None
            try:
                pair = next(self._lines)
            except StopIteration:
                self.done = True
                return None
            if None in pair:
                ended, going = (0, 1) if pair[0] is None else (1, 0)
                raise CorpusError(
                    f"Misaligned parallel corpus: {self.names[ended]} ends after {self.number} lines but "
                    f"{self.names[going]} goes on (line {self.number + 1}); line N of one file must translate line "
                    "N of the other.")
            self.number += 1
            if (self.number - 1) % self.count == self.index:
                return self.number, pair
        return None

    def at_end(self) -> bool:
        """Whether no line of this shard is left (reads one ahead)."""
        if self._peeked is None:
            self._peeked = self._next_raw()
        return self._peeked is None

    def length(self) -> int:
        """The lines of this shard, once the files have ended."""
        return len(range(self.index, self.number, self.count))

    def skip(self, lines: int) -> int:
        """Passes over `lines` lines of this shard without decoding them; returns how many there were."""
        if self._handles and self._peeked is None and self.number % self.count == 0 and not self.done:
            # Whole files' lines, at C speed: `count` file lines a shard line, both files side by side.
            wanted = lines * self.count
            if self.limit is not None:
                wanted = min(wanted, self.limit - self.number)
            got = [sum(1 for _ in itertools.islice(side, wanted)) for side in self._sides]
            if got[0] != got[1]:
                ended, going = (0, 1) if got[0] < got[1] else (1, 0)
                raise CorpusError(
                    f"Misaligned parallel corpus: {self.names[ended]} ends after {self.number + got[ended]} lines "
                    f"but {self.names[going]} goes on (line {self.number + got[ended] + 1}); line N of one file "
                    "must translate line N of the other.")
            self.number += got[0]
            if got[0] < lines * self.count:
                self.done = True
                return len(range(self.index, got[0], self.count))
            return lines
        for skipped in range(lines):
            if self._next_raw() is None:
                return skipped
        return lines

    def read(self, lines: int, window: Window) -> None:
        """Adds up to `lines` pairs of this shard to `window` (dropping and counting empty ones)."""
        for _ in range(lines):
            numbered = self._next_raw()
            if numbered is None:
                return
            number, pair = numbered
            window.lines += 1
            if self._handles:
                (source, bad_source), (target, bad_target) = (
                    self._decode(raw, name, number) for raw, name in zip(pair, self.names))
            else:
                (source, target), bad_source, bad_target = pair, False, False
            if not source.strip() or not target.strip():
                window.empty += 1
                continue
            window.sources.append(source)
            window.targets.append(target)
            window.replaced += bad_source or bad_target

    def _decode(self, raw: bytes, name: str, number: int) -> tuple[str, bool]:
        try:
            return textfile.decode_line(raw, name, number, self.errors)
        except textfile.InvalidUTF8Error as error:
            raise CorpusError(f"{error}; fix the file or read it with errors='replace' to replace bad bytes with "
                              "U+FFFD.") from None


def check_corpora(corpora: Sequence[Corpus]) -> None:
    """Checks what a stream of `corpora` needs before it reads them: names, weights, files that exist.

    Raises:
        ValueError: no corpus, a name twice, a weight that is not a positive number.
        FileNotFoundError: a file that does not exist.

    Example:

    >>> check_corpora([Corpus("a", ["x"], ["y"], weight=0)])
    Traceback (most recent call last):
    ...
    ValueError: corpus 'a': weight must be a positive number, got 0.
    """
    if not corpora:
        raise ValueError("No training corpus.")
    names = [corpus.name for corpus in corpora]
    for corpus in corpora:
        if names.count(corpus.name) > 1:
            raise ValueError(f"Two corpora are named {corpus.name!r}: give each its own name.")
        weight = corpus.weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 or weight == float("inf"):
            raise ValueError(f"corpus {corpus.name!r}: weight must be a positive number, got {weight!r}.")
        for side in (corpus.source, corpus.target):
            if not isinstance(side, (list, tuple)) and not os.path.isfile(os.fspath(side)):
                raise FileNotFoundError(f"corpus {corpus.name!r}: file not found: {os.fspath(side)}")


def mixture_counts(weights: Sequence[float], window: int, seed: int, index: int) -> np.ndarray:
    """The lines window `index` of a mixture takes from each corpus: a multinomial draw of `window` lines.

    Example:

    >>> counts = mixture_counts([3, 1], 1000, seed=0, index=0)
    >>> int(counts.sum()), bool(650 < counts[0] < 850)
    (1000, True)
    """
    shares = np.asarray(weights, dtype=np.float64)
    rng = np.random.default_rng([int(seed), MIX_STREAM, int(index)])
    return rng.multinomial(int(window), shares / shares.sum())


def windows(corpora: Sequence[Corpus], window: int, start: Position = Position(), *, seed: int = 0,
            shard: Sequence[int] = (1, 0), errors: str = "strict", endless: bool = False) -> Iterator[Window]:
    """Yields the `Window`s of a stream of parallel corpora from `start` (see the module docstring).

    Args:
        corpora: a list of `Corpus`; one reads in passes, several mix by weight without end.
        window: lines per window.
        start: the `Position` to start at (its `skip` is the caller's to apply).
        seed: the mixture's seed.
        shard: ``(count, index)``: read only the lines whose number is `index` modulo `count`.
        errors: invalid UTF-8, ``"strict"`` or ``"replace"``.
        endless: one corpus: pass after pass without end (False: the pass `start` is in, then stop).

    Example:

    >>> stream = windows([Corpus("a", ["1", "2", "", "4", "5"], ["one", "two", "three", "four", "five"])], 2)
    >>> [(w.index, w.sources, w.empty, w.last) for w in stream]
    [(0, ['1', '2'], 0, False), (1, ['4'], 1, False), (2, ['5'], 0, True)]
    """
    check_corpora(corpora)
    if len(corpora) == 1:
        yield from _passes(corpora[0], window, start, shard, errors, endless)
    else:
        yield from _mixture(corpora, window, start, seed, shard, errors)


def _passes(corpus: Corpus, window: int, start: Position, shard: Sequence[int], errors: str,
            endless: bool) -> Iterator[Window]:
    pass_number, index = start.pass_number, start.window
    while True:
        reader = _PairReader(corpus, shard, errors)
        try:
            if reader.skip(index * window) < index * window or (index and reader.at_end()):
                raise CorpusError(f"Cannot resume corpus {corpus.name!r} at window {index + 1} of {window} lines: "
                                  f"its files have fewer lines than when the run started.")
            while True:
                current = Window(pass_number, index, [], [])
                reader.read(window, current)
                if not current.lines:
                    raise CorpusError(f"corpus {corpus.name!r}: {reader.names[0]} and {reader.names[1]} have no "
                                      f"line{' for this worker' if reader.count > 1 else ''}.")
                current.last = reader.at_end()
                yield current
                index += 1
                if current.last:
                    break
        finally:
            reader.close()
        if not endless:
            return
        pass_number, index = pass_number + 1, 0


def _mixture(corpora: Sequence[Corpus], window: int, start: Position, seed: int, shard: Sequence[int],
             errors: str) -> Iterator[Window]:
    weights = [corpus.weight for corpus in corpora]
    readers = [_PairReader(corpus, shard, errors) for corpus in corpora]
    lengths: list[int | None] = [None] * len(corpora)  # lines of each shard, learned when it first runs out
    try:
        totals = sum((mixture_counts(weights, window, seed, k) for k in range(start.window)),
                     np.zeros(len(corpora), np.int64))
        for c, total in enumerate(totals.tolist()):
            readers[c], lengths[c] = _forward(readers[c], corpora[c], int(total), shard, errors, lengths[c])
        index = start.window
        while True:
            current = Window(0, index, [], [])
            for c, count in enumerate(mixture_counts(weights, window, seed, index).tolist()):
                while count:
                    before = current.lines
                    readers[c].read(count, current)
                    count -= current.lines - before
                    if readers[c].at_end():  # this corpus ran out: it starts again, the others go on
                        if readers[c].length() == 0:
                            raise CorpusError(f"corpus {corpora[c].name!r} has no line"
                                              f"{' for this worker' if shard[0] > 1 else ''}.")
                        readers[c].close()
                        readers[c] = _PairReader(corpora[c], shard, errors)
            yield current
            index += 1
    finally:
        for reader in readers:
            reader.close()


def _forward(reader: _PairReader, corpus: Corpus, lines: int, shard: Sequence[int], errors: str,
             length: int | None) -> tuple[_PairReader, int | None]:
    """`reader` moved `lines` lines on, going round the corpus as often as needed; `(reader, shard length)`."""
    while lines:
        if length is not None:
            lines %= length
        lines -= reader.skip(lines)
        if reader.at_end():
            length = reader.length()
            if length == 0:
                raise CorpusError(f"corpus {corpus.name!r} has no line.")
            reader.close()
            reader = _PairReader(corpus, shard, errors)
    return reader, length
