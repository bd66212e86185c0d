"""`TextStream`: parallel corpora read lazily a window at a time, tokenized inside the tf.data graph, and cut
into token-budget batches (the package's docstring gives the steps); `CorpusTally` counts what a pass read,
`StreamCursor` starts each epoch where the run is."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.data import stream as streams
from keras_transformer.data.batching import batch_plan
from keras_transformer.data.corpus import CorpusSummary
from keras_transformer.errors import ConfigError
from keras_transformer.experiment import SUBWORD_DROPOUT_SIDES

if TYPE_CHECKING:
    from keras_transformer.data.tokenizers.pairs import Tokenizer

logger = logging.getLogger("keras_transformer.data.pipeline")

DEFAULT_WINDOW = 262144  # lines per window (DataConfig.window), as eole's bucket


class CorpusTally:
    """What reading and filtering did to a stream's pairs, counted as the windows go by.

    Its fields are those of `CorpusSummary` (``lines``, ``kept``, ``empty``,
    ``too_long``, ...): the counts of the last whole pass once one has ended,
    and until then of what has been read so far (``complete`` says which).

    Example:

    >>> tally = CorpusTally("a.en", "a.de", max_length=8)
    >>> tally.add(0, lines=10, empty=1, too_long=2, last=True)
    >>> tally.kept, tally.complete
    (7, True)
    """

    def __init__(self, source_file: str, target_file: str, max_length: int | None = None,
                 split: str = "training") -> None:
        self._names = (source_file, target_file)
        self._split = split  # what the log line names: "training" or "validation"
        self._max_length = max_length
        self._passes: dict[int, dict[str, int]] = {}  # pass -> counts so far
        self._last: CorpusSummary | None = None  # the CorpusSummary of the last whole pass
        self.complete = False

    def add(self, pass_number: int, last: bool = False, **counts: int) -> None:
        """Adds one window's counts to its pass; logs the pass's summary when `last` ends it."""
        totals = self._passes.setdefault(int(pass_number), {})
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + int(value)
        if last:
            self._last = self._summary(self._passes.pop(int(pass_number)))
            self.complete = True
            if self._split == "training":
                logger.info("Pass %d over the training data done: %s", int(pass_number) + 1, self._last)
            else:
                logger.info("Read the %s data: %s", self._split, self._last)

    def _summary(self, counts: dict[str, Any]) -> CorpusSummary:
        return CorpusSummary(*self._names, max_length=self._max_length, **counts)

    @property
    def summary(self) -> CorpusSummary:
        """The `CorpusSummary` of the last whole pass, or of the pass being read."""
        if self._last is not None:
            return self._last
        return self._summary(self._passes[min(self._passes)] if self._passes else {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.summary, name)

    def __str__(self) -> str:
        return str(self.summary) + ("" if self.complete else " (so far: the pass has not ended)")


class TextStream:
    """Token-budget batches streamed from parallel corpora (see the module docstring); `dataset()` builds them.

    Args:
        corpora: a list of `stream.Corpus`.
        source_tokenizer, target_tokenizer: `SubwordTokenizer`s.
        tokens_per_batch, max_length, training, bucket_width, num_replicas, seed,
            subword_dropout, subword_dropout_sides, errors: as `make_dataset`.
        window: lines per window.
        shard: ``(count, index)``: the lines this worker reads (`stream.windows`).
        endless: one corpus read pass after pass without end (several always are).
        start: the `stream.Position` the first iteration starts at, and `start_batch`
            the batch number it has (in its pass, or in the run when endless).
    """

    def __init__(self, corpora: Sequence[streams.Corpus], source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, *,
                 tokens_per_batch: int = 4096, max_length: int | None = 128, training: bool = True,
                 bucket_width: int = 1, window: int = DEFAULT_WINDOW, num_replicas: int | None = None,
                 errors: str = "strict", seed: int | None = None, subword_dropout: float = 0.0,
                 subword_dropout_sides: str = "both", shard: Sequence[int] = (1, 0), endless: bool = False,
                 start: streams.Position = streams.Position(), start_batch: int = 0) -> None:
        streams.check_corpora(corpora)
        language_last = bool(getattr(target_tokenizer, "language_last", False))
        if language_last != bool(getattr(source_tokenizer, "language_last", False)):
            raise ConfigError("The source and target tokenizers must both lay pairs out as mBART-large-cc25's "
                              "(language_last) or neither does.")
        for side, tokenizer in (("source", source_tokenizer), ("target", target_tokenizer)):
            if language_last and getattr(tokenizer, "language", None) is None:
                raise ConfigError(f"The {side} tokenizer is language_last (mBART-large-cc25's layout) without a "
                                  f"default language: set \"language\" in its tokenizer.json to one of its "
                                  f"languages.")
        if num_replicas is None:
            num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if subword_dropout_sides not in SUBWORD_DROPOUT_SIDES:
            raise ValueError(f"subword_dropout_sides must be one of {SUBWORD_DROPOUT_SIDES}, "
                             f"got {subword_dropout_sides!r}.")
        if max_length is not None and max_length < 2:
            raise ValueError(f"max_length must be at least 2 (one token plus bos/eos), got {max_length}.")
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise ValueError(f"window must be a positive number of lines, got {window!r}.")
        self.corpora, self.tokenizers = list(corpora), (source_tokenizer, target_tokenizer)
        self.tokens_per_batch, self.max_length, self.training = int(tokens_per_batch), max_length, training
        self.bucket_width, self.window, self.num_replicas = bucket_width, window, int(num_replicas)
        self.errors, self.shard = errors, tuple(shard)
        self.seed = int(np.random.SeedSequence().generate_state(1)[0]) if seed is None else int(seed)
        self.dropout = subword_dropout if training else 0.0
        self.sides = subword_dropout_sides
        self.endless = endless or len(self.corpora) > 1
        self.start, self.start_batch = start, int(start_batch)
        self.language_last = language_last
        self._anchor = (start, int(start_batch))  # where the current (or last) iteration started: what `locate`
                                                  # counts from, whatever `start` became since
        # (pass, window) -> (batches, last window of its pass), as windows are planned
        self.records: dict[tuple[int, int], tuple[int, bool]] = {}
        names = [corpus.name for corpus in self.corpora]
        first = self.corpora[0]
        self.tally = CorpusTally(*((streams.side_name(first.source), streams.side_name(first.target)) if len(names) == 1
                                   else (", ".join(names), "")), max_length=max_length,
                                  split="training" if training else "validation")
        self._started: Any = None  # when the current iteration began (for the first window's log line)
        self._pass_batches: dict[int, int] = {}  # pass -> batches planned so far

    # ------------------------------------------------------------------ positions
    def locate(self, batch: int) -> streams.Position:
        """The `stream.Position` of batch number `batch` (counted as `start_batch` is), from the windows planned.

        Example:

        >>> from keras_transformer.data.stream import Corpus, Position
        >>> from keras_transformer.data.tokenizers import SubwordTokenizer
        >>> tok = SubwordTokenizer.train(["a cat", "eine Katze"] * 10, vocab_size=270)
        >>> text = TextStream([Corpus("a", ["a cat"] * 8, ["eine Katze"] * 8)], tok, tok, tokens_per_batch=24,
        ...                   max_length=16, window=4, num_replicas=1, seed=0)
        >>> batches = list(text.dataset())
        >>> len(batches), text.locate(0), text.locate(3)   # 2 batches of 2 pairs a window
        (4, Position(pass_number=0, window=0, skip=0), Position(pass_number=0, window=1, skip=1))
        """
        position, batch_at = self._anchor
        first = batch_at - position.skip
        pass_number, window = position.pass_number, position.window
        while True:
            record = self.records.get((pass_number, window))
            if record is None or batch < first + record[0]:
                return streams.Position(pass_number, window, max(batch - first, 0))
            first += record[0]
            pass_number, window = (pass_number + 1, 0) if record[1] else (pass_number, window + 1)

    @property
    def anchor_pass(self) -> int:
        """The pass the current (or last) iteration started in."""
        return self._anchor[0].pass_number

    def seek(self, batch: int, pass_number: int | None = None) -> None:
        """Makes the next iteration start at batch `batch` (of pass `pass_number` when not endless)."""
        if pass_number is not None and pass_number != self.start.pass_number:
            self.start, self.start_batch = streams.Position(pass_number, 0, 0), 0
        if batch != self.start_batch:
            self.start, self.start_batch = self.locate(batch), batch

    # ------------------------------------------------------------------ the dataset
    def _windows(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        start = self.start
        self._anchor = (start, self.start_batch)
        self._started = time.time() if self.training else None
        if self.training:
            logger.info("Filling the first window: up to %d lines from %s (pass %d, window %d%s)", self.window,
                        ", ".join(streams.side_name(corpus.source) for corpus in self.corpora),
                        start.pass_number + 1, start.window + 1,
                        f", after its first {start.skip} batches" if start.skip else "")
        first = True
        for window in streams.windows(self.corpora, self.window, streams.Position(start.pass_number, start.window),
                                      seed=self.seed, shard=self.shard, errors=self.errors, endless=self.endless):
            skip = start.skip if (window.pass_number, window.index) == (start.pass_number, start.window) else 0
            if first and self.training:
                logger.info("First window read: %d lines in %.1f s", window.lines, time.time() - self._started)
                first = False
            yield (np.array(window.sources, dtype=object), np.array(window.targets, dtype=object),
                   np.array([window.pass_number, window.index, skip, window.lines, window.empty, window.replaced,
                             window.last], np.int64))
            if window.last and not self.endless and self.start is start:  # a next iteration: the next pass
                self.start, self.start_batch = streams.Position(window.pass_number + 1, 0, 0), 0

    def _sample(self, side: int) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
        """BPE-dropout of one side of a window, as flat ids and row lengths (the deterministic ids where a
        sample is longer than `max_length` allows)."""
        tokenizer = self.tokenizers[side]
        limit = None if self.max_length is None else self.max_length - 1

        def sample(texts: np.ndarray, fixed_values: np.ndarray, fixed_lengths: np.ndarray,
                   info: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            fixed = np.split(fixed_values, np.cumsum(fixed_lengths)[:-1])
            seed = int(np.random.default_rng([self.seed, int(info[0]), int(info[1]), side]).integers(2 ** 31))
            ids = tokenizer.sample([text.decode("utf-8") for text in texts], self.dropout, seed=seed)
            rows = [np.asarray(s, np.int32) if limit is None or len(s) <= limit else f for s, f in zip(ids, fixed)]
            lengths = np.array([len(row) for row in rows], np.int64)
            return (np.concatenate(rows) if rows else np.zeros(0, np.int32)).astype(np.int32), lengths
        return sample

    def _plan(self, source_lengths: np.ndarray, target_lengths: np.ndarray, sampled_source: np.ndarray,
              sampled_target: np.ndarray, info: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The window's batches: the indices of their pairs, batch after batch, and each batch's size.

        The `source_lengths`/`target_lengths` of the vocabulary's own segmentation decide which pairs are too
        long; the batches are cut by the lengths the pairs are laid out with (`sampled_*`, BPE-dropout's)."""
        pass_number, window, skip, lines, empty, replaced, last = (int(v) for v in info)
        lengths = np.maximum(source_lengths, target_lengths)
        limit = None if self.max_length is None else self.max_length - 1
        over = np.zeros(len(lengths), bool) if limit is None else lengths > limit
        lengths = np.maximum(sampled_source, sampled_target)
        counts = dict(lines=lines, empty=empty, replaced=replaced)
        if self.training:
            kept = np.flatnonzero(~over)
            counts["too_long"] = int(over.sum())
        else:
            kept = np.arange(len(lengths))
            lengths = lengths if limit is None else np.minimum(lengths, limit)
            counts["truncated"] = int(over.sum())
        sizes: Any  # the batches' sizes: a list, then an array
        sizes, order = [], kept[:0]
        if len(kept):
            buckets, sizes, skipped = batch_plan(lengths[kept] + 1, self.tokens_per_batch, self.bucket_width,
                                                 self.num_replicas)
            counts["replica_remainder"] = skipped
            if self.training:
                rng = np.random.default_rng([self.seed, pass_number, window])
                order = rng.permutation(len(kept))
                order = order[np.argsort(buckets[order], kind="stable")]
                batch_order = rng.permutation(len(sizes))
            else:
                order, batch_order = np.argsort(buckets, kind="stable"), np.arange(len(sizes))
            starts = np.cumsum([0] + sizes[:-1]).astype(np.int64)
            order = kept[order]
            picked = batch_order[skip:]
            sizes = np.asarray(sizes, np.int64)
            order = (np.concatenate([order[starts[b]:starts[b] + sizes[b]] for b in picked]) if len(picked)
                     else order[:0])
            sizes_out = sizes[picked]
        else:
            sizes_out = np.zeros(0, np.int64)
        self.records[(pass_number, window)] = (len(sizes), bool(last))
        batches = self._pass_batches.get(pass_number, 0) + len(sizes)
        self._pass_batches[pass_number] = batches
        self.tally.add(pass_number, last=bool(last), **counts)
        if last and not batches and (pass_number, 0) in self.records:  # a whole pass, and no batch
            raise streams.CorpusError(
                f"No batch to make: {self.tally.summary} (batches give each of {self.num_replicas} replica(s) at "
                f"least one pair).")
        if self._started is not None:
            logger.info("First window ready: %d pairs tokenized, %d batches in %.1f s since the start", len(lengths),
                        len(sizes), time.time() - self._started)
            self._started = None
        return order.astype(np.int64), np.asarray(sizes_out, np.int64)

    def dataset(self) -> Any:
        """The `tf.data.Dataset` of batches (see `make_dataset`); each iteration starts at `start`."""
        signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string), tf.TensorSpec([7], tf.int64))
        windows = tf.data.Dataset.from_generator(self._windows, output_signature=signature)
        source_tokenizer, target_tokenizer = self.tokenizers
        limit = None if self.max_length is None else self.max_length - 1

        def prepare(sources: Any, targets: Any, info: Any) -> tuple[Any, Any, Any]:
            source_ids, target_ids = source_tokenizer.tokenize(sources), target_tokenizer.tokenize(targets)
            keep_lengths = (source_ids.row_lengths(), target_ids.row_lengths())
            if self.dropout:
                for side, texts in ((0, sources), (1, targets)):
                    if self.sides not in ("both", ("source", "target")[side]):
                        continue
                    fixed = (source_ids, target_ids)[side]
                    values, lengths = tf.numpy_function(
                        self._sample(side), [texts, fixed.flat_values, fixed.row_lengths(), info],
                        [tf.int32, tf.int64], stateful=True)
                    sampled = tf.RaggedTensor.from_row_lengths(values, lengths)
                    source_ids, target_ids = (sampled, target_ids) if side == 0 else (source_ids, sampled)
            indices, sizes = tf.numpy_function(self._plan, [*keep_lengths, source_ids.row_lengths(),
                                                            target_ids.row_lengths(), info],
                                               [tf.int64, tf.int64], stateful=True)
            if limit is not None and not self.training:
                source_ids, target_ids = source_ids[:, :limit], target_ids[:, :limit]
            return source_ids, target_ids, tf.RaggedTensor.from_row_lengths(tf.reshape(indices, [-1]),
                                                                            tf.reshape(sizes, [-1]))

        def batches(source_ids: Any, target_ids: Any, rows: Any) -> Any:
            layout = (_language_last_pairs(source_ids, target_ids, *self.tokenizers) if self.language_last
                      else _batch_of_pairs(source_ids, target_ids, *self.tokenizers))
            return tf.data.Dataset.from_tensor_slices(rows).map(layout)

        dataset = windows.map(prepare).flat_map(batches)
        options = tf.data.Options()
        # Each worker reads its own shard of the lines (`shard`); tf.data must not shard the batches again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        # No model-based autotuning: the stream has nothing for it to tune (the windows are read and planned in
        # order, one at a time), and an iterator that runs it keeps a tuning thread whose sleep, up to a minute,
        # its deletion waits out. Keras leaves `fit`'s iterators to the garbage collector (in a cycle, or held by
        # the traceback of an exception out of `fit`), so on a busy machine a later collection stalled for up to
        # 44 s. The prefetch buffer still grows as it runs dry. The synthetic and packed pipelines do the same.
        options.autotune.enabled = False
        return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


