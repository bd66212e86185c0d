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

The modules: `text_stream` (`TextStream`, the windows read, tokenized and cut into batches; `CorpusTally`;
`StreamCursor`, where an epoch starts), `datasets` (the entry points: datasets of files, configs and texts, the
tokenizers of a config, batch statistics). Import the names from this package.
"""

from keras_transformer.data.pipeline.datasets import (
                                                      BatchStatistics,
                                                      batch_statistics,
                                                      load_or_train_tokenizers,
                                                      make_dataset,
                                                      make_dataset_from_texts,
                                                      make_datasets,
                                                      make_stream,
                                                      stream_error,
                                                      tokenize_corpus,
)
from keras_transformer.data.pipeline.text_stream import DEFAULT_WINDOW, CorpusTally, StreamCursor, TextStream

__all__ = ["DEFAULT_WINDOW", "BatchStatistics", "CorpusTally", "StreamCursor", "TextStream", "batch_statistics",
           "load_or_train_tokenizers", "make_dataset", "make_dataset_from_texts", "make_datasets", "make_stream",
           "stream_error", "tokenize_corpus"]
