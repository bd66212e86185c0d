"""Decoding throughput: cached against uncached, greedy and beam 4, eager, graph and XLA.

What it measures, on Multi30k-length input:

* Source lengths are those of the Multi30k validation split (`val.en.gz`):
  words and punctuation marks counted by a regex (close to the subword count
  of a ~8k vocabulary), plus eos. The first `--sentences` sentences are
  sorted by length and cut into batches of `--batch-size` (as
  `Translator.translate_lines` does); the token ids are random.
* The model is a randomly initialised `small` preset (3+3 layers, d_model 256,
  4 heads, d_ff 1024) with an 8,000-id vocabulary, dropout off.
* A random model never emits eos, so every sentence runs to its length limit.
  With `--max-extra 0` (the default here) that limit is its source length,
  which is about the length of a real Multi30k translation (German and
  English captions have about as many words), and it keeps the uncached
  decoder's prefix buffer tight. The paper's `+50` would make the uncached
  baseline look far worse than it is.
* "cached": `keras_transformer.decoding` as shipped (one decoder step per token
  with the key/value cache). "uncached": the same search with
  `use_cache=False`, which reruns the decoder (and the output projection) over
  the whole fixed-width prefix buffer at every step; the encoder still runs
  once. XLA needs those fixed shapes. Because the buffer is as wide as the
  longest output, an uncached baseline that reran only the growing prefix
  would do about half that work; `--prefix-baseline` also times such a
  baseline (greedy, eager Python loop) against a cached eager Python loop.
* Modes: eager (the `while_loop` runs op by op), graph (`tf.function`) and
  XLA (`tf.function(jit_compile=True)`). Each configuration is warmed up on
  every batch shape first (tracing and compilation excluded). Then cached and
  uncached run alternately on the same batches, `--repeats` passes.

Figures: sentences/s and output tokens/s over all passes (tokens of the best
hypothesis, eos included), and the median of the per-batch paired
uncached/cached time ratios (the figure to quote on a shared, noisy machine).

Usage:

    python bench/decode_throughput.py                          # 64 sentences, 2 passes (a few minutes)
    python bench/decode_throughput.py --sentences 128 --repeats 3 --prefix-baseline   # docs/BENCHMARKS.md
    python bench/decode_throughput.py --modes graph,xla --searches beam
"""

import argparse
import gzip
import json
import os
import pathlib
import platform
import re
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer import decoding  # noqa: E402
from keras_transformer.model import decode, encode  # noqa: E402

