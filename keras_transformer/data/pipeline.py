"""The tf.data pipeline: parallel text files in, token-budget batches out.

Steps, in order:

1. read the files (`corpus.read_parallel_corpus`: alignment, empty pairs, UTF-8);
2. tokenize both sides in a few large batched calls of the tensorflow-text
   tokenizers, so lengths are known before any batch is built;
3. drop (training) or cut (inference) pairs longer than ``max_length``
   positions (`corpus.limit_length`), counted in the `CorpusSummary`;
4. sort the pairs by length (the longer side, in buckets ``bucket_width``
   wide; 1 is the exact length) and cut the sorted corpus into consecutive
   batches by a token budget (`batch_plan`): a batch takes pairs while
   ``pairs x L <= tokens_per_batch``, ``L`` its longest length, so every batch
   holds at most ``tokens_per_batch`` source and at most ``tokens_per_batch``
   target positions, padding included, and every batch but the epoch's last is
   full: a length's last pairs share a batch with the next length's first;
5. in training, shuffle the pairs before the sort (so which pairs of one length
   share a batch changes every epoch) and shuffle the order of the batches;
6. lay each batch out as ``({"source": tokens + eos, "target": bos + tokens},
   labels = tokens + eos)``, padded with 0, and prefetch.

With ``subword_dropout`` > 0 (BPE-dropout), training re-segments the pairs at
random for every pass over the corpus and plans that pass's batches anew
(`_sampled_epochs`; docs/data.md, "BPE-dropout").

Token budget and tf.distribute: ``tokens_per_batch`` is the GLOBAL budget of
one training step, as in the paper (about 25,000 source + 25,000 target tokens
per step over 8 GPUs). ``model.fit`` under a strategy splits every batch
across the ``R`` replicas, so each replica sees about ``tokens_per_batch / R``
tokens. To give every replica data, batch sizes are multiples of ``R`` and the
fewer than ``R`` longest pairs left at the end of the sorted corpus are
skipped (counted in ``summary.replica_remainder``). ``R`` is read from
the strategy in scope when the dataset is built, or given as ``num_replicas``.
To keep the per-replica batch of a single-device run, multiply
``tokens_per_batch`` by ``R``.

The tokenized corpus is held in memory (for Multi30k a few MB; for WMT14
En-De about 1 GB), which is what makes exact filter counts and token budgets
possible before the first batch.
"""

import dataclasses
import logging
import os

import numpy as np
import tensorflow as tf

from keras_transformer.data import corpus, tokenizers
from keras_transformer.data.batching import batch_plan
from keras_transformer.experiment import SUBWORD_DROPOUT_SIDES

logger = logging.getLogger(__name__)

PAD_ID, BOS_ID, EOS_ID = tokenizers.PAD_ID, tokenizers.BOS_ID, tokenizers.EOS_ID
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


