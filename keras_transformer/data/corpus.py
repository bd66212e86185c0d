"""Reading parallel corpora: two text files, one sentence per line, aligned by line.

Files are UTF-8, plain or gzip-compressed (detected from the content, not the
name). Lines are split on ``\\n`` only (``\\r\\n`` is accepted), never on the other
characters Python's ``str.splitlines`` treats as line breaks (U+2028, ``\\x0b``,
...), which would silently shift one side against the other.

What is dropped, replaced, filtered or truncated is counted in a
`CorpusSummary` that the pipeline returns and logs, so a user always sees how
many pairs went in and how many came out:

* misaligned files (different line counts) raise `CorpusError` naming both
  files and both counts;
* pairs with an empty or whitespace-only side are dropped (``summary.empty``);
* invalid UTF-8 raises `CorpusError` with the file and line number, or with
  ``errors="replace"`` becomes U+FFFD (``summary.replaced`` counts the lines);
* pairs longer than a maximum length (in tokens, see `limit_length`) are
  dropped for training (``summary.too_long``) or cut for inference
  (``summary.truncated``).
"""

import dataclasses
import os
import typing
from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from keras_transformer.data import textfile
from keras_transformer.data.stream import CorpusError

LENGTH_MODES = ("filter", "truncate")
__all__ = ["CorpusError", "CorpusSummary", "read_lines", "read_parallel_corpus", "summarize_texts", "limit_length"]


@dataclasses.dataclass(frozen=True)
class CorpusSummary:
    """What happened to the sentence pairs of one parallel corpus on their way to batches.

    ``kept == lines - empty - too_long - replica_remainder``: every pair read
    is either kept or counted in exactly one of the drop reasons. ``replaced`` and ``truncated``
    count pairs that were kept but changed.

    Example:

    >>> summary = CorpusSummary("train.en", "train.de", lines=10, empty=1, too_long=2, max_length=100)
    >>> summary.kept, summary.dropped
    (7, 3)
    >>> print(summary)
    train.en / train.de: 10 pairs read, 7 kept; dropped 1 empty, 2 over max length 100
    """

    source_file: str  # where the source sentences came from ("<memory>" for in-memory lists)
    target_file: str  # where the target sentences came from
    lines: int = 0  # sentence pairs read (lines per file)
    empty: int = 0  # pairs dropped because a side is empty or whitespace-only
    replaced: int = 0  # pairs kept with invalid UTF-8 bytes replaced by U+FFFD (errors="replace")
    too_long: int = 0  # pairs dropped because a side is over max_length (training)
    truncated: int = 0  # pairs kept with a side cut to max_length (inference)
    max_length: typing.Optional[int] = None  # the length limit applied, in positions (None: no limit)
    replica_remainder: int = 0  # pairs skipped each epoch: a bucket's last batch had fewer pairs than replicas

    @property
    def kept(self) -> int:
        """Pairs that reach the batches."""
        return self.lines - self.empty - self.too_long - self.replica_remainder

    @property
    def dropped(self) -> int:
        """Pairs removed for any reason."""
        return self.empty + self.too_long + self.replica_remainder

    def __str__(self) -> str:
        parts = []
        if self.empty:
            parts.append(f"{self.empty} empty")
        if self.too_long:
            parts.append(f"{self.too_long} over max length {self.max_length}")
        if self.replica_remainder:
            parts.append(f"{self.replica_remainder} per epoch in batches smaller than the replica count")
        text = f"{self.source_file} / {self.target_file}: {self.lines} pairs read, {self.kept} kept"
        if parts:
            text += "; dropped " + ", ".join(parts)
        if self.truncated:
            text += f"; truncated {self.truncated} to max length {self.max_length}"
        if self.replaced:
            text += f"; replaced invalid UTF-8 in {self.replaced}"
        return text


def read_lines(path: str | os.PathLike[str], errors: str = "strict") -> tuple[list[str], set[int]]:
    """Reads a UTF-8 text file (plain or gzip) into a list of lines without their line ends.

    Args:
        path: file to read; gzip is detected from the file's first bytes.
        errors: ``"strict"`` raises `CorpusError` naming the file, line number
            and byte offset of the first invalid UTF-8 sequence; ``"replace"``
            replaces invalid bytes with U+FFFD.

    Returns:
        ``(lines, replaced)``: the lines (a leading UTF-8 byte-order mark is
        removed) and the set of 0-based indices of the lines in which bytes
        were replaced.

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_bytes(b"one\\r\\ntwo\\xff\\n")
    >>> read_lines(path, errors="replace")
    (['one', 'two\\ufffd'], {1})
    """
    try:
        return textfile.read_file(path, errors)
    except textfile.InvalidUTF8Error as error:
        raise CorpusError(f"{error}; fix the file or read it with errors='replace' to replace bad bytes with "
                          "U+FFFD.") from None


