"""The source and target tokenizers of a run, learned together (one shared vocabulary, or two), saved and
loaded as a pair."""

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias, cast

from keras_transformer.data.tokenizers.mapped import MappedTokenizer, is_mapped_tokenizer
from keras_transformer.data.tokenizers.sampling import check_text_files, reservoir_sample, sample_files
from keras_transformer.data.tokenizers.subword import CONFIG_FILE, SubwordTokenizer, sentence_list

log = logging.getLogger("keras_transformer.data.tokenizers")

# What `load_tokenizer` gives: a vocabulary learned here, or an imported one.
Tokenizer: TypeAlias = "SubwordTokenizer | MappedTokenizer"


def train_tokenizers(source_texts: Any, target_texts: Any, vocab_size: int | tuple[int, int], shared: bool = True,
                     directory: str | os.PathLike[str] | None = None, sample_size: int | None = None, seed: int = 0,
                     **options: Any) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """Learns the source and target tokenizers from sentences in memory, shared (one vocabulary) or separate.

    `train_tokenizers_from_files` learns them from files.

    Args:
        source_texts: source training sentences (a list of str or a
            `tf.data.Dataset` of strings; see `SubwordTokenizer.train`).
        target_texts: target training sentences.
        vocab_size: size of the shared vocabulary, or with ``shared=False`` an
            int for both or a pair ``(source_size, target_size)``.
        shared: learn one vocabulary from both sides (the default, needed for
            ``TransformerConfig.tie_embeddings="all"``).
        directory: if given, the tokenizers are saved there with `save_tokenizers`.
        sample_size: learn each vocabulary from at most this many sentences, drawn uniformly
            (`reservoir_sample`; a shared one takes half from each side); None: every sentence.
        seed: the seed of that draw.
        **options: passed to `SubwordTokenizer.train` (``model_type``, ``lowercase``, ...).

    Returns:
        ``(source_tokenizer, target_tokenizer)``; the same object twice when shared.

    Raises:
        TypeError: a side is one str, or holds something other than str (a path: use
            `train_tokenizers_from_files`).
        ValueError: as for `SubwordTokenizer.train`.

    Example:

    >>> src, tgt = train_tokenizers(["A dog runs."] * 10, ["Ein Hund läuft."] * 10, vocab_size=280)
    >>> src is tgt
    True
    """
    hint = "train_tokenizers_from_files"
    sides = [sentence_list(texts, hint) for texts in (source_texts, target_texts)]
    return _train_pair(lambda side, size: reservoir_sample(sides[side], size, (seed, side)), vocab_size, shared,
                       directory, sample_size, options)


def train_tokenizers_from_files(source_files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
                                target_files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
                                vocab_size: int | tuple[int, int],
                                shared: bool = True, directory: str | os.PathLike[str] | None = None,
                                sample_size: int | None = None, seed: int = 0, errors: str = "strict",
                                max_lines: int | list[int | None] | tuple[int | None, ...] | None = None,
                                **options: Any) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """Learns the source and target tokenizers from text files, shared (one vocabulary) or separate.

    The files are streamed: with a `sample_size`, what is held in memory and
    learned from is the sample, never the corpus. A log line gives the
    sentences drawn and the seconds the draw took, another the seconds learning took.

    Args:
        source_files: one path or a list of paths of source text (plain or gzip
            UTF-8, one sentence per line).
        target_files: the same for the target side.
        vocab_size: as for `train_tokenizers`.
        shared: as for `train_tokenizers`.
        directory: if given, the tokenizers are saved there with `save_tokenizers`.
        sample_size: learn each vocabulary from at most this many sentences, drawn uniformly
            from a side's files in one pass (`reservoir_sample`); a shared vocabulary takes
            half of them from each side. None: every sentence.
        seed: the seed of that draw (the same seed draws the same sentences).
        errors: invalid UTF-8: ``"strict"`` fails naming the file and line, ``"replace"`` uses U+FFFD.
        max_lines: read only the first lines of each file: one count for every file, or a list of counts (or
            None) in the order of a side's files; None reads them whole.
        **options: passed to `SubwordTokenizer.train` (``model_type``, ``lowercase``, ...).

    Returns:
        ``(source_tokenizer, target_tokenizer)``; the same object twice when shared.

    Raises:
        FileNotFoundError: a file of either side does not exist (the message
            names it); every file is checked before any is read.
        keras_transformer.data.corpus.CorpusError: invalid UTF-8 (``errors="strict"``), named by file and line.

    Example:

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "train.en").write_text("A dog runs.\\n" * 10, encoding="utf-8")
    >>> _ = (folder / "train.de").write_text("Ein Hund läuft.\\n" * 10, encoding="utf-8")
    >>> src, tgt = train_tokenizers_from_files(folder / "train.en", folder / "train.de", vocab_size=280)
    >>> src.vocab_size, src is tgt
    (280, True)
    """
    check_text_files(source_files)
    check_text_files(target_files)
    sides = (source_files, target_files)
    return _train_pair(lambda side, size: sample_files(sides[side], size, (seed, side), errors, max_lines),
                       vocab_size, shared, directory, sample_size, options)