# ---------------------------------------------------------------------- entry points
def make_dataset(source_file, target_file, source_tokenizer, target_tokenizer, *, tokens_per_batch=4096,
                 max_length=128, training=True, bucket_width=1, shuffle_buffer=None, cache=True,
                 num_replicas=None, errors="strict", seed=None, subword_dropout=0.0, subword_dropout_sides="both"):
    """Reads a parallel corpus and returns its token-budget batches for `model.fit`.

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
            over-long sides and keeps a fixed order (sorted by length).
        bucket_width: lengths sorted as one (pairs of a bucket are mixed at
            random in training); 1 gives the least padding.
        shuffle_buffer: shuffle buffer in pairs; None shuffles the whole corpus.
        cache: keep the padded batches of an inference dataset in memory
            (training batches are formed anew each epoch).
        num_replicas: replicas sharing each batch; None reads the strategy in scope.
        errors: invalid UTF-8 handling, ``"strict"`` or ``"replace"``.
        seed: shuffle seed (None: different each run).
        subword_dropout: BPE-dropout of training batches (`SubwordTokenizer.sample`):
            every pass over the pairs segments them anew with each merge skipped
            with this probability; an epoch is the first pass's batch count
            (`_sampled_epochs`). 0, and inference, segment deterministically.
        subword_dropout_sides: the sides sampled, ``"both"``, ``"source"`` or
            ``"target"``; the others keep their deterministic segmentation.

    Returns:
        ``(dataset, summary)``: a `tf.data.Dataset` of
        ``({"source": int32 [B, S], "target": int32 [B, T]}, labels int32 [B, T])``
        with source = tokens + eos, target = bos + tokens, labels = tokens + eos,
        padded with 0; and the `CorpusSummary` of what was read and dropped
        (also logged at INFO).

    Example:

    >>> import pathlib, tempfile
    >>> from keras_transformer.data.tokenizers import SubwordTokenizer
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.en").write_text("A dog runs.\\nA man sits.\\n" * 8, encoding="utf-8")
    >>> _ = (folder / "a.de").write_text("Ein Hund läuft.\\nEin Mann sitzt.\\n" * 8, encoding="utf-8")
    >>> tok = SubwordTokenizer.train_from_files([folder / "a.en", folder / "a.de"], vocab_size=290)
    >>> ds, summary = make_dataset(folder / "a.en", folder / "a.de", tok, tok, tokens_per_batch=64, max_length=32)
    >>> inputs, labels = next(iter(ds))
    >>> sorted(inputs), labels.dtype.name, summary.kept
    (['source', 'target'], 'int32', 16)
    """
    sources, targets, summary = corpus.read_parallel_corpus(source_file, target_file, errors=errors)
    return _make(sources, targets, summary, source_tokenizer, target_tokenizer, tokens_per_batch=tokens_per_batch,
                 max_length=max_length, training=training, bucket_width=bucket_width,
                 shuffle_buffer=shuffle_buffer, cache=cache, num_replicas=num_replicas, seed=seed,
                 subword_dropout=subword_dropout, subword_dropout_sides=subword_dropout_sides)


def make_dataset_from_texts(sources, targets, source_tokenizer, target_tokenizer, **options):
    """`make_dataset` for sentence pairs already in memory (e.g. from TensorFlow Datasets).

    Args:
        sources: list of source sentences.
        targets: list of target sentences, aligned with `sources`.
        source_tokenizer: `SubwordTokenizer` for the source side.
        target_tokenizer: `SubwordTokenizer` for the target side.
        **options: the keyword arguments of `make_dataset` except ``errors``.

    Returns:
        ``(dataset, summary)`` as `make_dataset`.

    Example:

    >>> from keras_transformer.data.tokenizers import SubwordTokenizer
    >>> tok = SubwordTokenizer.train(["a cat", "eine Katze"] * 10, vocab_size=270)
    >>> ds, summary = make_dataset_from_texts(["a cat", ""], ["eine Katze", "leer"], tok, tok, tokens_per_batch=64)
    >>> summary.kept, summary.empty
    (1, 1)
    """
    sources, targets, summary = corpus.summarize_texts(sources, targets)
    return _make(sources, targets, summary, source_tokenizer, target_tokenizer, **options)


def make_datasets(config, source_tokenizer, target_tokenizer, num_replicas=None):
    """The training and validation datasets a `DataConfig` describes.

    Args:
        config: a `DataConfig` with ``train_source``/``train_target`` set.
        source_tokenizer: `SubwordTokenizer` for the source side.
        target_tokenizer: `SubwordTokenizer` for the target side.
        num_replicas: replicas sharing each batch; None reads the strategy in scope.

    Returns:
        ``(train_dataset, train_summary, valid_dataset, valid_summary)``; the
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
    >>> summary.kept, valid is None
    (8, True)
    """
    if config.train_source is None:
        raise ValueError("DataConfig.train_source and train_target are needed to build the training data.")
    options = dict(tokens_per_batch=config.tokens_per_batch, max_length=config.max_length,
                   bucket_width=config.bucket_width, cache=config.cache, num_replicas=num_replicas,
                   errors=config.errors)
    train, train_summary = make_dataset(config.train_source, config.train_target, source_tokenizer,
                                        target_tokenizer, training=True, shuffle_buffer=config.shuffle_buffer,
                                        seed=config.seed, subword_dropout=config.subword_dropout,
                                        subword_dropout_sides=config.subword_dropout_sides, **options)
    valid = valid_summary = None
    if config.valid_source is not None:
        valid, valid_summary = make_dataset(config.valid_source, config.valid_target, source_tokenizer,
                                            target_tokenizer, training=False, **options)
    return train, train_summary, valid, valid_summary


