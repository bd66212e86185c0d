"""Packed token ids: the `arrays` folder of a packed workdir and the token-budget batches built from it, in numpy.

`keras-transformer pack` writes a workdir's tokenized training and validation
pairs here; the packed-array trainer (`keras_transformer.packed.training`) and
distillation (`keras-transformer distill-targets`) read them on any backend, with
no TensorFlow.

Storage: the folder ``arrays/`` holds, per split (``train``, ``valid``) and side
(``source``, ``target``), two ``.npy`` files: ``{split}_{side}_values.npy``
(every pair's ids, one after another, int32) and ``{split}_{side}_lengths.npy``
(ids per pair, int32). `ArraysWriter` writes them a chunk of pairs at a time and
renames the finished folder into place; `load_arrays` opens them with
``numpy.load(mmap_mode="r")``, so the ids stay on disk and only the pairs of the
batch being built are read (`PackedSequences`). What training holds in memory
grows by a few bytes per pair (lengths, offsets and the pass's order), never by
the ids. A folder packed before this format (one ``arrays.npz``, never released) is refused with one line:
packing it again writes ``arrays/``.

Batches: a pair's length is its longer side plus one (eos / bos), rounded up
to a multiple of `length_multiple`; the pairs are sorted by it and cut into
token-budget batches as the tf.data pipeline cuts them (`data.batching.batch_plan`):
a batch of width L (its longest rounded length) holds at most
`tokens_per_batch // L` pairs, and a width's leftover pairs start the next
batch, so only the epoch's last batch is partial. Batch widths are therefore
few (one per L), and with `pad_rows` so are the shapes, which is what XLA
needs: each new shape compiles once. `plan_batches` makes the cut (indices only)
and `assemble_batch` lays out one batch, so a trainer builds each batch when it
needs it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Iterator, Mapping, Sequence, Sized
from types import TracebackType
from typing import TYPE_CHECKING, TypeAlias, overload

import numpy as np

from keras_transformer.data.batching import batch_plan
from keras_transformer.files import fsync_file, replace_folder, staging_folder

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

# One sequence's ids; id sequences: a list of them, or the `PackedSequences` of `load_arrays`.
Ids: TypeAlias = "np.ndarray | Sequence[int]"
IdSequences: TypeAlias = "Sequence[Ids] | PackedSequences"
# `(source (B, L), target_input (B, L), labels (B, L))` int32 (labels float32 `(B, L, 1 + 2k)` with a teacher).
Batch: TypeAlias = tuple[np.ndarray, np.ndarray, np.ndarray]

ARRAYS_FILE = "arrays"  # the folder of .npy files in a packed workdir
OLD_ARRAYS_FILE = "arrays.npz"  # what unreleased versions packed: refused by name (pack again), removed by `pack`
_SPLITS = ("train", "valid")
_SIDES = ("source", "target")
_HEADER_BYTES = 128  # .npy version 1.0 header, padded: room for any shape, rewritten when the file is complete


# ------------------------------------------------------------------ packing format
def ragged_to_arrays(sequences: Sequence[Ids]) -> tuple[np.ndarray, np.ndarray]:
    """`[array, ...]` -> `(values, lengths)`: the packed form stored in `arrays/`.

    Example:

    >>> values, lengths = ragged_to_arrays([[5, 6], [7]])
    >>> values.tolist(), lengths.tolist()
    ([5, 6, 7], [2, 1])
    """
    lengths = np.array([len(s) for s in sequences], dtype=np.int32)
    values = (np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences]) if len(sequences)
              else np.zeros((0,), np.int32))
    return values.astype(np.int32), lengths


def arrays_to_ragged(values: np.ndarray, lengths: ArrayLike) -> list[np.ndarray]:
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


class PackedSequences:
    """Id sequences stored end to end (`values`) with their `lengths`: a read-only list of int32 arrays.

    `load_arrays` gives the values as a `numpy.memmap`, so indexing one pair
    reads its ids from disk (the page cache) and nothing else; the `lengths`
    are in memory for planning batches.

    Args:
        values: int32 ids of every sequence, one after another (an array or a memmap).
        lengths: ids per sequence.

    Example:

    >>> sequences = PackedSequences(np.array([5, 6, 7], np.int32), np.array([2, 1], np.int32))
    >>> len(sequences), sequences[1].tolist(), [s.tolist() for s in sequences]
    (2, [7], [[5, 6], [7]])
    """

    def __init__(self, values: np.ndarray, lengths: ArrayLike) -> None:
        self.values = values
        self.lengths = np.asarray(lengths, dtype=np.int32)
        self.offsets = np.zeros(len(self.lengths) + 1, np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        if self.offsets[-1] != len(values):
            raise ValueError(f"Packed arrays disagree: the lengths add up to {int(self.offsets[-1])} ids but there "
                             f"are {len(values)} values.")

    def __len__(self) -> int:
        return len(self.lengths)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"sequence {index} of {len(self)}")
        return np.asarray(self.values[self.offsets[index]:self.offsets[index + 1]])

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))


def sequence_lengths(sequences: Sequence[Sized] | PackedSequences) -> np.ndarray:
    """The lengths of a list of sequences, or a `PackedSequences`' own, without reading its ids.

    Example:

    >>> sequence_lengths([[5, 6], [7]]).tolist()
    [2, 1]
    """
    if isinstance(sequences, PackedSequences):
        return sequences.lengths
    return np.array([len(s) for s in sequences], dtype=np.int64)


class _NpyAppender:
    """A 1-D int32 `.npy` file written a chunk at a time: the header's shape is filled in by `close`."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path, self.count = path, 0
        self.handle = open(path, "wb")
        self.handle.write(self._header(0))

    @staticmethod
    def _header(count: int) -> bytes:
        text = repr({"descr": np.dtype(np.int32).str, "fortran_order": False, "shape": (count,)})
        size = _HEADER_BYTES - 10  # magic (6), version (2), header length (2)
        return (b"\x93NUMPY\x01\x00" + size.to_bytes(2, "little") + text.encode("latin1").ljust(size - 1)
                + b"\n")

    def append(self, values: ArrayLike) -> None:
        values = np.ascontiguousarray(values, dtype=np.int32)
        self.handle.write(values.tobytes())
        self.count += len(values)

    def close(self) -> None:
        self.handle.seek(0)
        self.handle.write(self._header(self.count))
        self.handle.close()
        fsync_file(self.path)


