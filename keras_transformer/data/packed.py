"""Packed token ids: the `arrays.npz` of a packed workdir and the token-budget batches built from it, in numpy.

`keras-transformer pack` writes a workdir's tokenized training and validation
pairs here; the packed-array trainer (`keras_transformer.arrays`) and
distillation (`keras_transformer.distillation`) read them on any backend, with
no TensorFlow.

Batches: a pair's length is its longer side plus one (eos / bos), rounded up
to a multiple of `length_multiple`; the pairs are sorted by it and cut into
token-budget batches as the tf.data pipeline cuts them (`data.batching.batch_plan`):
a batch of width L (its longest rounded length) holds at most
`tokens_per_batch // L` pairs, and a width's leftover pairs start the next
batch, so only the epoch's last batch is partial. Batch widths are therefore
few (one per L), and with `pad_rows` so are the shapes, which is what XLA
needs: each new shape compiles once.
"""

import os
import pathlib

import numpy as np

from keras_transformer.data.batching import batch_plan
from keras_transformer.files import atomic_write

ARRAYS_FILE = "arrays.npz"
_SPLITS = ("train", "valid")


# ------------------------------------------------------------------ packing format
def ragged_to_arrays(sequences):
    """`[array, ...]` -> `(values, lengths)`: the packed form stored in `arrays.npz`.

    Example:

    >>> values, lengths = ragged_to_arrays([[5, 6], [7]])
    >>> values.tolist(), lengths.tolist()
    ([5, 6, 7], [2, 1])
    """
    lengths = np.array([len(s) for s in sequences], dtype=np.int32)
    values = (np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences]) if len(sequences)
              else np.zeros((0,), np.int32))
    return values.astype(np.int32), lengths


def arrays_to_ragged(values, lengths):
    """The inverse of `ragged_to_arrays`: a list of int32 arrays.

    Example:

    >>> [s.tolist() for s in arrays_to_ragged(np.array([5, 6, 7]), np.array([2, 1]))]
    [[5, 6], [7]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.sum() != len(values):
        raise ValueError(f"Packed arrays disagree: the lengths add up to {int(lengths.sum())} ids but there are "
                         f"{len(values)} values.")
    return np.split(np.asarray(values, dtype=np.int32), np.cumsum(lengths)[:-1]) if len(lengths) else []


def save_arrays(path, splits):
    """Writes `{"train": (sources, targets), "valid": (...)}` (lists of id arrays) to an `.npz` file."""
    arrays = {}
    for split, (sources, targets) in splits.items():
        if len(sources) != len(targets):
            raise ValueError(f"{split}: {len(sources)} source and {len(targets)} target sequences.")
        for side, sequences in (("source", sources), ("target", targets)):
            arrays[f"{split}_{side}_values"], arrays[f"{split}_{side}_lengths"] = ragged_to_arrays(sequences)
    atomic_write(path, lambda temporary: np.savez_compressed(temporary, **arrays))


def load_arrays(path):
    """Reads an `arrays.npz`: `{"train": (sources, targets), "valid": (...)}`, splits that are present."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No packed data at {path}: run `keras-transformer pack --config ... "
                                f"--workdir {path.parent}` where TensorFlow is installed first.")
    with np.load(path) as data:
        splits = {}
        for split in _SPLITS:
            if f"{split}_source_values" in data:
                splits[split] = tuple(arrays_to_ragged(data[f"{split}_{side}_values"], data[f"{split}_{side}_lengths"])
                                      for side in ("source", "target"))
    if "train" not in splits:
        raise ValueError(f"{path} holds no training pairs (train_source_values).")
    return splits