def load_or_train_tokenizers(config, directory=None):
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
    if config.train_source is None:
        raise FileNotFoundError(f"No tokenizers at {directory} and no DataConfig.train_source to learn them from.")
    logger.info("Learning a %s %s vocabulary of %d from %s and %s into %s",
                "shared" if config.shared_vocab else "separate", config.model_type, config.vocab_size,
                config.train_source, config.train_target, directory)
    return tokenizers.train_tokenizers_from_files(
        config.train_source, config.train_target, config.vocab_size, shared=config.shared_vocab, directory=directory,
        sample_size=config.vocab_sample_size, seed=config.seed or 0, errors=config.errors,
        model_type=config.model_type, lowercase=config.lowercase)


def batch_statistics(dataset):
    """Counts sentences, tokens and padding over one pass of a batched dataset.

    Args:
        dataset: yields ``({"source": [B, S], "target": [B, T]}, labels)``.

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
        counts["source_tokens"] += int(np.count_nonzero(source != PAD_ID))
        counts["target_tokens"] += int(np.count_nonzero(target != PAD_ID))
        counts["source_positions"] += source.size
        counts["target_positions"] += target.size
        counts["max_source_positions"] = max(counts["max_source_positions"], source.size)
        counts["max_target_positions"] = max(counts["max_target_positions"], target.size)
    return BatchStatistics(**counts)


# ---------------------------------------------------------------------- internals
def tokenize_corpus(tokenizer, texts):
    """Tokenizes a list of sentences in large batched calls; returns an int32 RaggedTensor [N, None]."""
    chunks = [tokenizer.tokenize(tf.constant(texts[start:start + _TOKENIZE_CHUNK], dtype=tf.string))
              for start in range(0, len(texts), _TOKENIZE_CHUNK)]
    return tf.concat(chunks, axis=0) if len(chunks) > 1 else chunks[0]


def _batch_of_pairs(source_ids, target_ids):
    """Gathers pairs by index and lays them out for teacher forcing, padded with 0 to the batch's longest."""
    def build(indices):
        source, target = tf.gather(source_ids, indices), tf.gather(target_ids, indices)
        column = tf.ones([tf.shape(indices)[0], 1], tf.int32)
        eos = tf.RaggedTensor.from_tensor(column * EOS_ID)
        bos = tf.RaggedTensor.from_tensor(column * BOS_ID)
        inputs = {"source": tf.concat([source, eos], axis=1).to_tensor(PAD_ID),
                  "target": tf.concat([bos, target], axis=1).to_tensor(PAD_ID)}
        return inputs, tf.concat([target, eos], axis=1).to_tensor(PAD_ID)
    return build