def read_parallel_corpus(source_file: str | os.PathLike[str], target_file: str | os.PathLike[str],
                         errors: str = "strict") -> tuple[list[str], list[str], CorpusSummary]:
    """Reads two aligned files into lists of sentence pairs, dropping pairs with an empty side.

    Args:
        source_file: source-language file, one sentence per line (plain or .gz UTF-8).
        target_file: target-language file, line N translating line N of `source_file`.
        errors: ``"strict"`` (invalid UTF-8 raises `CorpusError` with file and
            line) or ``"replace"`` (bad bytes become U+FFFD and are counted).

    Returns:
        ``(sources, targets, summary)``: two equally long lists of strings and
        a `CorpusSummary` with ``lines``, ``empty`` and ``replaced`` filled in.

    Raises:
        CorpusError: the files have different line counts (both files and both
            counts are named) or contain invalid UTF-8 in strict mode.
        FileNotFoundError: a file does not exist.

    Example:

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.en").write_text("Hello.\\n \\nA dog.\\n", encoding="utf-8")
    >>> _ = (folder / "a.de").write_text("Hallo.\\nLeer.\\nEin Hund.\\n", encoding="utf-8")
    >>> sources, targets, summary = read_parallel_corpus(folder / "a.en", folder / "a.de")
    >>> sources, targets, summary.lines, summary.empty
    (['Hello.', 'A dog.'], ['Hallo.', 'Ein Hund.'], 3, 1)
    """
    source_lines, source_replaced = read_lines(source_file, errors)
    target_lines, target_replaced = read_lines(target_file, errors)
    if len(source_lines) != len(target_lines):
        raise CorpusError(
            f"Misaligned parallel corpus: {os.fspath(source_file)} has {len(source_lines)} lines but "
            f"{os.fspath(target_file)} has {len(target_lines)}; line N of one file must translate line N "
            "of the other.")
    sources, targets, replaced = [], [], 0
    for index, (source, target) in enumerate(zip(source_lines, target_lines)):
        if not source.strip() or not target.strip():
            continue
        sources.append(source)
        targets.append(target)
        replaced += index in source_replaced or index in target_replaced
    summary = CorpusSummary(os.fspath(source_file), os.fspath(target_file), lines=len(source_lines),
                            empty=len(source_lines) - len(sources), replaced=int(replaced))
    return sources, targets, summary


def summarize_texts(sources: Iterable[str], targets: Iterable[str]) -> tuple[list[str], list[str], CorpusSummary]:
    """Drops pairs with an empty side from in-memory sentence lists, like `read_parallel_corpus`.

    Args:
        sources: list of source sentences.
        targets: list of target sentences, aligned with `sources`.

    Returns:
        ``(sources, targets, summary)`` as `read_parallel_corpus` returns them
        (the summary names the files ``"<memory>"``).

    Example:

    >>> summarize_texts(["a", " "], ["b", "c"])[2].empty
    1
    """
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise CorpusError(f"Misaligned parallel corpus: {len(sources)} source sentences but "
                          f"{len(targets)} target sentences.")
    kept = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()]
    summary = CorpusSummary("<memory>", "<memory>", lines=len(sources), empty=len(sources) - len(kept))
    return [s for s, _ in kept], [t for _, t in kept], summary


def limit_length(source_ids: Any, target_ids: Any, max_length: int | None, mode: str,
                 summary: CorpusSummary | None = None) -> tuple[Any, Any, CorpusSummary]:
    """Filters or truncates token sequences longer than `max_length - 1` tokens.

    `max_length` counts model positions: the pipeline adds one token to every
    side (source + eos, bos + target), so a side may hold at most
    ``max_length - 1`` subword tokens.

    Args:
        source_ids: `tf.RaggedTensor` of source token ids, ``[N, None]``.
        target_ids: `tf.RaggedTensor` of target token ids, ``[N, None]``.
        max_length: longest sequence the model sees (positions), or None for no limit.
        mode: ``"filter"`` drops pairs with an over-long side (training);
            ``"truncate"`` cuts over-long sides and keeps every pair (inference).
        summary: a `CorpusSummary` to update; None starts an empty one.

    Returns:
        ``(source_ids, target_ids, summary)`` with ``too_long`` or
        ``truncated`` and ``max_length`` set on the summary.

    Example:

    >>> import tensorflow as tf

from keras_transformer.data import textfile
    >>> src = tf.ragged.constant([[5, 6, 7], [5]])
    >>> tgt = tf.ragged.constant([[8], [9, 9]])
    >>> src, tgt, summary = limit_length(src, tgt, max_length=3, mode="filter")
    >>> src.to_list(), summary.too_long
    ([[5]], 1)
    """
    if mode not in LENGTH_MODES:
        raise ValueError(f"mode must be one of {LENGTH_MODES}, got {mode!r}.")
    if summary is None:
        rows = int(source_ids.nrows())
        summary = CorpusSummary("<memory>", "<memory>", lines=rows)
    if max_length is None:
        return source_ids, target_ids, summary
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 (one token plus bos/eos), got {max_length}.")
    limit = max_length - 1
    source_lengths = source_ids.row_lengths()
    target_lengths = target_ids.row_lengths()
    over = tf.logical_or(source_lengths > limit, target_lengths > limit)
    count = int(tf.reduce_sum(tf.cast(over, tf.int32)))
    if mode == "filter":
        keep = tf.logical_not(over)
        source_ids = tf.ragged.boolean_mask(source_ids, keep)
        target_ids = tf.ragged.boolean_mask(target_ids, keep)
        summary = dataclasses.replace(summary, too_long=summary.too_long + count, max_length=max_length)
    else:
        source_ids = source_ids[:, :limit]
        target_ids = target_ids[:, :limit]
        summary = dataclasses.replace(summary, truncated=summary.truncated + count, max_length=max_length)
    return source_ids, target_ids, summary
