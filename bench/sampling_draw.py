"""Sampling's draw of the next token: the vocabulary sorted, or the draw located by bisection.

    .venv/bin/python bench/sampling_draw.py [--mode xla|graph|eager] [--iterations 10] [--repeats 3] [--threads 1]

`decoding.sampling.choose_tokens` both ways: `sort=True` (a full descending `top_k` of the vocabulary, then cuts by
rank and running sums) and `sort=False` (the cuts and the inverse-CDF draw located by bisection on the values' order:
masked sums, no sort), for 1, 8 and 64 rows of 8,000 ids (the shipped models) and 1 and 8 rows of 58,101 ids (an
OPUS-MT vocabulary), with no cut, top-k 10 and top-p 0.9. The settings are tensors, as a SavedModel's `sample` takes
them. `--mode xla` (a compiled search, the SavedModel's default) and `graph` (a `tf.function` without XLA, a
`Translator`'s default) run each case `--iterations` times inside one while loop; `eager` calls it that many times.
Each case runs `--repeats` times, alternating the two ways; the table gives the best repeat's time per draw and the
share of rows where the two drew different tokens (float rounding of the cumulative mass: the sort's running sums
against masked sums). `sample` sorts only where TensorFlow runs it eagerly.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("xla", "graph", "eager"), default="xla")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    from keras_transformer.decoding.sampling import choose_tokens

    def looped(sort, n):
        """The draw n times, each draw's log-probabilities shifted by the last token drawn (so nothing is
        hoisted out of a loop); returns the tokens of the last draw."""
        def draw(log_probs, u, top_k, top_p, temperature, tokens):
            shifted = log_probs + tf.cast(tf.reduce_sum(tokens) % 2, tf.float32) * 1e-30
            return choose_tokens(shifted, u, top_k, top_p, temperature, sort=sort)

        def run(log_probs, u, top_k, top_p, temperature):
            tokens = tf.zeros(tf.shape(u), tf.int32)
            if args.mode == "eager":
                for _ in range(n):
                    tokens = draw(log_probs, u, top_k, top_p, temperature, tokens)
                return tokens
            return tf.while_loop(lambda i, tokens: i < n,
                                 lambda i, tokens: (i + 1, draw(log_probs, u, top_k, top_p, temperature, tokens)),
                                 (0, tokens))[1]
        return run if args.mode == "eager" else tf.function(run, jit_compile=True if args.mode == "xla" else None)

    rng = np.random.default_rng(0)
    settings = {"no cut": (0, 1.0), "top-k 10": (10, 1.0), "top-p 0.9": (0, 0.9)}
    print("| vocabulary | rows | cut | sort, ms | bisection, ms | ratio | tokens that differ |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for vocab in (8000, 58101):
        functions = {name: looped(sort, args.iterations) for name, sort in (("sort", True), ("bisection", False))}
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
                differ = float(np.mean(tokens["sort"] != tokens["bisection"]))
                print(f"| {vocab:,} | {rows} | {cut} | {best['sort']:.3f} | {best['bisection']:.3f} | "
                      f"{best['sort'] / best['bisection']:.1f}x | {differ:.0%} |", flush=True)


if __name__ == "__main__":
    main()