class StreamCursor(keras.callbacks.Callback):
    """Starts each iteration of a `TextStream`'s training batches where the run is: the callback `fit` needs.

    One pass an epoch: epoch ``e`` starts pass ``e`` at its first window (or the
    resumed run's position). Endless (`training.steps_per_epoch`): each `fit`
    starts the stream at batch ``epoch x steps_per_epoch + done``.

    Args:
        text: the `TextStream`.
        steps_per_epoch: `training.steps_per_epoch`, or None for one pass an epoch.
        resumed_at: `(epoch, batches done)` of the backup the run resumed from.
    """

    def __init__(self, text: TextStream, steps_per_epoch: int | None = None,
                 resumed_at: Sequence[int] = (0, 0)) -> None:
        super().__init__()
        self.text, self.steps_per_epoch, self.resumed_at = text, steps_per_epoch, tuple(resumed_at)
        self._first = True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._first = True

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        done = self.resumed_at[1] if epoch == self.resumed_at[0] else 0
        if self.steps_per_epoch:
            if self._first:
                self.text.seek(epoch * self.steps_per_epoch + done)
        else:
            self.text.seek(done, pass_number=epoch)
        self._first = False

    def position(self, epoch: int, done: int) -> dict[str, int] | None:
        """The stream position after `done` batches of epoch `epoch` (0-based), as a dict for the backup."""
        if self.steps_per_epoch:
            batch = epoch * self.steps_per_epoch + done
        elif epoch != self.text.anchor_pass:
            return dict(streams.Position(epoch, 0, 0).to_dict(), batch=0) if not done else None
        else:
            batch = done
        return dict(self.text.locate(batch).to_dict(), batch=batch)


