"""The tf.data pipeline: parallel text files in, token-budget batches out, streamed at any corpus size.

Steps, in order (docs/data.md, "How the text becomes batches"):

1. read the files lazily, a window of ``window`` lines at a time
   (`stream.windows`: plain or gzip, pairs with an empty side dropped, invalid
   UTF-8 and misaligned files named with file and line as they are met; several
   corpora mix by weight, each starting again when it runs out; a worker of a
   multi-worker run reads only its shard of the lines);
2. tokenize each window inside the tf.data graph (the tensorflow-text
   tokenizers), so its lengths are known;
3. drop (training) or cut (inference) pairs longer than ``max_length``
   positions;
4. in training, shuffle the window's pairs (seeded by the seed, the pass and the
   window), sort them by length (the longer side, in buckets ``bucket_width``
   wide; 1 is the exact length) and cut them into consecutive batches by a
   token budget (`batching.batch_plan`): a batch takes pairs while
   ``pairs x L <= tokens_per_batch``, ``L`` its longest length, so every batch
   holds at most ``tokens_per_batch`` source and at most ``tokens_per_batch``
   target positions, padding included; then shuffle the window's batches.
   Inference keeps them sorted by length;
5. lay each batch out as ``({"source": tokens + eos, "target": bos + tokens},
   labels = tokens + eos)``, padded with 0, and prefetch.

Memory holds one window (and the next one being prepared), whatever the size of
the corpus; the first batch comes as soon as the first window is read and
tokenized. A corpus that fits in one window (Multi30k, in the default of 262,144
lines) is batched exactly as a whole-corpus shuffle and sort would batch it.
What a whole pass counts (pairs read, empty, over-long) is known when the pass
ends: `CorpusTally` holds it, and the pass's summary is logged then.

One corpus: an epoch is one pass over it (its batch count is known only when the
pass ends), or with ``endless`` an endless stream of passes that
`training.steps_per_epoch` cuts into epochs. Several corpora (`stream.Corpus`
weights) always give an endless stream.

Resuming: the batches are a function of the seed and of the `stream.Position`
(pass, window, batches of the window done), so a run stopped inside an epoch
resumes at its window, skipping the lines before it without decoding them and
the window's batches it trained, and trains the batches the uninterrupted run
would have trained (`TextStream.locate`, `StreamCursor`).

With ``subword_dropout`` > 0 (BPE-dropout), training segments every window anew
with merges skipped at random, seeded like its shuffle (docs/data.md,
"BPE-dropout").

Token budget and tf.distribute: ``tokens_per_batch`` is the GLOBAL budget of
one training step, as in the paper (about 25,000 source + 25,000 target tokens
per step over 8 GPUs). ``model.fit`` under a strategy splits every batch
across the ``R`` replicas, so each replica sees about ``tokens_per_batch / R``
tokens. To give every replica data, batch sizes are multiples of ``R`` and the
fewer than ``R`` longest pairs left at the end of a window are skipped (counted
in ``replica_remainder``). ``R`` is read from the strategy in scope when the
dataset is built, or given as ``num_replicas``. To keep the per-replica batch of
a single-device run, multiply ``tokens_per_batch`` by ``R``.
"""

import dataclasses
import logging
import os
import re
import time

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.data import corpus, tokenizers
from keras_transformer.data import stream as streams
from keras_transformer.data.batching import batch_plan
from keras_transformer.data.corpus import CorpusSummary
from keras_transformer.experiment import SUBWORD_DROPOUT_SIDES

logger = logging.getLogger(__name__)