def _make(sources, targets, summary, source_tokenizer, target_tokenizer, *, tokens_per_batch=4096, max_length=128,
          training=True, bucket_width=1, shuffle_buffer=None, cache=True, num_replicas=None, seed=None,
          subword_dropout=0.0, subword_dropout_sides="both"):
    if num_replicas is None:
        num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if not sources:
        raise ValueError(f"No sentence pairs to batch: {summary}.")
    source_ids = tokenize_corpus(source_tokenizer, sources)
    target_ids = tokenize_corpus(target_tokenizer, targets)
    source_ids, target_ids, summary = corpus.limit_length(
        source_ids, target_ids, max_length, "filter" if training else "truncate", summary)
    if summary.kept == 0:
        raise ValueError(f"No sentence pairs left to batch: {summary}.")

    lengths = np.maximum(source_ids.row_lengths().numpy(), target_ids.row_lengths().numpy()) + 1  # + eos / bos
    buckets, sizes, skipped = batch_plan(lengths, tokens_per_batch, bucket_width, num_replicas)
    summary = dataclasses.replace(summary, replica_remainder=skipped)
    if not sizes:
        raise ValueError(f"No batch to make: {len(lengths)} pair(s) cannot give each of {num_replicas} replicas one.")
    logger.info("%s; %d batches of at most %d source and %d target positions", summary, len(sizes),
                tokens_per_batch, tokens_per_batch)

    if training and subword_dropout:
        if subword_dropout_sides not in SUBWORD_DROPOUT_SIDES:
            raise ValueError(f"subword_dropout_sides must be one of {SUBWORD_DROPOUT_SIDES}, "
                             f"got {subword_dropout_sides!r}.")
        return _sampled_epochs(sources, targets, source_ids, target_ids, source_tokenizer, target_tokenizer,
                               subword_dropout, subword_dropout_sides, tokens_per_batch, max_length, bucket_width,
                               num_replicas, seed), summary

    pairs, num_batches, used = len(lengths), len(sizes), sum(sizes)
    bucket_of_pair, batch_sizes = tf.constant(buckets, tf.int32), tf.constant(sizes, tf.int64)

    def cut(order, batch_order):
        """One epoch: pairs in `order`, sorted by bucket (stable), cut by the plan, batches in `batch_order`."""
        order = tf.gather(order, tf.argsort(tf.gather(bucket_of_pair, order), stable=True))[:used]
        batches = tf.RaggedTensor.from_row_lengths(order, batch_sizes)
        return tf.data.Dataset.from_tensor_slices(tf.gather(batches, batch_order))

    if training:
        # A fresh permutation each epoch decides which pairs of one length share a batch; a second one orders
        # the batches, so an epoch is not sorted by length (and does not end with the longest sentences).
        order = tf.data.Dataset.range(pairs).shuffle(shuffle_buffer or pairs, seed=seed,
                                                     reshuffle_each_iteration=True)
        batch_order = tf.data.Dataset.range(num_batches).shuffle(
            num_batches, seed=None if seed is None else seed + 1, reshuffle_each_iteration=True)
    else:  # a fixed order: sorted by length
        order, batch_order = tf.data.Dataset.range(pairs), tf.data.Dataset.range(num_batches)
    dataset = tf.data.Dataset.zip(order.batch(pairs), batch_order.batch(num_batches)).flat_map(cut)
    dataset = dataset.map(_batch_of_pairs(source_ids, target_ids), num_parallel_calls=tf.data.AUTOTUNE)
    if cache and not training:  # inference batches are the same every pass; training ones change each epoch
        dataset = dataset.cache()
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_batches))  # fit() shows progress
    return dataset.prefetch(tf.data.AUTOTUNE), summary