def _batch_of_pairs(source_ids: Any, target_ids: Any, source_tokenizer: Any,
                    target_tokenizer: Any) -> Callable[[Any], tuple[dict[str, Any], Any]]:
    """Gathers pairs by index and lays them out for teacher forcing (source ``tokens </s>``, decoder input
    ``<bos> tokens``, labels ``tokens </s>``), padded to the batch's longest, each side with its tokenizer's ids:
    an import's own (fairseq's pad 1 and eos 2, Marian's eos 0 and decoder start at pad), the package's 0/2/3."""
    source_eos, source_pad = int(source_tokenizer.eos_id), int(source_tokenizer.pad_id)
    bos, eos, pad = int(target_tokenizer.bos_id), int(target_tokenizer.eos_id), int(target_tokenizer.pad_id)

    def build(indices: Any) -> tuple[dict[str, Any], Any]:
        source, target = tf.gather(source_ids, indices), tf.gather(target_ids, indices)
        column = tf.ones([tf.shape(indices)[0], 1], tf.int32)
        ends = tf.RaggedTensor.from_tensor(column * eos)
        inputs = {"source": tf.concat([source, tf.RaggedTensor.from_tensor(column * source_eos)],
                                      axis=1).to_tensor(source_pad),
                  "target": tf.concat([tf.RaggedTensor.from_tensor(column * bos), target], axis=1).to_tensor(pad)}
        return inputs, tf.concat([target, ends], axis=1).to_tensor(pad)
    return build


