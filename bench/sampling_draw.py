"""Sampling's draw of the next token, with and without a sort of the vocabulary.

    .venv/bin/python bench/sampling_draw.py [--iterations 10] [--repeats 3] [--threads 1]

`decoding.sampling.choose_tokens` (the cuts and the inverse-CDF draw located by bisection on the values' order:
masked sums, no sort) against the draw sampling used before (`sorted_draw` below: a full descending `top_k` of the
vocabulary, then cumulative sums), for 1, 8 and 64 rows of 8,000 ids (the shipped models) and 1 and 8 rows of 58,101
ids (an OPUS-MT vocabulary), with no cut, top-k 10 and top-p 0.9. The settings are tensors, as a SavedModel's `sample`
takes them, and each case runs `--iterations` times inside one XLA-compiled while loop, `--repeats` times,
alternating the two; the table gives the best repeat's time per draw and the share of rows where the two drew
different tokens (float rounding of the cumulative mass: the sort's running sums against masked sums).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def sorted_draw(log_probs, u, top_k, top_p, temperature):
    """The draw sampling used before: sort the tempered values, cut the ranks, inverse CDF over running sums."""
    from keras import ops

    vocab = int(log_probs.shape[-1])
    temperature = ops.maximum(ops.cast(temperature, "float32"), 1e-6)
    values, ids = ops.top_k(log_probs / temperature, vocab)
    probs = ops.exp(values - values[:, :1])
    total = ops.sum(probs, axis=-1, keepdims=True)
    cumulative = ops.cumsum(probs, axis=-1)
    before = ops.concatenate([ops.zeros_like(probs[:, :1]), cumulative[:, :-1]], axis=-1)
    rank = ops.arange(vocab, dtype="int32")
    top_k, top_p = ops.cast(top_k, "int32"), ops.cast(top_p, "float32")
    in_top_k = ops.logical_or(ops.less(rank, top_k), ops.less_equal(top_k, 0))
    in_nucleus = ops.logical_or(ops.less(before, top_p * total), ops.greater_equal(top_p, 1.0))
    kept = ops.logical_or(ops.logical_and(in_top_k, in_nucleus), ops.equal(rank, 0))
    kept_probs = ops.where(kept, probs, 0.0)
    kept_cumulative = ops.cumsum(kept_probs, axis=-1)
    target = ops.expand_dims(u, 1) * kept_cumulative[:, -1:]
    chosen = ops.sum(ops.cast(ops.less_equal(kept_cumulative, target), "int32"), axis=-1)
    chosen = ops.minimum(chosen, ops.sum(ops.cast(ops.greater(kept_probs, 0.0), "int32"), axis=-1) - 1)
    return ops.take_along_axis(ops.cast(ids, "int32"), ops.expand_dims(chosen, 1), axis=1)[:, 0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    from keras_transformer.decoding.sampling import choose_tokens

    def looped(draw, n):
        """`draw` n times in an XLA-compiled while loop, each draw's log-probabilities shifted by the last token
        drawn (so nothing is hoisted out of the loop); returns the tokens of the last draw."""
        def run(log_probs, u, top_k, top_p, temperature):
            def body(i, tokens):
                shifted = log_probs + tf.cast(tf.reduce_sum(tokens) % 2, tf.float32) * 1e-30
                return i + 1, draw(shifted, u, top_k, top_p, temperature)
            return tf.while_loop(lambda i, tokens: i < n, body, (0, tf.zeros(tf.shape(u), tf.int32)))[1]
        return tf.function(run, jit_compile=True)

    rng = np.random.default_rng(0)
    settings = {"no cut": (0, 1.0), "top-k 10": (10, 1.0), "top-p 0.9": (0, 0.9)}
    print("| vocabulary | rows | cut | sort, ms | no sort, ms | ratio | tokens that differ |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for vocab in (8000, 58101):
        functions = {name: looped(draw, args.iterations) for name, draw in (("sort", sorted_draw),
                                                                            ("no sort", choose_tokens))}
        for rows in ((1, 8, 64) if vocab == 8000 else (1, 8)):
            # A trained model's next-token distributions: most of the mass on a few ids, a long flat tail.
            logits = rng.standard_normal((rows, vocab)).astype("float32") * 2.0
            logits[:, rng.integers(0, vocab, 20)] += 8.0
            log_probs = tf.nn.log_softmax(logits)
            u = tf.constant(rng.random(rows).astype("float32"))
            for cut, (top_k, top_p) in settings.items():
                inputs = (log_probs, u, tf.constant(top_k), tf.constant(top_p), tf.constant(1.0))
                tokens = {name: function(*inputs).numpy() for name, function in functions.items()}  # compile
                best = {name: float("inf") for name in functions}
                for _ in range(args.repeats):
                    for name, function in functions.items():
                        start = time.perf_counter()
                        function(*inputs).numpy()
                        best[name] = min(best[name], (time.perf_counter() - start) / args.iterations * 1e3)
                differ = float(np.mean(tokens["sort"] != tokens["no sort"]))
                print(f"| {vocab:,} | {rows} | {cut} | {best['sort']:.3f} | {best['no sort']:.3f} | "
                      f"{best['sort'] / best['no sort']:.1f}x | {differ:.0%} |", flush=True)


if __name__ == "__main__":
    main()
