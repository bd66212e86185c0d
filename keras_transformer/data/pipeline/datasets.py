"""The pipeline's entry points: token-budget datasets of files (`make_dataset`), of a `DataConfig`
(`make_datasets`, `make_stream`) and of sentences in memory; the tokenizers of a `DataConfig`; statistics of
batches; the corpus error a tf.data error carries."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from keras_transformer.data import stream as streams
from keras_transformer.data import tokenizers
from keras_transformer.data.pipeline.text_stream import DEFAULT_WINDOW, TextStream
from keras_transformer.data.tokenizers import PAD_ID

if TYPE_CHECKING:
    from keras_transformer.data.pipeline.text_stream import CorpusTally
    from keras_transformer.data.tokenizers.pairs import Tokenizer
    from keras_transformer.experiment import DataConfig

logger = logging.getLogger("keras_transformer.data.pipeline")

_TOKENIZE_CHUNK = 16384  # sentences per tokenizer call when tokenizing a corpus


@dataclasses.dataclass(frozen=True)
class BatchStatistics:
    """Sizes and padding of the batches of a dataset (see `batch_statistics`).

    Example:

    >>> stats = BatchStatistics(batches=1, sentences=2, source_tokens=6, target_tokens=5,
    ...                         source_positions=8, target_positions=6, max_source_positions=8,
    ...                         max_target_positions=6)
    >>> round(stats.padding_fraction, 3)
    0.214
    """

    batches: int  # number of batches
    sentences: int  # sentence pairs in all batches
    source_tokens: int  # non-pad source ids (eos included)
    target_tokens: int  # non-pad target ids (bos included)
    source_positions: int  # B * S summed over batches (padding included)
    target_positions: int  # B * T summed over batches
    max_source_positions: int  # largest B * S of one batch
    max_target_positions: int  # largest B * T of one batch

    @property
    def padding_fraction(self) -> float:
        """Share of all source and target positions that are padding."""
        positions = self.source_positions + self.target_positions
        return 1.0 - (self.source_tokens + self.target_tokens) / positions if positions else 0.0


def _corpora(source_file: Any, target_file: Any, name: str = "train") -> list[streams.Corpus]:
    return [streams.Corpus(name, source_file, target_file)]


def make_dataset(source_file: str | os.PathLike[str] | None, target_file: str | os.PathLike[str] | None,
                 source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, *, tokens_per_batch: int = 4096,
                 max_length: int | None = 128, training: bool = True, bucket_width: int = 1,
                 window: int = DEFAULT_WINDOW, cache: bool = True, num_replicas: int | None = None,
                 errors: str = "strict", seed: int | None = None, subword_dropout: float = 0.0,
                 subword_dropout_sides: str = "both", corpora: Sequence[streams.Corpus] | None = None,
                 shard: Sequence[int] = (1, 0), endless: bool = False) -> tuple[Any, CorpusTally]:
    """Streams a parallel corpus (or several) and returns its token-budget batches for `model.fit`.

    Args:
        source_file: source-language file, one sentence per line (plain or .gz UTF-8).
        target_file: target-language file, line-aligned with `source_file`.
        source_tokenizer: `SubwordTokenizer` for the source side.
        target_tokenizer: `SubwordTokenizer` for the target side (may be the same object).
        tokens_per_batch: global budget per batch: at most this many source
            positions ``B * S`` and this many target positions ``B * T``,
            padding included (see the module docstring for tf.distribute).
        max_length: longest sequence in positions (tokens + eos / bos + tokens),
            at most `TransformerConfig.max_length`; None for no limit.
        training: True drops over-long pairs and shuffles; False truncates
            over-long sides and keeps a fixed order (sorted by length in each window).
        bucket_width: lengths sorted as one (pairs of a bucket are mixed at
            random in training); 1 gives the least padding.
        window: lines read, tokenized, sorted and batched together (the memory held).
        cache: keep the padded batches of an inference dataset in memory
            (training batches are formed anew each epoch).
        num_replicas: replicas sharing each batch; None reads the strategy in scope.
        errors: invalid UTF-8 handling, ``"strict"`` or ``"replace"``.
        seed: shuffle seed (None: different each run).
        subword_dropout: BPE-dropout of training batches (`SubwordTokenizer.sample`):
            every pass segments the pairs anew with each merge skipped with this
            probability. 0, and inference, segment deterministically.
        subword_dropout_sides: the sides sampled, ``"both"``, ``"source"`` or
            ``"target"``; the others keep their deterministic segmentation.
        corpora: instead of the two files, a list of `stream.Corpus` mixed by weight (endless).
        shard: ``(workers, index)``: read only this worker's lines.
        endless: one corpus read pass after pass without end (an epoch: `training.steps_per_epoch`).

    Returns:
        ``(dataset, tally)``: a `tf.data.Dataset` of
        ``({"source": int32 [B, S], "target": int32 [B, T]}, labels int32 [B, T])``
        with source = tokens + eos, target = bos + tokens, labels = tokens + eos,
        padded with 0 (`language_last` tokenizers, mBART-large-cc25's: source =
        tokens + eos + source language, target = target language + tokens,
        labels = tokens + eos, their own eos and pad ids); and the `CorpusTally` of what was read and dropped, whose
        counts are the pass's once the pass has ended (also logged at INFO then).

    Example:

    >>> import pathlib, tempfile
    >>> from keras_transformer.data.tokenizers import SubwordTokenizer
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.en").write_text("A dog runs.\\nA man sits.\\n" * 8, encoding="utf-8")
    >>> _ = (folder / "a.de").write_text("Ein Hund läuft.\\nEin Mann sitzt.\\n" * 8, encoding="utf-8")
    >>> tok = SubwordTokenizer.train_from_files([folder / "a.en", folder / "a.de"], vocab_size=290)
    >>> ds, summary = make_dataset(folder / "a.en", folder / "a.de", tok, tok, tokens_per_batch=64, max_length=32)
    >>> batches = list(ds)
    >>> inputs, labels = batches[0]
    >>> sorted(inputs), labels.dtype.name, summary.kept
    (['source', 'target'], 'int32', 16)
    """
    text = TextStream(corpora or _corpora(source_file, target_file), source_tokenizer, target_tokenizer,
                      tokens_per_batch=tokens_per_batch, max_length=max_length, training=training,
                      bucket_width=bucket_width, window=window, num_replicas=num_replicas, errors=errors, seed=seed,
                      subword_dropout=subword_dropout, subword_dropout_sides=subword_dropout_sides, shard=shard,
                      endless=endless)
    dataset = text.dataset()
    if cache and not training:  # inference batches are the same every pass; training ones change each epoch
        dataset = dataset.cache()
    return dataset, text.tally


def make_stream(config: DataConfig, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer,
                num_replicas: int | None = None, shard: Sequence[int] = (1, 0), endless: bool = False,
                start: Mapping[str, Any] | None = None) -> TextStream:
    """The `TextStream` of a `DataConfig`'s training corpora (`DataConfig.training_corpora`).

    Args:
        config: a `DataConfig`.
        source_tokenizer, target_tokenizer: `SubwordTokenizer`s.
        num_replicas: replicas sharing each batch; None reads the strategy in scope.
        shard: ``(workers, index)`` of this worker.
        endless: pass after pass without end (`training.steps_per_epoch`).
        start: a backup's stream position (`StreamCursor.position`), or None to start at the beginning.

    Returns:
        A `TextStream`.

    Example:

    >>> import pathlib, tempfile
    >>> from keras_transformer.experiment import DataConfig
    >>> from keras_transformer.data.tokenizers import SubwordTokenizer
    >>> tok = SubwordTokenizer.train(["a cat", "eine Katze"] * 10, vocab_size=270)
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.en").write_text("a cat\\n" * 8, encoding="utf-8")
    >>> _ = (folder / "a.de").write_text("eine Katze\\n" * 8, encoding="utf-8")
    >>> config = DataConfig(corpora=[{"name": "a", "source": str(folder / "a.en"), "target": str(folder / "a.de")}])
    >>> make_stream(config, tok, tok, num_replicas=1).corpora[0].name
    'a'
    """
    position = streams.Position.from_dict(start) if start else streams.Position()
    return TextStream([streams.Corpus(**corpus) for corpus in config.training_corpora()], source_tokenizer,
                      target_tokenizer, tokens_per_batch=config.tokens_per_batch, max_length=config.max_length,
                      training=True, bucket_width=config.bucket_width, window=config.window,
                      num_replicas=num_replicas, errors=config.errors, seed=config.seed,
                      subword_dropout=config.subword_dropout, subword_dropout_sides=config.subword_dropout_sides,
                      shard=shard, endless=endless, start=position, start_batch=int((start or {}).get("batch", 0)))


def make_dataset_from_texts(sources: Iterable[str], targets: Iterable[str], source_tokenizer: Tokenizer,
                            target_tokenizer: Tokenizer, **options: Any) -> tuple[Any, CorpusTally]:
    """`make_dataset` for sentence pairs already in memory (e.g. from TensorFlow Datasets).

    Args:
        sources: list of source sentences.
        targets: list of target sentences, aligned with `sources`.
        source_tokenizer: `SubwordTokenizer` for the source side.
        target_tokenizer: `SubwordTokenizer` for the target side.
        **options: the keyword arguments of `make_dataset` except ``errors``.

    Returns:
        ``(dataset, tally)`` as `make_dataset`.

    Example:

    >>> from keras_transformer.data.tokenizers import SubwordTokenizer
    >>> tok = SubwordTokenizer.train(["a cat", "eine Katze"] * 10, vocab_size=270)
    >>> ds, summary = make_dataset_from_texts(["a cat", ""], ["eine Katze", "leer"], tok, tok, tokens_per_batch=64)
    >>> _ = list(ds)
    >>> summary.kept, summary.empty
    (1, 1)
    """
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise streams.CorpusError(f"Misaligned parallel corpus: {len(sources)} source sentences but "
                                  f"{len(targets)} target sentences.")
    return make_dataset(None, None, source_tokenizer, target_tokenizer,
                        corpora=[streams.Corpus("memory", sources, targets)], **options)


def make_datasets(config: DataConfig, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer,
                  num_replicas: int | None = None) -> tuple[Any, CorpusTally, Any, CorpusTally | None]:
    """The training and validation datasets a `DataConfig` describes.

    Args:
        config: a `DataConfig` with ``train_source``/``train_target`` or ``corpora`` set.
        source_tokenizer: `SubwordTokenizer` for the source side.
        target_tokenizer: `SubwordTokenizer` for the target side.
        num_replicas: replicas sharing each batch; None reads the strategy in scope.

    Returns:
        ``(train_dataset, train_tally, valid_dataset, valid_tally)``; the
        validation pair is ``(None, None)`` when the config has no validation files.

    Example:

    >>> import pathlib, tempfile
    >>> from keras_transformer.experiment import DataConfig
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.en").write_text("A dog runs.\\n" * 8, encoding="utf-8")
    >>> _ = (folder / "a.de").write_text("Ein Hund läuft.\\n" * 8, encoding="utf-8")
    >>> config = DataConfig(train_source=str(folder / "a.en"), train_target=str(folder / "a.de"),
    ...                     vocab_size=280, tokens_per_batch=256)
    >>> src_tok, tgt_tok = load_or_train_tokenizers(config, folder / "tokenizer")
    >>> train, summary, valid, _ = make_datasets(config, src_tok, tgt_tok)
    >>> _ = list(train)
    >>> summary.kept, valid is None
    (8, True)
    """
    if not config.training_corpora():
        raise ValueError("DataConfig.train_source and train_target (or corpora) are needed to build the training "
                         "data.")
    text = make_stream(config, source_tokenizer, target_tokenizer, num_replicas=num_replicas)
    valid = valid_summary = None
    if config.valid_source is not None:
        valid, valid_summary = make_dataset(config.valid_source, config.valid_target, source_tokenizer,
                                            target_tokenizer, training=False, tokens_per_batch=config.tokens_per_batch,
                                            max_length=config.max_length, bucket_width=config.bucket_width,
                                            window=config.window, cache=config.cache, num_replicas=num_replicas,
                                            errors=config.errors)
    return text.dataset(), text.tally, valid, valid_summary


def load_or_train_tokenizers(config: DataConfig,
                             directory: str | os.PathLike[str] | None = None) -> tuple[Tokenizer, Tokenizer]:
    """Loads the tokenizers of a `DataConfig`, learning and saving them from its training files if absent.

    Args:
        config: a `DataConfig`.
        directory: where the tokenizers live; defaults to ``config.tokenizer_dir``.

    Returns:
        ``(source_tokenizer, target_tokenizer)`` (one object twice when shared).

    Example:

    >>> import pathlib, tempfile
    >>> from keras_transformer.experiment import DataConfig
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.en").write_text("A dog runs.\\n" * 8, encoding="utf-8")
    >>> _ = (folder / "a.de").write_text("Ein Hund läuft.\\n" * 8, encoding="utf-8")
    >>> config = DataConfig(train_source=str(folder / "a.en"), train_target=str(folder / "a.de"), vocab_size=280)
    >>> src, tgt = load_or_train_tokenizers(config, folder / "tokenizer")   # learns and saves
    >>> src, tgt = load_or_train_tokenizers(config, folder / "tokenizer")   # loads
    >>> src.vocab_size
    280
    """
    directory = directory if directory is not None else config.tokenizer_dir
    if directory is None:
        raise ValueError("No tokenizer directory: set DataConfig.tokenizer_dir or pass directory.")
    directory = os.fspath(directory)
    if os.path.isfile(os.path.join(directory, tokenizers.CONFIG_FILE)) or os.path.isdir(
            os.path.join(directory, "source")):
        return tokenizers.load_tokenizers(directory)
    training_corpora = config.training_corpora()
    if not training_corpora:
        raise FileNotFoundError(f"No tokenizers at {directory} and no DataConfig.train_source to learn them from.")
    logger.info("Learning a %s %s vocabulary of %d from %s into %s",
                "shared" if config.shared_vocab else "separate", config.model_type, config.vocab_size,
                ", ".join(f"{item['source']} and {item['target']}" for item in training_corpora), directory)
    return tokenizers.train_tokenizers_from_files(
        [item["source"] for item in training_corpora], [item["target"] for item in training_corpora],
        config.vocab_size, shared=config.shared_vocab, directory=directory, sample_size=config.vocab_sample_size,
        seed=config.seed or 0, errors=config.errors, max_lines=[item["max_pairs"] for item in training_corpora],
        model_type=config.model_type, lowercase=config.lowercase)


def batch_statistics(dataset: Any, pad_id: int = PAD_ID) -> BatchStatistics:
    """Counts sentences, tokens and padding over one pass of a batched dataset.

    Args:
        dataset: yields ``({"source": [B, S], "target": [B, T]}, labels)``.
        pad_id: the padding id (an imported model's own, e.g. 1 for fairseq's numbering).

    Returns:
        a `BatchStatistics`.

    Example:

    >>> import numpy as np
    >>> inputs = {"source": np.array([[5, 3, 0], [5, 6, 3]]), "target": np.array([[2, 5], [2, 6]])}
    >>> ds = tf.data.Dataset.from_tensors((inputs, np.array([[5, 3], [6, 3]])))
    >>> stats = batch_statistics(ds)
    >>> stats.sentences, stats.source_tokens, stats.source_positions
    (2, 5, 6)
    """
    counts = dict(batches=0, sentences=0, source_tokens=0, target_tokens=0, source_positions=0,
                  target_positions=0, max_source_positions=0, max_target_positions=0)
    for inputs, _ in dataset.as_numpy_iterator():
        source, target = inputs["source"], inputs["target"]
        counts["batches"] += 1
        counts["sentences"] += source.shape[0]
        counts["source_tokens"] += int(np.count_nonzero(source != pad_id))
        counts["target_tokens"] += int(np.count_nonzero(target != pad_id))
        counts["source_positions"] += source.size
        counts["target_positions"] += target.size
        counts["max_source_positions"] = max(counts["max_source_positions"], source.size)
        counts["max_target_positions"] = max(counts["max_target_positions"], target.size)
    return BatchStatistics(**counts)


def stream_error(error: BaseException) -> streams.CorpusError | None:
    """The `stream.CorpusError` a tf.data error carries from the stream's reader (bad input met while training
    reads it), or None for any other error.

    Example:

    >>> stream_error(tf.errors.InvalidArgumentError(None, None, "CorpusError: a.en:3: invalid UTF-8\\nTraceback"))
    CorpusError('a.en:3: invalid UTF-8')
    >>> stream_error(ValueError("other")) is None
    True
    """
    if not isinstance(error, tf.errors.OpError):
        return None
    match = re.search(r"CorpusError: (.*?)(?:\\n|\n|$)", error.message)
    return streams.CorpusError(match.group(1)) if match else None


def tokenize_corpus(tokenizer: Tokenizer, texts: Sequence[str]) -> Any:
    """Tokenizes a list of sentences in large batched calls; returns an int32 RaggedTensor [N, None]."""
    chunks = [tokenizer.tokenize(tf.constant(texts[start:start + _TOKENIZE_CHUNK], dtype=tf.string))
              for start in range(0, len(texts), _TOKENIZE_CHUNK)]
    return tf.concat(chunks, axis=0) if len(chunks) > 1 else chunks[0]
