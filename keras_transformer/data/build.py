"""The data of a training run, built from its experiment config: synthetic pairs, text files or TFDS.

`build_data(section, data_dir, ...)` learns or loads the vocabulary (kept in
`data_dir/vocab`, learned once, atomically, by the chief worker) and returns a
`trainer.loop.TrainingData` around the tf.data pipelines. TensorFlow-specific.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from keras_transformer.data import corpus, pipeline, stream, tokenizers
from keras_transformer.data.synthetic import make_arrays, synthetic_pairs
from keras_transformer.errors import ConfigError
from keras_transformer.files import atomic_write, staging_folder
from keras_transformer.trainer.backup import resumed_seed
from keras_transformer.trainer.distribute import global_batch_size, input_shard
from keras_transformer.trainer.loop import TrainingData

if TYPE_CHECKING:
    from keras_transformer.data.tokenizers.pairs import Tokenizer
    from keras_transformer.experiment import DataConfig, DataSection

log = logging.getLogger("keras_transformer")


def _synthetic_arrays(section: DataSection, data_dir: str | os.PathLike[str], seed: int) -> dict[str, np.ndarray]:
    """Builds the synthetic pairs once and keeps them in `data_dir/synthetic.npz`."""
    path = pathlib.Path(data_dir) / "synthetic.npz"
    if path.is_file():
        with np.load(path) as arrays:
            return {name: arrays[name] for name in arrays.files}
    total = section.train_examples + section.val_examples
    sources, targets = synthetic_pairs(section.task, total, section.synthetic_vocab_size, section.min_length,
                                       section.synthetic_max_length, seed=seed)
    inputs, labels = make_arrays(sources, targets)
    n = section.train_examples
    arrays = {"train_source": inputs["source"][:n], "train_target": inputs["target"][:n], "train_labels": labels[:n],
              "val_source": inputs["source"][n:], "val_target": inputs["target"][n:], "val_labels": labels[n:]}
    atomic_write(path, lambda temporary: np.savez(temporary, **arrays))  # workers may write at once: names per process
    return arrays


def _synthetic_data(section: DataSection, data_dir: str | os.PathLike[str], global_batch: int, seed: int,
                    num_replicas: int, shuffle_seed: int) -> TrainingData:
    arrays = _synthetic_arrays(section, data_dir, seed)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.autotune.enabled = False  # nothing to tune, and a tuned iterator's deletion waits (TextStream.dataset)

    def dataset(prefix: str, training: bool) -> Any:
        ds = tf.data.Dataset.from_tensor_slices(
            ({"source": arrays[f"{prefix}_source"], "target": arrays[f"{prefix}_target"]},
             arrays[f"{prefix}_labels"]))
        if training and section.shuffle:
            ds = ds.shuffle(len(arrays[f"{prefix}_labels"]), seed=shuffle_seed, reshuffle_each_iteration=True)
        # Equal batches keep every replica busy and make one step the same work on 1 or N devices.
        return ds.batch(global_batch, drop_remainder=training or num_replicas > 1).prefetch(2).with_options(options)

    if len(arrays["train_labels"]) < global_batch:
        raise ConfigError(f"data.train_examples={len(arrays['train_labels'])} is smaller than one global batch "
                          f"({global_batch}); lower data.batch_size or add examples.")
    validation = dataset("val", False) if len(arrays["val_labels"]) >= global_batch else None
    size = section.synthetic_vocab_size
    return TrainingData(dataset("train", True), validation, size, size)


def _wait_for(path: str | os.PathLike[str], timeout: float = 3600, poll: float = 2.0) -> None:
    """Waits until `path` exists (a non-chief worker waiting for the chief's vocabulary)."""
    deadline = time.time() + timeout
    while not pathlib.Path(path).exists():
        if time.time() > deadline:
            raise TimeoutError(f"Waited {timeout} s for {path}, which the chief worker writes. Is the workdir on a "
                               "file system all workers share? See docs/distributed.md.")
        time.sleep(poll)


def tfds_pairs(section: DataSection, split: str, max_examples: int | None = None) -> tuple[list[str], list[str]]:
    """Reads `(sources, targets)` of one split of a TensorFlow Datasets translation set.

    Args:
        section: a `DataSection` with `tfds_name`, `source_language`, `target_language`.
        split: the split name, e.g. "train".
        max_examples: read at most this many pairs.

    Returns:
        Two lists of `str`.

    Raises:
        ConfigError: tensorflow-datasets is not installed, or the set lacks a language.
    """
    try:
        import tensorflow_datasets as tfds  # optional: data.kind tfds only
    except ImportError as error:
        raise ConfigError("data.kind 'tfds' needs TensorFlow Datasets: `pip install tensorflow-datasets`; the "
                          f"first run downloads {section.tfds_name} (internet access needed).") from error
    languages = (section.pipeline.get("source_language", "en"), section.pipeline.get("target_language", "de"))
    dataset = tfds.load(section.tfds_name, split=split, data_dir=section.tfds_data_dir)
    if max_examples:
        dataset = dataset.take(int(max_examples))
    sources, targets = [], []
    for example in dataset.as_numpy_iterator():
        for language in languages:
            if language not in example:
                raise ConfigError(f"data: {section.tfds_name} has no language {language!r}; it has "
                                  f"{sorted(example)}. Set data.source_language / data.target_language.")
        sources.append(example[languages[0]].decode("utf-8"))
        targets.append(example[languages[1]].decode("utf-8"))
    return sources, targets


def tokenizers_for(section: DataSection, config: DataConfig, vocab_dir: str | os.PathLike[str], wait_for_chief: bool,
                   texts: tuple[list[str], list[str]] | None = None) -> tuple[Tokenizer, Tokenizer]:
    """Loads the vocabulary from `vocab_dir`, or learns it once (atomically) from the training text."""
    vocab_dir = pathlib.Path(vocab_dir)
    if not vocab_dir.exists() and wait_for_chief:
        log.info("Waiting for the chief worker's vocabulary in %s", vocab_dir)
        _wait_for(vocab_dir)
    if vocab_dir.exists():
        return tokenizers.load_tokenizers(vocab_dir)
    staging = staging_folder(vocab_dir)  # unique to this process; a killed one's is removed by the next `train`
    if texts is None:
        pair = pipeline.load_or_train_tokenizers(config, staging)
    else:
        pair = tokenizers.train_tokenizers(texts[0], texts[1], config.vocab_size, shared=config.shared_vocab,
                                           directory=staging, sample_size=config.vocab_sample_size,
                                           seed=config.seed or 0, model_type=config.model_type,
                                           lowercase=config.lowercase)
    os.replace(staging, vocab_dir)
    log.info("Vocabulary of %d (%s) stored in %s", pair[0].vocab_size,
             "shared" if pair[0] is pair[1] else f"target {pair[1].vocab_size}", vocab_dir)
    return pair


def _text_data(section: DataSection, data_dir: str | os.PathLike[str], replicas: int, batch_scaling: str, seed: int,
               wait_for_chief: bool, shard: Sequence[int] = (1, 0), steps_per_epoch: int | None = None,
               resumed_at: Sequence[int] = (0, 0), stream_start: Mapping[str, Any] | None = None) -> TrainingData:
    base = section.data_config()
    tokens = global_batch_size(base.tokens_per_batch, replicas, batch_scaling)
    config = dataclasses.replace(
        section.data_config(tokenizer_dir=pathlib.Path(data_dir) / "vocab", tokens_per_batch=tokens), seed=seed)
    options: dict[str, Any] = dict(tokens_per_batch=config.tokens_per_batch, max_length=config.max_length,
                                   bucket_width=config.bucket_width, window=config.window, cache=config.cache,
                                   num_replicas=replicas)
    if stream_start is None and resumed_at != (0, 0):  # a backup without a stream position: its pass's start
        if resumed_at[1]:
            log.warning("The backup does not record where the training data stood: epoch %d's pass starts again "
                        "from its first window.", resumed_at[0] + 1)
        stream_start = dict(pass_number=resumed_at[0], window=0, skip=0, batch=0) if not steps_per_epoch else None
    start = stream.Position.from_dict(stream_start) if stream_start else stream.Position()
    start_batch = int((stream_start or {}).get("batch", 0))
    if section.kind == "text":
        source_tokenizer, target_tokenizer = tokenizers_for(section, config, pathlib.Path(data_dir) / "vocab",
                                                         wait_for_chief)
        corpora = [stream.Corpus(**corpus) for corpus in config.training_corpora()]
        valid = valid_summary = valid_pairs = None
        if config.valid_source is not None:
            valid, valid_summary = pipeline.make_dataset(config.valid_source, config.valid_target, source_tokenizer,
                                                         target_tokenizer, training=False, errors=config.errors,
                                                         **options)
            valid_pairs = corpus.read_parallel_corpus(config.valid_source, str(config.valid_target),
                                                      config.errors)[:2]  # the config requires both
    else:
        sources, targets = tfds_pairs(section, section.tfds_train_split, section.tfds_max_examples)
        source_tokenizer, target_tokenizer = tokenizers_for(section, config, pathlib.Path(data_dir) / "vocab",
                                                         wait_for_chief, texts=(sources, targets))
        corpora = [stream.Corpus(section.tfds_name or "tfds", sources, targets)]
        valid = valid_summary = valid_pairs = None
        if section.tfds_valid_split:
            valid_pairs = tfds_pairs(section, section.tfds_valid_split)
            valid, valid_summary = pipeline.make_dataset_from_texts(
                *valid_pairs, source_tokenizer, target_tokenizer, training=False, **options)
    if shard[0] > 1 and not steps_per_epoch:
        raise ConfigError(f"{shard[0]} workers read disjoint shards of the training text, whose passes make different "
                          "numbers of batches: set training.steps_per_epoch, so that every worker trains as many "
                          "steps an epoch.")
    if len(corpora) > 1 and not steps_per_epoch:
        raise ConfigError(f"data.corpora: {len(corpora)} corpora mix without end (each starts again when it runs "
                          "out), so an epoch has no natural end: set training.steps_per_epoch.")
    text = pipeline.TextStream(corpora, source_tokenizer, target_tokenizer, training=True, errors=config.errors,
                               seed=config.seed, subword_dropout=config.subword_dropout,
                               subword_dropout_sides=config.subword_dropout_sides, shard=shard,
                               endless=bool(steps_per_epoch), start=start, start_batch=start_batch,
                               **{k: v for k, v in options.items() if k != "cache"})
    cursor = pipeline.StreamCursor(text, steps_per_epoch, resumed_at)
    log.info("Training data: %s, streamed in windows of %d lines%s; its counts are logged as each pass ends",
             " + ".join(f"{c.name} ({stream.side_name(c.source)}, weight {c.weight})" if len(corpora) > 1
                        else f"{stream.side_name(c.source)} / {stream.side_name(c.target)}"
                        for c in corpora), config.window,
             f", worker {shard[1] + 1} of {shard[0]} reading every {shard[0]}th line" if shard[0] > 1 else "")
    return TrainingData(text.dataset(), valid, source_tokenizer.vocab_size, target_tokenizer.vocab_size,
                        tokenizers=(source_tokenizer, target_tokenizer), valid_pairs=valid_pairs,
                        callbacks=[cursor], stream_position=cursor.position)


def build_data(section: DataSection, data_dir: str | os.PathLike[str], strategy: Any = None,
               batch_scaling: str = "per_replica", seed: int = 0, wait_for_chief: bool = False,
               resumed_at: Sequence[int] = (0, 0), steps_per_epoch: int | None = None,
               stream_start: Mapping[str, Any] | None = None) -> TrainingData:
    """Builds the training and validation datasets a `DataSection` describes.

    Built once: the synthetic pairs or the learned vocabulary are stored in
    `data_dir` (`synthetic.npz`, `vocab/`) and read back by every later run.

    An epoch is one pass over the training pairs, or with `steps_per_epoch`
    that many batches of an endless stream of passes (the training dataset is
    repeated, each pass shuffled anew), so that every epoch trains exactly
    `steps_per_epoch` updates, wherever the passes end.

    Args:
        section: a `DataSection`.
        data_dir: where the data and vocabulary are kept (`workdir/data`).
        strategy: the `tf.distribute` strategy (batch sizes scale with its replicas).
        batch_scaling: `"per_replica"` or `"global"` (see `distribute.global_batch_size`):
            how `data.batch_size` (synthetic) or `data.tokens_per_batch` (text) is read.
        seed: the seed of the synthetic pairs and of shuffling, unless `data.seed` is set.
        wait_for_chief: a non-chief worker waits for the chief's vocabulary instead of learning one.
        resumed_at: `(epoch, batch)` a resumed run starts from. Synthetic data: its shuffling seed is
            `resumed_seed(seed, epoch, batch)`, so it does not replay the first run's order. Text: the
            stream starts at `stream_start` and trains the batches the first run would have trained.
        steps_per_epoch: `training.steps_per_epoch`: when set, the training dataset repeats without end
            (`model.fit` takes that many batches an epoch, going on where the last epoch stopped).
        stream_start: the stream position the backup records (`trainer.backup.backup_stream`), or None.

    Returns:
        A `TrainingData` (`num_batches`: the batches of one pass, when tf.data can tell).

    Example:

    >>> import tempfile
    >>> from keras_transformer.experiment import DataSection
    >>> data = build_data(DataSection(train_examples=64, val_examples=64, batch_size=32), tempfile.mkdtemp())
    >>> inputs, labels = next(iter(data.train))
    >>> inputs["source"].shape[0], data.source_vocab_size
    (32, 32)
    """
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    seed = section.seed if section.seed is not None else seed
    shuffle_seed = resumed_seed(seed, *resumed_at)
    if section.kind == "synthetic":
        global_batch = global_batch_size(section.batch_size, replicas, batch_scaling)
        data = _synthetic_data(section, data_dir, global_batch, seed, replicas, shuffle_seed)
    else:
        data = _text_data(section, data_dir, replicas, batch_scaling, seed, wait_for_chief,
                          shard=input_shard(strategy), steps_per_epoch=steps_per_epoch, resumed_at=tuple(resumed_at),
                          stream_start=stream_start)
    batches = int(data.train.cardinality())  # UNKNOWN (-2) or INFINITE (-1) when tf.data cannot tell
    train = data.train
    if steps_per_epoch and section.kind == "synthetic":  # a finite dataset would end an epoch early where a pass
        # ends (Keras: "ran out of data"); the text stream is endless already
        train = train.repeat()  # each repetition shuffles anew (reshuffle_each_iteration)
    return dataclasses.replace(data, train=train, num_batches=batches if batches > 0 else None)


def repeat_rows(dataset: Any) -> Any:
    """`dataset` with every row of every batch repeated in place (rows 2i and 2i + 1 are one example), as
    `losses.RDropLoss` expects. Pairs stay on one replica when a strategy splits the batch evenly: a batch of n
    rows over r replicas gives each replica 2n / r rows, an even number, as the pipelines make n a multiple of r.

    Example:

    >>> import tensorflow as tf
    >>> data = tf.data.Dataset.from_tensors(({"source": tf.constant([[1], [2]])}, tf.constant([[3], [4]])))
    >>> inputs, labels = next(iter(repeat_rows(data)))
    >>> inputs["source"].numpy().ravel().tolist(), labels.numpy().ravel().tolist()
    ([1, 1, 2, 2], [3, 3, 4, 4])
    """
    return dataset.map(lambda *batch: tf.nest.map_structure(lambda t: tf.repeat(t, 2, axis=0), batch),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