def _sampled_epochs(sources, targets, source_ids, target_ids, source_tokenizer, target_tokenizer, dropout, sides,
                    tokens_per_batch, max_length, bucket_width, num_replicas, seed):
    """Training batches under BPE-dropout: every pass over the pairs segments them anew, then batches as `_make` does.

    The pairs are those the deterministic tokenization kept (`source_ids`,
    `target_ids`, already filtered by `max_length`); a side whose sample comes
    out longer than `max_length` allows takes its deterministic ids for that
    pass, so no pair is dropped by chance. Lengths change with every sample, and
    so does the number of batches a pass makes (by a batch or two). An epoch is
    therefore a fixed number of batches, that of the first pass, drawn from an
    endless stream of passes: every pair is seen once per pass and no batch is
    skipped, while Keras knows the epoch's length (progress, resuming inside an
    epoch) as with deterministic batches.
    """
    limit = None if max_length is None else max_length - 1
    fixed_source, fixed_target = source_ids.to_list(), target_ids.to_list()
    if len(fixed_source) != len(sources):  # some pairs were filtered: find which texts they are
        source_lengths = [len(ids) for ids in source_tokenizer.sample(sources, 0)]
        target_lengths = [len(ids) for ids in target_tokenizer.sample(targets, 0)]
        kept = [i for i, (s, t) in enumerate(zip(source_lengths, target_lengths)) if s <= limit and t <= limit]
        sources, targets = [sources[i] for i in kept], [targets[i] for i in kept]
    root = np.random.SeedSequence(seed)  # seed None: fresh entropy

    def sample(tokenizer, texts, fixed, side, seed):
        if sides not in ("both", side):
            return fixed
        ids = tokenizer.sample(texts, dropout, seed=seed)
        return [sampled if limit is None or len(sampled) <= limit else original
                for sampled, original in zip(ids, fixed)]

    def one_pass(number):
        """Pass `number`: a fresh segmentation, shuffled and cut by the token budget; (batch count, batches)."""
        rng = np.random.default_rng([*root.generate_state(2), number])
        source = sample(source_tokenizer, sources, fixed_source, "source", seed=int(rng.integers(2 ** 31)))
        target = sample(target_tokenizer, targets, fixed_target, "target", seed=int(rng.integers(2 ** 31)))
        lengths = np.array([max(len(s), len(t)) + 1 for s, t in zip(source, target)])
        buckets, sizes, _ = batch_plan(lengths, tokens_per_batch, bucket_width, num_replicas)
        order = rng.permutation(len(lengths))
        order = order[np.argsort(buckets[order], kind="stable")]
        starts = np.cumsum([0] + sizes[:-1])

        def batches():  # laid out one at a time, as the model asks for them
            for batch in rng.permutation(len(sizes)):
                rows = order[starts[batch]:starts[batch] + sizes[batch]]
                source_batch = np.full((len(rows), max(len(source[i]) for i in rows) + 1), PAD_ID, np.int32)
                target_in = np.full((len(rows), max(len(target[i]) for i in rows) + 1), PAD_ID, np.int32)
                labels = np.full_like(target_in, PAD_ID)
                for row, i in enumerate(rows):
                    source_batch[row, :len(source[i]) + 1] = source[i] + [EOS_ID]
                    target_in[row, :len(target[i]) + 1] = [BOS_ID] + target[i]
                    labels[row, :len(target[i]) + 1] = target[i] + [EOS_ID]
                yield {"source": source_batch, "target": target_in}, labels
        return len(sizes), sum(len(t) + 1 for t in target), batches()

    per_epoch, target_tokens, first = one_pass(0)

    def passes():
        yield from first
        number = 1
        while True:
            yield from one_pass(number)[2]
            number += 1

    stream = passes()  # shared by every iterator of the dataset: epoch e + 1 goes on where epoch e stopped

    def one_epoch():
        for _ in range(per_epoch):
            yield next(stream)

    logger.info("BPE-dropout %.2f (%s): %d batches an epoch (those of the first sampled pass; %.1f%% more target "
                "tokens than the deterministic segmentation)", dropout, sides, per_epoch,
                100 * (target_tokens / sum(len(ids) + 1 for ids in fixed_target) - 1))
    signature = ({"source": tf.TensorSpec([None, None], tf.int32), "target": tf.TensorSpec([None, None], tf.int32)},
                 tf.TensorSpec([None, None], tf.int32))
    dataset = tf.data.Dataset.from_generator(one_epoch, output_signature=signature)
    return dataset.apply(tf.data.experimental.assert_cardinality(per_epoch)).prefetch(tf.data.AUTOTUNE)