def _train_pair(draw: Callable[[int, int | None], tuple[list[str], int]], vocab_size: int | tuple[int, int],
                shared: bool, directory: str | os.PathLike[str] | None, sample_size: int | None,
                options: dict[str, Any]) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """Learns the pair from the sentences `draw(side, size)` returns (`(sample, count)`, side 0 or 1)."""
    if shared and not isinstance(vocab_size, int):
        raise ValueError(f"A shared vocabulary has one size, got vocab_size={vocab_size!r}.")
    sizes: list[int | None] = [None, None]
    if sample_size is not None:
        sizes = [sample_size - sample_size // 2, sample_size // 2] if shared else [sample_size, sample_size]
    start = time.perf_counter()
    (sources, source_count), (targets, target_count) = draw(0, sizes[0]), draw(1, sizes[1])
    log.info("Vocabulary sample: %d of %d source and %d of %d target sentences, drawn in %.1f s", len(sources),
             source_count, len(targets), target_count, time.perf_counter() - start)
    start = time.perf_counter()
    if shared:
        source = target = SubwordTokenizer.learn(sources + targets, cast(int, vocab_size), **options)  # checked above
    else:
        source_size, target_size = (vocab_size, vocab_size) if isinstance(vocab_size, int) else vocab_size
        source = SubwordTokenizer.learn(sources, source_size, **options)
        target = SubwordTokenizer.learn(targets, target_size, **options)
    log.info("Vocabulary of %d learned from %d sentences in %.1f s", source.vocab_size, len(sources) + len(targets),
             time.perf_counter() - start)
    if directory is not None:
        save_tokenizers(directory, source, target)
    return source, target


def save_tokenizers(directory: str | os.PathLike[str], source_tokenizer: Tokenizer,
                    target_tokenizer: Tokenizer) -> list[str]:
    """Saves a tokenizer pair: a shared one into `directory`, separate ones into ``source/`` and ``target/``.

    Args:
        directory: folder to write (created if needed), e.g. ``<run>/tokenizer``.
        source_tokenizer: the source `SubwordTokenizer`.
        target_tokenizer: the target `SubwordTokenizer` (the same object when shared).

    Returns:
        The list of paths written.

    Example:

    >>> import tempfile
    >>> tok = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270)
    >>> folder = tempfile.mkdtemp()
    >>> _ = save_tokenizers(folder, tok, tok)
    >>> src, tgt = load_tokenizers(folder)
    >>> src is tgt
    True
    """
    directory = os.fspath(directory)
    if source_tokenizer is target_tokenizer:
        return source_tokenizer.save(directory)
    return (source_tokenizer.save(os.path.join(directory, "source"))
            + target_tokenizer.save(os.path.join(directory, "target")))


def load_tokenizers(directory: str | os.PathLike[str]) -> tuple[Tokenizer, Tokenizer]:
    """Loads the tokenizer pair `save_tokenizers` wrote, shared or separate.

    Args:
        directory: the folder given to `save_tokenizers`.

    Returns:
        ``(source_tokenizer, target_tokenizer)``; the same object twice when shared.

    Raises:
        FileNotFoundError: the folder holds neither layout (the message says what was expected).

    Example:

    >>> import tempfile
    >>> load_tokenizers(tempfile.mkdtemp())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    FileNotFoundError: No tokenizers at ...
    """
    directory = os.fspath(directory)
    if os.path.isfile(os.path.join(directory, CONFIG_FILE)):
        tokenizer = load_tokenizer(directory)
        return tokenizer, tokenizer
    source_dir, target_dir = os.path.join(directory, "source"), os.path.join(directory, "target")
    if os.path.isdir(source_dir) or os.path.isdir(target_dir):
        return load_tokenizer(source_dir), load_tokenizer(target_dir)
    found = sorted(os.listdir(directory)) if os.path.isdir(directory) else None
    raise FileNotFoundError(
        f"No tokenizers at {directory}: expected {CONFIG_FILE} (shared vocabulary) or source/ and target/ "
        f"folders, found {found if found is not None else 'no such folder'}. Learn them with "
        "train_tokenizers(..., directory=...).")


def load_tokenizer(directory: str | os.PathLike[str]) -> Tokenizer:
    """The one tokenizer `directory` holds: a `MappedTokenizer` (an imported vocabulary) where its tokenizer.json
    says so, else a `SubwordTokenizer`.

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270).save(folder)
    >>> type(load_tokenizer(folder)).__name__
    'SubwordTokenizer'
    """
    if is_mapped_tokenizer(directory):
        return MappedTokenizer.load(directory)
    return SubwordTokenizer.load(directory)
