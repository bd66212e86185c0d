"""Length-ordered chunks: the TensorFlow engine's batch searched or scored `chunk_size` sentences at a time.

`engines.tensorflow.Translator` sorts a batch by length and gives each chunk of `chunk_size` sentences its own
search loop (or forced-decoding pass), cut to the chunk's own width: a chunk stops when its own sentences are
done, memory holds one chunk's state at a time, and results come back in input order (docs/decoding.md,
"Length-ordered chunks"). With XLA, chunks are padded to a few shapes (`tensorflow_graph.bucket_sizes`) and dealt
to independent loops, lanes, that TensorFlow's inter-op threads run side by side.
"""

from collections.abc import Callable
from typing import TypeAlias

import tensorflow as tf

from keras_transformer.engines.tensorflow_graph import SMALLEST_WIDTH_BUCKET, bucket_table, result_parts, row_lengths

# A target prefix's width is padded to a power of two from this (with XLA), as a source's is from
# `SMALLEST_WIDTH_BUCKET`: prefixes add a few XLA programs, not one per prefix length.
SMALLEST_PREFIX_BUCKET = 4

# The search on one chunk: `(source [c, S], target_prefix [c, P] or None, *along) -> (tokens [c, R, T],
# scores [c, R])`, `along` the chunk's rows of `search_in_length_order`'s `along` tensors.
Search: TypeAlias = Callable[..., tuple[tf.Tensor, tf.Tensor]]


def pad_to_bucket(ids: tf.Tensor, chunk_size: int, max_width: int, smallest_width: int, pad_id: int) -> tf.Tensor:
    """Pads a chunk of ids to the shape XLA compiles it for: its rows to the next `bucket_sizes(chunk_size)` size
    with copies of its last (longest) row, whose results the caller drops, and its width with `pad_id` to the next
    `bucket_sizes(max_width, smallest_width)` size.

    Example:

    >>> pad_to_bucket(tf.constant([[5, 6, 7]] * 3), chunk_size=8, max_width=16, smallest_width=4, pad_id=0).shape
    TensorShape([4, 4])
    """
    rows, width = tf.shape(ids)[0], tf.shape(ids)[1]
    bucket_rows = tf.gather(bucket_table(chunk_size, smallest=1), rows)
    bucket_width = tf.gather(bucket_table(max_width, smallest=smallest_width), width)
    ids = tf.concat([ids, tf.repeat(ids[-1:], bucket_rows - rows, axis=0)], 0)
    return tf.pad(ids, [[0, 0], [0, bucket_width - width]], constant_values=pad_id)


def pad_rows_to_bucket(values: tf.Tensor, chunk_size: int) -> tf.Tensor:
    """Pads a chunk's rows of any rank as `pad_to_bucket` pads its ids: to the next `bucket_sizes(chunk_size)`
    size, with copies of its last row.

    Example:

    >>> pad_rows_to_bucket(tf.zeros([3, 2, 5]), chunk_size=8).shape
    TensorShape([4, 2, 5])
    """
    rows = tf.shape(values)[0]
    bucket_rows = tf.gather(bucket_table(chunk_size, smallest=1), rows)
    return tf.concat([values, tf.repeat(values[-1:], bucket_rows - rows, axis=0)], 0)