# ------------------------------------------------------------------ batches
def make_batches(sources, targets, tokens_per_batch, *, length_multiple=8, pad_id=0, bos_id=2, eos_id=3,
                 rng=None, pad_rows=False, teacher=None, return_indices=False):
    """Token-budget batches of `(source, target_input, labels)` int32 arrays, as the TensorFlow pipeline forms them.

    Each pair becomes source = tokens + eos, target input = bos + tokens,
    labels = tokens + eos. Pairs are sorted by their rounded length (longer
    side + 1, rounded up to `length_multiple`) and cut into consecutive
    batches by `data.batching.batch_plan`: a batch whose longest rounded length
    is L holds at most `tokens_per_batch // L` pairs, padded with `pad_id` to
    width L on both sides, and the pairs a width has left over start the next
    batch, so every batch but the last is full. With `rng`, pairs are shuffled
    before the (stable) sort, so which pairs of one width share a batch
    changes, and the batches' order is shuffled; without, the order is
    deterministic (validation). With `pad_rows`, a batch with fewer pairs is
    filled up with rows of padding (which the loss and the metrics ignore), so
    every batch of width L has the same shape and XLA compiles one step per width.

    Args:
        sources, targets: lists of int id arrays (no bos/eos), aligned.
        tokens_per_batch: most positions per side in one batch, padding included.
        length_multiple: batch widths are multiples of it (few shapes for XLA).
        pad_id, bos_id, eos_id: special ids.
        rng: a `numpy.random.Generator` to shuffle with, or None.
        pad_rows: give every batch of one width the same number of rows.
        teacher: optional `(ids, probabilities)` of `distillation.teacher_top_k`
            (one `(len(target) + 1, k)` array each per pair): the labels become
            the packed float32 `(B, L, 1 + 2k)` of `distillation.pack_labels`.
        return_indices: also return, per batch, the indices of its pairs.

    Returns:
        A list of `(source (B, L), target_input (B, L), labels (B, L))`; with
        `return_indices`, `(batches, indices)`.

    Raises:
        ValueError: misaligned inputs, or a pair longer than `tokens_per_batch`.

    Example:

    >>> [b[1].tolist() for b in make_batches([[7], [8, 9]], [[5], [6]], 16, length_multiple=4)]
    [[[2, 5, 0, 0], [2, 6, 0, 0]]]
    """
    if len(sources) != len(targets):
        raise ValueError(f"make_batches: {len(sources)} source but {len(targets)} target sequences.")
    if teacher is not None and not (len(teacher[0]) == len(teacher[1]) == len(targets)):
        raise ValueError(f"make_batches: {len(targets)} pairs but teacher distributions for {len(teacher[0])}.")
    if not len(sources):
        return ([], []) if return_indices else []
    multiple = max(1, int(length_multiple))
    lengths = np.maximum([len(s) for s in sources], [len(t) for t in targets]) + 1
    widths = -(-lengths // multiple) * multiple
    if widths.max() > tokens_per_batch:
        longest = int(np.argmax(widths))
        raise ValueError(f"Pair {longest} needs {int(widths[longest])} positions (rounded to a multiple of "
                         f"{multiple}), more than tokens_per_batch={tokens_per_batch}.")
    order = rng.permutation(len(widths)) if rng is not None else np.arange(len(widths))
    order = order[np.argsort(widths[order], kind="stable")]
    _, sizes, _ = batch_plan(widths, int(tokens_per_batch))
    batches, indices = [], []
    for chunk in np.split(order, np.cumsum(sizes)[:-1]):
        width = int(widths[chunk[-1]])  # sorted: the last pair is the widest
        rows = int(tokens_per_batch) // width if pad_rows else len(chunk)
        source = np.full((rows, width), pad_id, np.int32)
        target_input = np.full((rows, width), pad_id, np.int32)
        labels = np.full((rows, width), pad_id, np.int32)
        for row, index in enumerate(chunk):
            s, t = sources[index], targets[index]
            source[row, :len(s)] = s
            source[row, len(s)] = eos_id
            target_input[row, 0] = bos_id
            target_input[row, 1:len(t) + 1] = t
            labels[row, :len(t)] = t
            labels[row, len(t)] = eos_id
        if teacher is not None:
            k = teacher[0][chunk[0]].shape[-1]
            ids, probabilities = np.zeros((rows, width, k), np.int32), np.zeros((rows, width, k), np.float32)
            for row, index in enumerate(chunk):
                n = len(targets[index]) + 1
                ids[row, :n], probabilities[row, :n] = teacher[0][index], teacher[1][index]
            labels = pack_labels(labels, ids, probabilities)
        batches.append((source, target_input, labels))
        indices.append(chunk)
    if rng is not None:
        order = rng.permutation(len(batches))
        batches, indices = [batches[i] for i in order], [indices[i] for i in order]
    return (batches, indices) if return_indices else batches


def pack_labels(labels, ids, probabilities):
    """`(B, T)` labels + `(B, T, k)` teacher ids and probabilities -> the float32 `(B, T, 1 + 2k)` labels.

    Example:

    >>> pack_labels(np.array([[4]]), np.array([[[4, 9]]]), np.array([[[0.75, 0.25]]])).tolist()
    [[[4.0, 4.0, 9.0, 0.75, 0.25]]]
    """
    return np.concatenate([np.asarray(labels, np.float32)[..., None], np.asarray(ids, np.float32),
                           np.asarray(probabilities, np.float32)], axis=-1)