def _language_last_pairs(source_ids: Any, target_ids: Any, source_tokenizer: Any,
                         target_tokenizer: Any) -> Callable[[Any], tuple[dict[str, Any], Any]]:
    """`_batch_of_pairs` for mBART-large-cc25's layout (`language_last` tokenizers, whose `tokenize` gives the
    language first): source ``tokens </s> [src_lang]``, decoder input ``[tgt_lang] tokens`` (the decoder started
    from the target language, as the searches' ``start_from_prefix``), labels ``tokens </s>``; padded with the
    tokenizers' own pad ids."""
    def column(tokenizer: Any, rows: Any) -> Any:  # each row's eos, a ragged (B, 1)
        return tf.RaggedTensor.from_tensor(tf.fill([rows, 1], tf.constant(int(tokenizer.eos_id), tf.int32)))

    def build(indices: Any) -> tuple[dict[str, Any], Any]:
        source, target = tf.gather(source_ids, indices), tf.gather(target_ids, indices)
        rows = tf.shape(indices)[0]
        source = tf.concat([source[:, 1:], column(source_tokenizer, rows), source[:, :1]], axis=1)
        labels = tf.concat([target[:, 1:], column(target_tokenizer, rows)], axis=1)
        inputs = {"source": source.to_tensor(int(source_tokenizer.pad_id)),
                  "target": target.to_tensor(int(target_tokenizer.pad_id))}
        return inputs, labels.to_tensor(int(target_tokenizer.pad_id))
    return build
