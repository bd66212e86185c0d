"""Token-budget batching plans, in numpy only: shared by the tf.data pipeline and the packed-array trainer.

`keras_transformer.packed.training` trains on machines without TensorFlow, so what both
paths need to agree on lives here, free of TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def batch_plan(lengths: ArrayLike, tokens_per_batch: int, bucket_width: int = 1,
               num_replicas: int = 1) -> tuple[np.ndarray, list[int], int]:
    """How a corpus sorted by length is cut into token-budget batches.

    Pairs are sorted by bucket (``(length - shortest) // bucket_width``) and
    cut greedily into consecutive runs: a run takes pairs while ``pairs x L``
    stays within the budget, where ``L`` is the longest length a bucket in it
    allows (its upper bound), and is cut earlier to a multiple of
    `num_replicas`. The pairs a bucket has left over after its last full
    batch fill the next batch together with the next bucket's pairs, so every
    batch is full except the last of an epoch, whatever the number of buckets.
    What remains at the end, fewer than `num_replicas` of the longest pairs, is
    skipped. The cut depends only on the lengths, so the batch count is known
    before the first epoch; which pairs of one bucket share a batch is up to the
    order the sort starts from (shuffled each epoch in training).

    Args:
        lengths: int array, each pair's length in positions (the longer side).
        tokens_per_batch: the budget, positions per side and batch.
        bucket_width: lengths per bucket; 1 sorts by exact length (least padding).
        num_replicas: batch sizes are multiples of this.

    Returns:
        ``(buckets, sizes, skipped)``: each pair's bucket (the sort key), the
        pairs per batch in sorted order, and how many pairs at the end are left
        out (``len(lengths) - sum(sizes)``).

    Raises:
        ValueError: the budget cannot hold `num_replicas` pairs of the longest bucket.

    Example:

    >>> buckets, sizes, skipped = batch_plan([3, 4, 5, 5, 6, 6, 6], tokens_per_batch=12, bucket_width=2)
    >>> buckets.tolist(), sizes, skipped
    ([0, 0, 1, 1, 1, 1, 1], [2, 2, 2, 1], 0)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    shortest, longest = int(lengths.min()), int(lengths.max())
    buckets = (lengths - shortest) // bucket_width
    uppers = np.minimum(shortest + (np.arange(int(buckets.max()) + 1) + 1) * bucket_width - 1, longest)
    if tokens_per_batch < num_replicas * longest:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} cannot hold {num_replicas} pair(s) of the longest length {longest}; "
            f"raise tokens_per_batch to at least {num_replicas * longest} or lower max_length.")
    sizes, open_batch = [], 0  # pairs in the batch being filled
    for upper, count in zip(uppers.tolist(), np.bincount(buckets).tolist()):
        capacity = tokens_per_batch // upper // num_replicas * num_replicas
        while count:
            if open_batch >= capacity:  # the open batch has no room for pairs this long: close it
                closed = open_batch // num_replicas * num_replicas
                sizes.append(closed)
                open_batch -= closed
            taken = min(capacity - open_batch, count)
            open_batch, count = open_batch + taken, count - taken
            if open_batch == capacity:
                sizes.append(open_batch)
                open_batch = 0
    closed = open_batch // num_replicas * num_replicas
    if closed:
        sizes.append(closed)
    return buckets, sizes, open_batch - closed