def search_in_length_order(search: Search, source: tf.Tensor, num_return: int, *, chunk_size: int,
                           source_pad_id: int, target_pad_id: int, max_extra: int, max_source_length: int,
                           max_target_length: int, bucketed: bool, lanes: int,
                           target_prefix: tf.Tensor | None = None,
                           along: tuple[tf.Tensor, ...] = ()) -> tuple[tf.Tensor, tf.Tensor]:
    """`search` over `chunk_size` sentences at a time, shortest sources first, results in input order.

    Each chunk keeps only its own source width (padding never changes a
    result) and gets its own search loop, so it stops when its sentences
    are done; outputs are padded to the width one search over the whole
    batch gives, `min(S + max_extra, max_target_length)`. `bucketed` (XLA) pads
    chunks to bucketed shapes (`pad_to_bucket`); the chunks are dealt to `lanes`
    loops (chunk i to loop i % lanes). Each loop gathers its chunks' results in a
    TensorArray, concatenated once at the end (not the results so far copied at
    every chunk). A `target_prefix` `[N, P]` goes along, each chunk keeping its own width; so do the tensors of
    `along` (`[N, ...]` each, a sentence's constraints, say), whole, given to `search` after the prefix.

    Args:
        search: `search(source, target_prefix) -> (tokens [c, R, T], scores [c, R])` on one chunk
            (`target_prefix` None or `[c, P]`).
        source: int32 `[N, S]` source ids, padded with `source_pad_id`.
        num_return: R, hypotheses per sentence.

    Returns:
        `(tokens, scores)`: int32 `[N, R, T]` and float32 `[N, R]`, in input order.
    """
    pad = target_pad_id
    count, width = tf.shape(source)[0], tf.shape(source)[1]
    lengths = row_lengths(source, source_pad_id)
    order = tf.argsort(lengths, stable=True)  # (N,) shortest first
    ordered, ordered_lengths = tf.gather(source, order), tf.gather(lengths, order)
    ordered_along = [tf.gather(values, order) for values in along]
    out_width = tf.clip_by_value(width + max_extra, 1, max_target_length)
    if target_prefix is not None:  # every output holds its prefix and one more token
        ordered_prefix = tf.gather(target_prefix, order)  # (N, P)
        prefix_lengths = row_lengths(ordered_prefix, pad)
        out_width = tf.minimum(tf.maximum(out_width, tf.shape(target_prefix)[1] + 1), max_target_length)
    chunks = (count + chunk_size - 1) // chunk_size

    def body(i: tf.Tensor, all_tokens: tf.TensorArray, all_scores: tf.TensorArray,
             all_positions: tf.TensorArray) -> tuple[tf.Tensor, tf.TensorArray, tf.TensorArray, tf.TensorArray]:
        start = i * chunk_size
        end = tf.minimum(start + chunk_size, count)
        piece = ordered[start:end, :tf.maximum(ordered_lengths[end - 1], 1)]  # (c, S_chunk)
        forced = None
        if target_prefix is not None:  # (c, P_chunk)
            forced = ordered_prefix[start:end, :tf.reduce_max(prefix_lengths[start:end])]
        pieces = [values[start:end] for values in ordered_along]
        if bucketed:  # a few shapes, so a few XLA programs; padding never changes a result
            if forced is not None:
                forced = pad_to_bucket(forced, chunk_size, max_target_length, SMALLEST_PREFIX_BUCKET, target_pad_id)
            pieces = [pad_rows_to_bucket(values, chunk_size) for values in pieces]
            tokens, scores = search(pad_to_bucket(piece, chunk_size, max_source_length, SMALLEST_WIDTH_BUCKET,
                                                  source_pad_id), forced, *pieces)
            tokens, scores = tokens[:end - start], scores[:end - start]
        else:
            tokens, scores = search(piece, forced, *pieces)  # (c, R, T_c), (c, R)
        # A padded source width gives a wider buffer; past `out_width` it holds only padding.
        tokens = tf.pad(tokens, [[0, 0], [0, 0], [0, tf.maximum(out_width - tf.shape(tokens)[2], 0)]],
                        constant_values=pad)[:, :, :out_width]
        part = 1 + i // lanes  # this loop's part number
        return (i + lanes, all_tokens.write(part, tokens), all_scores.write(part, scores),
                all_positions.write(part, tf.range(start, end)))

    results = []
    for lane in range(lanes):  # lane j decodes chunks j, j + lanes, ...: independent loops
        start = (tf.constant(lane), result_parts(tf.zeros([0, num_return, out_width], tf.int32)),
                 result_parts(tf.zeros([0, num_return], tf.float32)), result_parts(tf.zeros([0], tf.int32)))
        results.append([parts.concat() for parts in tf.while_loop(lambda i, *_: i < chunks, body, start)[1:]])
    tokens, scores, positions = (tf.concat(lane_parts, 0) for lane_parts in zip(*results))  # in lane order
    # Row k holds the sentence at length-order position positions[k], input position order[positions[k]].
    inverse = tf.math.invert_permutation(tf.gather(order, positions))
    tokens, scores = tf.gather(tokens, inverse), tf.gather(scores, inverse)
    return tokens, scores


def score_in_length_order(score: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], source: tf.Tensor, target: tf.Tensor,
                          *, chunk_size: int, source_pad_id: int, target_pad_id: int, parallel: int) -> tf.Tensor:
    """`score` over `chunk_size` pairs at a time, shortest targets first, scores in input order.

    Each chunk keeps only its own source and target widths, so a pass holds
    `(chunk_size, T_chunk, vocabulary)` float32 logits per model whatever
    the batch size, and at most `parallel` passes run at once (with
    as many inter-op threads). The scores are those of one pass over the
    batch, to float rounding (padding changes no score).

    Args:
        score: `score(source [c, S], target [c, T]) -> float32 [c]` on one chunk.
        source, target: int32 `[N, S]` and `[N, T]` ids, padded with their pad ids.

    Returns:
        float32 `[N]`, in input order.
    """
    count = tf.shape(source)[0]
    source_lengths = row_lengths(source, source_pad_id)
    target_lengths = row_lengths(target, target_pad_id)
    order = tf.argsort(target_lengths, stable=True)  # (N,) shortest targets first
    source, target = tf.gather(source, order), tf.gather(target, order)
    source_lengths, target_lengths = tf.gather(source_lengths, order), tf.gather(target_lengths, order)
    chunks = (count + chunk_size - 1) // chunk_size

    def body(i: tf.Tensor, all_scores: tf.TensorArray) -> tuple[tf.Tensor, tf.TensorArray]:
        start = i * chunk_size
        end = tf.minimum(start + chunk_size, count)
        piece_source = source[start:end, :tf.reduce_max(source_lengths[start:end])]  # (c, S_chunk)
        piece_target = target[start:end, :target_lengths[end - 1]]  # (c, T_chunk)
        return i + 1, all_scores.write(i + 1, score(piece_source, piece_target))

    _, all_scores = tf.while_loop(lambda i, _: i < chunks, body, (tf.constant(0), result_parts(tf.zeros([0]))),
                                  parallel_iterations=parallel)
    return tf.gather(all_scores.concat(), tf.math.invert_permutation(order))  # (N,) in input order