class ArraysWriter:
    """Writes a packed `arrays/` folder a chunk of pairs at a time, in a staging folder renamed into place.

    Memory holds one chunk: `add` appends its ids to the open files, and
    `close` completes the headers and puts the folder at `path` (an older
    folder there is replaced only then, by `files.replace_folder`). Leaving a
    ``with`` block by an exception removes the staging folder and leaves `path` as it was.

    Args:
        path: the folder to write (``WORKDIR/arrays``).

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "arrays"
    >>> with ArraysWriter(folder) as writer:
    ...     writer.add("train", [np.array([5, 6]), np.array([7])], [np.array([8]), np.array([9, 9])])
    ...     writer.add("train", [np.array([4])], [np.array([4])])
    >>> [s.tolist() for s in load_arrays(folder)["train"][1]]
    [[8], [9, 9], [4]]
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        self._staging = staging_folder(self.path)
        self._files: dict[str, _NpyAppender] = {}

    def add(self, split: str, sources: Sequence[Ids] | tuple[np.ndarray, np.ndarray],
            targets: Sequence[Ids] | tuple[np.ndarray, np.ndarray]) -> None:
        """Appends aligned pairs to `split`: lists of id arrays, or `(values, lengths)` pairs of arrays."""
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {_SPLITS}, got {split!r}.")
        packed = [side if isinstance(side, tuple) else ragged_to_arrays(side) for side in (sources, targets)]
        if len(packed[0][1]) != len(packed[1][1]):
            raise ValueError(f"{split}: {len(packed[0][1])} source and {len(packed[1][1])} target sequences.")
        for side, (values, lengths) in zip(_SIDES, packed):
            for kind, array in (("values", values), ("lengths", lengths)):
                name = f"{split}_{side}_{kind}"
                if name not in self._files:
                    self._files[name] = _NpyAppender(self._staging / f"{name}.npy")
                self._files[name].append(array)

    def close(self) -> pathlib.Path:
        """Completes the files and renames the folder into place; returns its path."""
        for appender in self._files.values():
            appender.close()
        return replace_folder(self._staging, self.path)

    def abort(self) -> None:
        """Removes what was written; `path` stays as it was."""
        for appender in self._files.values():
            appender.handle.close()
        shutil.rmtree(self._staging, ignore_errors=True)

    def __enter__(self) -> ArraysWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def save_arrays(path: str | os.PathLike[str],
                splits: Mapping[str, tuple[Sequence[Ids], Sequence[Ids]]]) -> pathlib.Path:
    """Writes `{"train": (sources, targets), "valid": (...)}` (lists of id arrays) as an `arrays/` folder.

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = save_arrays(folder / "arrays", {"train": ([[5, 6]], [[7]])})
    >>> sorted(p.name for p in (folder / "arrays").iterdir())  # doctest: +NORMALIZE_WHITESPACE
    ['train_source_lengths.npy', 'train_source_values.npy', 'train_target_lengths.npy',
     'train_target_values.npy']
    """
    path = pathlib.Path(path)
    for split, (sources, targets) in splits.items():
        if len(sources) != len(targets):
            raise ValueError(f"{split}: {len(sources)} source and {len(targets)} target sequences.")
    with ArraysWriter(path) as writer:
        for split, (sources, targets) in splits.items():
            writer.add(split, sources, targets)
    return path


def arrays_path(workdir: str | os.PathLike[str]) -> pathlib.Path | None:
    """Where a packed workdir keeps its pairs, `arrays/`; None if it has none.

    Example:

    >>> import tempfile
    >>> arrays_path(tempfile.mkdtemp()) is None
    True
    """
    path = pathlib.Path(workdir) / ARRAYS_FILE
    return path if path.exists() else None


def check_not_unreleased_format(workdir: str | os.PathLike[str]) -> None:
    """Raises `FileNotFoundError`, saying to pack again, for a workdir without `arrays/` that holds the
    `arrays.npz` of an unreleased version.

    Example:

    >>> import tempfile
    >>> check_not_unreleased_format(tempfile.mkdtemp())
    """
    workdir = pathlib.Path(workdir)
    if not (workdir / ARRAYS_FILE).is_dir() and (workdir / OLD_ARRAYS_FILE).is_file():
        raise FileNotFoundError(f"{workdir / OLD_ARRAYS_FILE} was packed by an unreleased version of "
                                "keras_transformer, which is no longer read: run `keras-transformer pack --config ... "
                                f"--workdir {workdir}` again.")


def load_arrays(path: str | os.PathLike[str]) -> dict[str, tuple[PackedSequences, PackedSequences]]:
    """Reads packed pairs: `{"train": (sources, targets), "valid": (...)}` of `PackedSequences`, splits present.

    Args:
        path: an `arrays/` folder (its ids memory-mapped, read from disk as
            batches need them), or a packed workdir holding one.

    Raises:
        FileNotFoundError: nothing packed at `path`, or an unreleased version's ``arrays.npz`` (the message says
            how to pack).
        ValueError: the files disagree, or hold no training pairs.
    """
    path = pathlib.Path(path)
    if path.is_dir() and not (path / "train_source_values.npy").is_file():
        path = arrays_path(path) or path / ARRAYS_FILE
    if not path.is_dir():
        check_not_unreleased_format(path.parent if path.name in (ARRAYS_FILE, OLD_ARRAYS_FILE) else path)
    if not path.exists():
        raise FileNotFoundError(f"No packed data at {path}: run `keras-transformer pack --config ... "
                                f"--workdir {path.parent}` where TensorFlow is installed first.")
    splits: dict[str, tuple[PackedSequences, PackedSequences]] = {}
    for split in _SPLITS:
        if (path / f"{split}_source_values.npy").is_file():
            sources, targets = (PackedSequences(np.load(path / f"{split}_{side}_values.npy", mmap_mode="r"),
                                                np.load(path / f"{split}_{side}_lengths.npy"))
                                for side in _SIDES)
            splits[split] = (sources, targets)
    if "train" not in splits:
        raise ValueError(f"{path} holds no training pairs (train_source_values).")
    for split, (sources, targets) in splits.items():
        if len(sources) != len(targets):
            raise ValueError(f"{path}: {split} has {len(sources)} source but {len(targets)} target sequences.")
    return splits


# ------------------------------------------------------------------ batches
def make_batches(sources: IdSequences, targets: IdSequences, tokens_per_batch: int, *, length_multiple: int = 8,
                 pad_id: int = 0, bos_id: int = 2, eos_id: int = 3, rng: np.random.Generator | None = None,
                 pad_rows: bool = False, teacher: tuple[Sequence[np.ndarray], Sequence[np.ndarray]] | None = None,
                 return_indices: bool = False) -> list[Batch] | tuple[list[Batch], list[np.ndarray]]:
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
    plan = plan_batches(sequence_lengths(sources), sequence_lengths(targets), tokens_per_batch,
                        length_multiple=length_multiple, rng=rng, pad_rows=pad_rows)
    batches = [assemble_batch(sources, targets, indices, width, rows, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
                              teacher=teacher) for indices, width, rows in plan]
    return (batches, [indices for indices, _, _ in plan]) if return_indices else batches


def plan_batches(source_lengths: ArrayLike, target_lengths: ArrayLike, tokens_per_batch: int, *,
                 length_multiple: int = 8, rng: np.random.Generator | None = None,
                 pad_rows: bool = False) -> list[tuple[np.ndarray, int, int]]:
    """The cut `make_batches` makes, without the ids: `(indices, width, rows)` of each batch, in training order.

    Needs only each pair's lengths, so a pass over a corpus of any size is
    planned in a few bytes per pair; `assemble_batch` then reads one batch's
    pairs. With `rng`, the random numbers are drawn as `make_batches` draws them.

    Args:
        source_lengths, target_lengths: ids per pair (no bos/eos).
        tokens_per_batch, length_multiple, rng, pad_rows: as in `make_batches`.

    Returns:
        A list of `(indices, width, rows)`: the batch's pair indices (int array),
        its width in positions and its number of rows (padding rows included).

    Raises:
        ValueError: a pair longer than `tokens_per_batch`.

    Example:

    >>> [(indices.tolist(), width, rows) for indices, width, rows in plan_batches([1, 2, 9], [1, 1, 1], 16)]
    [([0, 1], 8, 2), ([2], 16, 1)]
    """
    source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
    if not len(source_lengths):
        return []
    multiple = max(1, int(length_multiple))
    lengths = np.maximum(source_lengths, target_lengths).astype(np.int64) + 1
    widths = -(-lengths // multiple) * multiple
    if widths.max() > tokens_per_batch:
        longest = int(np.argmax(widths))
        raise ValueError(f"Pair {longest} needs {int(widths[longest])} positions (rounded to a multiple of "
                         f"{multiple}), more than tokens_per_batch={tokens_per_batch}.")
    order = rng.permutation(len(widths)) if rng is not None else np.arange(len(widths))
    order = order[np.argsort(widths[order], kind="stable")]
    _, sizes, _ = batch_plan(widths, int(tokens_per_batch))
    plan = []
    for chunk in np.split(order, np.cumsum(sizes)[:-1]):
        width = int(widths[chunk[-1]])  # sorted: the last pair is the widest
        plan.append((chunk, width, int(tokens_per_batch) // width if pad_rows else len(chunk)))
    if rng is not None:
        plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan


def assemble_batch(sources: IdSequences, targets: IdSequences, indices: Sequence[int] | np.ndarray, width: int,
                   rows: int, *, pad_id: int = 0, bos_id: int = 2, eos_id: int = 3,
                   teacher: tuple[Sequence[np.ndarray], Sequence[np.ndarray]] | None = None) -> Batch:
    """One batch of `plan_batches`: `(source, target_input, labels)` int32 arrays `(rows, width)` of the pairs
    `indices` (source + eos, bos + target, target + eos), padded with `pad_id`; with `teacher`, the labels are
    packed with the teacher's distributions as in `make_batches`.

    Example:

    >>> source, target_input, labels = assemble_batch([[7, 8]], [[5]], [0], 4, 2)
    >>> source.tolist(), target_input.tolist(), labels.tolist()
    ([[7, 8, 3, 0], [0, 0, 0, 0]], [[2, 5, 0, 0], [0, 0, 0, 0]], [[5, 3, 0, 0], [0, 0, 0, 0]])
    """
    source = np.full((rows, width), pad_id, np.int32)
    target_input = np.full((rows, width), pad_id, np.int32)
    labels = np.full((rows, width), pad_id, np.int32)
    for row, index in enumerate(indices):
        s, t = sources[index], targets[index]
        source[row, :len(s)] = s
        source[row, len(s)] = eos_id
        target_input[row, 0] = bos_id
        target_input[row, 1:len(t) + 1] = t
        labels[row, :len(t)] = t
        labels[row, len(t)] = eos_id
    if teacher is not None:
        k = teacher[0][indices[0]].shape[-1]
        ids, probabilities = np.zeros((rows, width, k), np.int32), np.zeros((rows, width, k), np.float32)
        for row, index in enumerate(indices):
            n = len(targets[index]) + 1
            ids[row, :n], probabilities[row, :n] = teacher[0][index], teacher[1][index]
        labels = pack_labels(labels, ids, probabilities)
    return source, target_input, labels


def pack_labels(labels: ArrayLike, ids: ArrayLike, probabilities: ArrayLike) -> np.ndarray:
    """`(B, T)` labels + `(B, T, k)` teacher ids and probabilities -> the float32 `(B, T, 1 + 2k)` labels.

    Example:

    >>> pack_labels(np.array([[4]]), np.array([[[4, 9]]]), np.array([[[0.75, 0.25]]])).tolist()
    [[[4.0, 4.0, 9.0, 0.75, 0.25]]]
    """
    return np.concatenate([np.asarray(labels, np.float32)[..., None], np.asarray(ids, np.float32),
                           np.asarray(probabilities, np.float32)], axis=-1)