MULTI30K = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def multi30k_lengths(count):
    """Source lengths (tokens + eos) of the first `count` Multi30k validation sentences."""
    with gzip.open(MULTI30K / "val.en.gz", "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f][:count]
    return [len(re.findall(r"\w+|[^\w\s]", line)) + 1 for line in lines]


def make_batches(lengths, batch_size, vocab_size, seed=0):
    """Random source ids with the given lengths, sorted by length, in padded int32 batches."""
    rng = np.random.default_rng(seed)
    lengths = sorted(lengths)
    batches = []
    for start in range(0, len(lengths), batch_size):
        chunk = lengths[start:start + batch_size]
        batch = np.zeros((len(chunk), max(chunk)), "int32")
        for row, length in enumerate(chunk):
            batch[row, :length - 1] = rng.integers(4, vocab_size, size=length - 1)
            batch[row, length - 1] = 3  # eos
        batches.append(batch)
    return batches


def make_search(model, search, mode, use_cache, beam_size, max_extra):
    def run(source):
        if search == "greedy":
            return decoding.greedy_decode(model, source, max_extra=max_extra, use_cache=use_cache)
        tokens, scores = decoding.beam_search(model, source, beam_size=beam_size, alpha=0.6, max_extra=max_extra,
                                              use_cache=use_cache)
        return tokens[:, 0], scores[:, 0]

    if mode == "eager":
        return run
    return tf.function(run, jit_compile=(mode == "xla"), reduce_retracing=False)


def output_tokens(fn, batches):
    """Warm-up (traces / compiles every batch shape) and counts the output tokens of one pass."""
    return sum(int(np.sum(np.asarray(fn(tf.constant(batch))[0]) != 0)) for batch in batches)


def paired_times(cached, uncached, batches, repeats):
    """Runs cached and uncached alternately on each batch; returns their per-batch seconds."""
    times = {"cached": [], "uncached": []}
    for _ in range(repeats):
        for batch in batches:
            for key, fn in (("cached", cached), ("uncached", uncached)):
                start = time.perf_counter()
                np.asarray(fn(tf.constant(batch))[0])
                times[key].append(time.perf_counter() - start)
    return times


def prefix_baseline(model, batches, repeats):
    """Greedy in eager Python loops: cached one-token steps against rerunning the decoder on the growing prefix."""
    decoder = model.get_layer("decoder")

    def greedy(source, cached):
        memory, source_padding = encode(model, source)
        steps = source.shape[1]  # max_extra = 0
        tokens = np.full((source.shape[0], steps + 1), 2, "int32")  # bos, then outputs
        if cached:
            cache = decoder.initial_cache(source.shape[0], steps)
            cross = decoder.cross_attention_cache(memory)
        for t in range(steps):
            if cached:
                logits, cache = decode(model, tokens[:, t:t + 1], None, source_padding, self_attention_cache=cache,
                                       cache_index=t, cross_attention_cache=cross)
            else:
                logits = decode(model, tokens[:, :t + 1], memory, source_padding)[:, -1:]
            tokens[:, t + 1] = np.argmax(logits[:, 0], axis=-1)
        return tokens

    results = {}
    for cached in (True, False):
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            for batch in batches:
                greedy(batch, cached)
            seconds.append(time.perf_counter() - start)
        results["cached" if cached else "uncached_prefix"] = statistics.median(seconds)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=64, help="Multi30k val sentences (their lengths)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--max-extra", type=int, default=0, help="output limit = source length + this")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--modes", default="eager,graph,xla")
    parser.add_argument("--searches", default="greedy,beam")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prefix-baseline", action="store_true", help="also time the growing-prefix baseline")
    parser.add_argument("--threads", type=int, default=0, help="TF intra/inter-op threads (0: TF default)")
    args = parser.parse_args()

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig.preset(args.preset, vocab_size=args.vocab_size, dropout=0.0)
    model = kt.build_model(config)
    lengths = multi30k_lengths(args.sentences)
    batches = make_batches(lengths, args.batch_size, args.vocab_size)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "tensorflow": tf.__version__, "keras": keras.__version__, "preset": args.preset,
                      "vocab": args.vocab_size, "sentences": len(lengths), "batch_size": args.batch_size,
                      "mean_source_length": round(float(np.mean(lengths)), 1), "max_extra": args.max_extra}))

    for search in args.searches.split(","):
        for mode in args.modes.split(","):
            row = {"search": search if search == "greedy" else f"beam{args.beam_size}", "mode": mode}
            cached = make_search(model, search, mode, True, args.beam_size, args.max_extra)
            uncached = make_search(model, search, mode, False, args.beam_size, args.max_extra)
            tokens = output_tokens(cached, batches)
            assert tokens == output_tokens(uncached, batches), "cached and uncached outputs differ in length"
            times = paired_times(cached, uncached, batches, args.repeats)
            for key in ("cached", "uncached"):
                seconds = sum(times[key]) / args.repeats  # one pass over all batches
                row[f"{key}_sentences_per_s"] = round(len(lengths) / seconds, 1)
                row[f"{key}_tokens_per_s"] = round(tokens / seconds, 1)
            ratios = [u / c for c, u in zip(times["cached"], times["uncached"])]
            row["paired_median_ratio"] = round(statistics.median(ratios), 2)
            print(json.dumps(row), flush=True)

    if args.prefix_baseline:
        results = prefix_baseline(model, batches, args.repeats)
        print(json.dumps({"search": "greedy, eager python loop", "cached_s": round(results["cached"], 2),
                          "uncached_prefix_s": round(results["uncached_prefix"], 2),
                          "ratio": round(results["uncached_prefix"] / results["cached"], 2)}))


if __name__ == "__main__":
    main()
