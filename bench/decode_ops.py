"""Two operations of a beam-search step, timed the way decoding runs them: inside a TensorFlow while loop.

    .venv/bin/python bench/decode_ops.py [--iterations 100] [--repeats 5] [--threads 1]

1. Each hypothesis's best tokens: `ops.top_k` over the whole vocabulary against
   `decoding.top_k_by_blocks` (the same values and ids), for 5, 40 and 320 rows of 8,000 logits and k = 12
   (beam 5: 2K + 2), the rows of one sentence, of a chunk of 8 sentences and of a batch of 64.
2. Writing one position of a `(rows, H, T, d)` cache: a select over the whole cache (the write decoding used
   before) against `layers.attention.write_positions` (a scatter of one `d`-vector per row and head, the write
   it uses now), and a gather of the cache rows (the beam reorder) for scale.

Each case runs `--iterations` times inside one `tf.function` while loop (so the per-op cost is the graph
executor's, as in a SavedModel), `--repeats` times; the table gives the best repeat's time per iteration. Each
iteration feeds the loop's running value into its input (so nothing can be hoisted out of the loop): for `top_k`
that is an add over the logits, counted in both columns alike.
Everything runs alternately in one process, on `--threads` intra-op threads (one inter-op thread).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def per_iteration(function, args, iterations, repeats):
    function(*args)  # trace and warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function(*args)
        best = min(best, (time.perf_counter() - start) / iterations)
    return best * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=8000)
    args = parser.parse_args(argv)

    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    from keras import ops

    from keras_transformer.decoding import top_k_by_blocks
    from keras_transformer.layers.attention import write_positions

    n = args.iterations

    def looped(step):
        """`step(x, a) -> scalar` run n times in a while loop, each iteration depending on the last."""
        return tf.function(lambda x: tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a + step(x, a)),
                                                   (0, 0.0))[1])

    rows_of = {5: "one sentence", 40: "a chunk of 8", 320: "a batch of 64"}
    print(f"| operation (beam 5, vocabulary {args.vocab}, {args.threads} thread(s)) | rows | before, us | now, us "
          "| ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for rows in (5, 40, 320):
        logits = tf.random.normal((rows, args.vocab), seed=rows)
        full = looped(lambda x, a: ops.sum(ops.top_k(x + a, 12)[0]))
        blocks = looped(lambda x, a: ops.sum(top_k_by_blocks(x + a, 12)[0]))
        before = per_iteration(full, (logits,), n, args.repeats)
        now = per_iteration(blocks, (logits,), n, args.repeats)
        print(f"| best 12 tokens per row: `top_k` over all ids, then over 32-id blocks ({rows_of[rows]}) | {rows} "
              f"| {before:.0f} | {now:.0f} | {before / now:.2f}x |")

    heads, length, size = 4, 90, 32  # the shipped model's caches for a 40-position source: 4 heads of 32
    for rows in (5, 40):
        cache = tf.zeros((rows, heads, length, size))
        new = tf.ones((rows, heads, 1, size))
        reorder = tf.constant(list(range(rows))[::-1])

        def select(x, a, new=new):
            here = ops.equal(ops.arange(length), 7)
            written = ops.where(ops.reshape(here, (1, 1, -1, 1)), new + a, x)
            return ops.sum(written[:, 0, 7, 0])

        def scatter(x, a, new=new):
            return ops.sum(write_positions(x, 7, new + a)[:, 0, 7, 0])

        def gather(x, a, reorder=reorder):
            return ops.sum(ops.take(x, reorder + ops.cast(a * 0.0, "int32"), axis=0)[:, 0, 0, 0])

        before = per_iteration(looped(select), (cache,), n, args.repeats)
        now = per_iteration(looped(scatter), (cache,), n, args.repeats)
        reordered = per_iteration(looped(gather), (cache,), n, args.repeats)
        print(f"| write one position of a ({rows}, {heads}, {length}, {size}) cache: select, then scatter | {rows} "
              f"| {before:.0f} | {now:.0f} | {before / now:.2f}x |")
        print(f"| (for scale) reorder the rows of that cache: gather | {rows} | | {reordered:.0f} | |")


if __name__ == "__main__":
    main()