PAD_ID, BOS_ID, EOS_ID = tokenizers.PAD_ID, tokenizers.BOS_ID, tokenizers.EOS_ID
_TOKENIZE_CHUNK = 16384  # sentences per tokenizer call when tokenizing a corpus
DEFAULT_WINDOW = 262144  # lines per window (DataConfig.window), as eole's bucket


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

    def __init__(self, source_file, target_file, max_length=None):
        self._names = (source_file, target_file)
        self._max_length = max_length
        self._passes = {}  # pass -> counts so far
        self._last = None  # the CorpusSummary of the last whole pass
        self.complete = False

    def add(self, pass_number, last=False, **counts):
        """Adds one window's counts to its pass; logs the pass's summary when `last` ends it."""
        totals = self._passes.setdefault(int(pass_number), {})
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + int(value)
        if last:
            self._last = self._summary(self._passes.pop(int(pass_number)))
            self.complete = True
            logger.info("Pass %d over the training data done: %s", int(pass_number) + 1, self._last)

    def _summary(self, counts):
        return CorpusSummary(*self._names, max_length=self._max_length, **counts)

    @property
    def summary(self):
        """The `CorpusSummary` of the last whole pass, or of the pass being read."""
        if self._last is not None:
            return self._last
        return self._summary(self._passes[min(self._passes)] if self._passes else {})

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.summary, name)

    def __str__(self):
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

    def __init__(self, corpora, source_tokenizer, target_tokenizer, *, tokens_per_batch=4096, max_length=128,
                 training=True, bucket_width=1, window=DEFAULT_WINDOW, num_replicas=None, errors="strict", seed=None,
                 subword_dropout=0.0, subword_dropout_sides="both", shard=(1, 0), endless=False,
                 start=streams.Position(), start_batch=0):
        streams.check_corpora(corpora)
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
        self._anchor = (start, int(start_batch))  # where the current (or last) iteration started: what `locate`
                                                  # counts from, whatever `start` became since
        self.records = {}  # (pass, window) -> (batches, last window of its pass), as windows are planned
        names = [corpus.name for corpus in self.corpora]
        first = self.corpora[0]
        self.tally = CorpusTally(*((streams.side_name(first.source), streams.side_name(first.target)) if len(names) == 1
                                   else (", ".join(names), "")), max_length=max_length)
        self._started = None  # when the current iteration began (for the first window's log line)
        self._pass_batches = {}  # pass -> batches planned so far

    # ------------------------------------------------------------------ positions
    def locate(self, batch):
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
    def anchor_pass(self):
        """The pass the current (or last) iteration started in."""
        return self._anchor[0].pass_number

    def seek(self, batch, pass_number=None):
        """Makes the next iteration start at batch `batch` (of pass `pass_number` when not endless)."""
        if pass_number is not None and pass_number != self.start.pass_number:
            self.start, self.start_batch = streams.Position(pass_number, 0, 0), 0
        if batch != self.start_batch:
            self.start, self.start_batch = self.locate(batch), batch

    # ------------------------------------------------------------------ the dataset
    def _windows(self):
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

    def _sample(self, side):
        """BPE-dropout of one side of a window, as flat ids and row lengths (the deterministic ids where a
        sample is longer than `max_length` allows)."""
        tokenizer = self.tokenizers[side]
        limit = None if self.max_length is None else self.max_length - 1

        def sample(texts, fixed_values, fixed_lengths, info):
            fixed = np.split(fixed_values, np.cumsum(fixed_lengths)[:-1])
            seed = int(np.random.default_rng([self.seed, int(info[0]), int(info[1]), side]).integers(2 ** 31))
            ids = tokenizer.sample([text.decode("utf-8") for text in texts], self.dropout, seed=seed)
            rows = [np.asarray(s, np.int32) if limit is None or len(s) <= limit else f for s, f in zip(ids, fixed)]
            lengths = np.array([len(row) for row in rows], np.int64)
            return (np.concatenate(rows) if rows else np.zeros(0, np.int32)).astype(np.int32), lengths
        return sample

    def _plan(self, source_lengths, target_lengths, sampled_source, sampled_target, info):
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

    def dataset(self):
        """The `tf.data.Dataset` of batches (see `make_dataset`); each iteration starts at `start`."""
        signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string), tf.TensorSpec([7], tf.int64))
        windows = tf.data.Dataset.from_generator(self._windows, output_signature=signature)
        source_tokenizer, target_tokenizer = self.tokenizers
        limit = None if self.max_length is None else self.max_length - 1

        def prepare(sources, targets, info):
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

        def batches(source_ids, target_ids, rows):
            return tf.data.Dataset.from_tensor_slices(rows).map(_batch_of_pairs(source_ids, target_ids))

        dataset = windows.map(prepare).flat_map(batches)
        options = tf.data.Options()
        # Each worker reads its own shard of the lines (`shard`); tf.data must not shard the batches again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
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

    def __init__(self, text, steps_per_epoch=None, resumed_at=(0, 0)):
        super().__init__()
        self.text, self.steps_per_epoch, self.resumed_at = text, steps_per_epoch, tuple(resumed_at)
        self._first = True

    def on_train_begin(self, logs=None):
        self._first = True

    def on_epoch_begin(self, epoch, logs=None):
        done = self.resumed_at[1] if epoch == self.resumed_at[0] else 0
        if self.steps_per_epoch:
            if self._first:
                self.text.seek(epoch * self.steps_per_epoch + done)
        else:
            self.text.seek(done, pass_number=epoch)
        self._first = False

    def position(self, epoch, done):
        """The stream position after `done` batches of epoch `epoch` (0-based), as a dict for the backup."""
        if self.steps_per_epoch:
            batch = epoch * self.steps_per_epoch + done
        elif epoch != self.text.anchor_pass:
            return dict(streams.Position(epoch, 0, 0).to_dict(), batch=0) if not done else None
        else:
            batch = done
        return dict(self.text.locate(batch).to_dict(), batch=batch)


def _corpora(source_file, target_file, name="train"):
    return [streams.Corpus(name, source_file, target_file)]


# ---------------------------------------------------------------------- entry points
def make_dataset(source_file, target_file, source_tokenizer, target_tokenizer, *, tokens_per_batch=4096,
                 max_length=128, training=True, bucket_width=1, window=DEFAULT_WINDOW, cache=True,
                 num_replicas=None, errors="strict", seed=None, subword_dropout=0.0, subword_dropout_sides="both",
                 corpora=None, shard=(1, 0), endless=False):
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
        padded with 0; and the `CorpusTally` of what was read and dropped, whose
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


def make_stream(config, source_tokenizer, target_tokenizer, num_replicas=None, shard=(1, 0), endless=False,
                start=None):
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


def make_dataset_from_texts(sources, targets, source_tokenizer, target_tokenizer, **options):
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


def make_datasets(config, source_tokenizer, target_tokenizer, num_replicas=None):
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


def stream_error(error):
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
