"""Word-level knowledge distillation: one model trained towards an ensemble's next-token distributions.

An ensemble of several runs translates better than any one of them
(history/experiments.md, "Ensembles of the trained runs") but costs each member's decoding. Distillation moves
part of that gain into a single model (Hinton et al. 2015; for translation,
"word-level" distillation in Kim and Rush 2016): the student is trained on the
usual references, and at every target position also towards the teachers'
mean distribution over the next token, given the reference prefix (teacher
forcing), so no decoding of the training set is needed.

Two steps, on any Keras backend (this module imports only keras and numpy):

1. `teacher_top_k` runs the teachers over a packed workdir's training pairs
   once and keeps, for every target position, the `top_k` most likely ids of
   the members' mean distribution and their probabilities;
   `save_teacher` writes them to `WORKDIR/teacher.npz`
   (`keras-transformer distill-targets WORKDIR --member DIR CKPT ...`).
2. `packed.training.train_arrays(WORKDIR, teacher=..., distill_weight=w)` (or
   `keras-transformer train-packed WORKDIR --teacher WORKDIR/teacher.npz`)
   trains with `DistillationLoss`: per target token,
   `(1 - w) * label-smoothed cross-entropy(reference) + w * cross-entropy(teacher)`,
   the teacher's top-k probabilities renormalized to sum to one.

Batches carry the teacher in their labels: a float32 `(B, T, 1 + 2k)` array of
`[label, k teacher ids, k teacher probabilities]` per position
(`pack_labels`); plain `(B, T)` int labels (validation) give the ordinary
label-smoothed loss, so validation losses compare with undistilled runs.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_transformer import decoding
from keras_transformer.config import TransformerConfig
from keras_transformer.files import atomic_write
from keras_transformer.packed.data import IdSequences, load_arrays, make_batches
from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy, smoothed_cross_entropy
from keras_transformer.trainer.metrics import MaskedAccuracy
from keras_transformer.workdir.checkpoints import load_models
from keras_transformer.workdir.layout import WORKDIR_VOCAB, folder_files

log = logging.getLogger(__name__)

TEACHER_FILE = "teacher.npz"


# ------------------------------------------------------------------ the teachers' distributions
def teacher_top_k(models: Any, sources: IdSequences, targets: IdSequences, *, top_k: int = 8,
                  tokens_per_batch: int = 8192, pad_id: int = 0, bos_id: int = 2,
                  eos_id: int = 3) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The teachers' mean next-token distribution at every target position, truncated to its `top_k` ids.

    Each pair is fed as training feeds it (source + eos; bos + target), every
    member in inference mode; the members' softmax outputs are averaged (the
    distribution ensemble decoding uses, `decoding.beam_search`).

    Args:
        models: one `build_model` model or a list of them sharing the vocabulary
            (checked as `decoding.ensemble_members` does).
        sources, targets: lists of id arrays (no bos/eos), as in `arrays/` (`packed.data.load_arrays`).
        top_k: ids kept per position.
        tokens_per_batch: positions per side in one forward batch.
        pad_id, bos_id, eos_id: special ids.

    Returns:
        `(ids, probabilities)`: two lists with one array per pair, of shape
        `(len(target) + 1, top_k)` (the last row predicts eos), int32 and
        float32, most likely first.

    Raises:
        ValueError: `top_k` out of range, or members that disagree.

    Example:

    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> ids, probabilities = teacher_top_k([model], [[5, 6]], [[7, 8, 9]], top_k=4)
    >>> ids[0].shape, probabilities[0].shape
    ((4, 4), (4, 4))
    """

    members = decoding.ensemble_members(models)
    vocab_size = int(members[0].outputs[0].shape[-1])
    if not 1 <= int(top_k) <= vocab_size:
        raise ValueError(f"top_k must be between 1 and the vocabulary size {vocab_size}, got {top_k}.")
    top_k = int(top_k)
    made = make_batches(sources, targets, tokens_per_batch, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
                        return_indices=True)
    assert isinstance(made, tuple)  # with return_indices: (batches, each batch's pair indices)
    batches, chunks = made
    ids: list[Any]
    probabilities: list[Any]
    ids, probabilities = [None] * len(targets), [None] * len(targets)
    for number, ((source, target_input, _), chunk) in enumerate(zip(batches, chunks)):
        mean: Any = 0.0  # the members' mean distribution, (B, T, V)
        for model in members:  # called directly: a compiled step would retrace for every batch shape
            logits = ops.convert_to_numpy(ops.cast(model({"source": source, "target": target_input}, training=False),
                                                   "float32"))
            logits -= logits.max(-1, keepdims=True)
            np.exp(logits, out=logits)
            mean = mean + logits / logits.sum(-1, keepdims=True)
        mean = mean / len(members)
        if (number + 1) % 20 == 0 or number + 1 == len(batches):
            log.info("teacher: %d of %d batches", number + 1, len(batches))
        best = np.argpartition(-mean, top_k - 1, axis=-1)[..., :top_k]
        best_p = np.take_along_axis(mean, best, axis=-1)
        order = np.argsort(-best_p, axis=-1, kind="stable")
        best, best_p = np.take_along_axis(best, order, -1), np.take_along_axis(best_p, order, -1)
        for row, index in enumerate(chunk):
            n = len(targets[index]) + 1
            ids[index] = best[row, :n].astype(np.int32)
            probabilities[index] = best_p[row, :n].astype(np.float32)
    return ids, probabilities


def save_teacher(path: str | os.PathLike[str], ids: Sequence[np.ndarray], probabilities: Sequence[np.ndarray],
                 **metadata: Any) -> None:
    """Writes `teacher_top_k`'s output to an `.npz` file (probabilities as float16), with JSON `metadata`."""

    if len(ids) != len(probabilities):
        raise ValueError(f"save_teacher: {len(ids)} id arrays but {len(probabilities)} probability arrays.")
    lengths = np.array([len(i) for i in ids], np.int32)
    k = ids[0].shape[-1] if len(ids) else 0
    values: dict[str, Any]  # numpy's stubs would read a dict of arrays as savez's allow_pickle too
    values = {"lengths": lengths,
              "ids": np.concatenate(ids).astype(np.int32) if len(ids) else np.zeros((0, k), np.int32),
              "probabilities": (np.concatenate(probabilities).astype(np.float16) if len(ids)
                                else np.zeros((0, k), np.float16)),
              "metadata": np.array(json.dumps(metadata))}
    atomic_write(path, lambda temporary: np.savez_compressed(open(temporary, "wb"), **values))


def load_teacher(path: str | os.PathLike[str], targets: IdSequences | None = None,
                 ) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    """Reads a `save_teacher` file: `(ids, probabilities, metadata)`, lists of per-pair arrays.

    Args:
        path: the `.npz` file.
        targets: the training targets it must match (one row per target
            token plus eos), or None not to check.

    Raises:
        FileNotFoundError: no such file.
        ValueError: it does not match `targets` (another workdir's teacher).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No teacher distributions at {path}: run `keras-transformer distill-targets "
                                f"WORKDIR --member DIR CHECKPOINT ...` first.")
    with np.load(path) as data:
        lengths, ids, probabilities = data["lengths"], data["ids"], data["probabilities"].astype(np.float32)
        metadata = json.loads(str(data["metadata"]))
    if targets is not None:
        expected = np.array([len(t) + 1 for t in targets])
        if len(expected) != len(lengths) or not np.array_equal(expected, lengths):
            raise ValueError(f"{path} does not match these training pairs ({len(lengths)} pairs in the file, "
                             f"{len(expected)} here, or other lengths): it was made for another workdir's data.")
    cuts = np.cumsum(lengths)[:-1]
    return np.split(ids, cuts), np.split(probabilities, cuts), metadata


def unpack_labels(y_true: Any) -> tuple[Any, Any, Any]:
    """Packed labels (`pack_labels`) -> `(labels int32 (B, T), ids int32 (B, T, k), probabilities float32 (B, T, k))`.

    Example:

    >>> from keras_transformer.packed.data import pack_labels
    >>> labels, ids, probabilities = unpack_labels(pack_labels([[4]], [[[4, 9]]], [[[0.75, 0.25]]]))
    >>> [ops.convert_to_numpy(x).tolist() for x in (labels, ids, probabilities)]
    [[[4]], [[[4, 9]]], [[[0.75, 0.25]]]]
    """
    k = (int(y_true.shape[-1]) - 1) // 2
    return (ops.cast(y_true[..., 0], "int32"), ops.cast(y_true[..., 1:1 + k], "int32"),
            ops.cast(y_true[..., 1 + k:], "float32"))


# ------------------------------------------------------------------ loss and metric
@keras.saving.register_keras_serializable(package="keras_transformer")
class DistillationLoss(LabelSmoothedCrossEntropy):
    """`(1 - w) * label-smoothed CE(reference) + w * CE(teacher's top-k distribution)`, per non-pad token.

    With packed labels (`pack_labels`) both terms are used; with plain int
    labels the loss is `LabelSmoothedCrossEntropy`'s, so validation losses
    stay comparable. The teacher term is the cross-entropy
    `-sum_j p_j log q(id_j)` with the top-k probabilities renormalized; it
    differs from the KL divergence by the teacher's entropy, a constant, so
    the gradients are the same.

    Args:
        label_smoothing: eps of the reference term.
        distill_weight: w in [0, 1].
        pad_id: label id excluded from the loss.

    Example:

    >>> logits = np.log(np.array([[[0.5, 0.25, 0.25]]], "float32"))
    >>> from keras_transformer.packed.data import pack_labels
    >>> y = pack_labels([[1]], [[[2]]], [[[1.0]]])
    >>> round(float(DistillationLoss(0.0, 0.5)(y, logits)), 4)  # (log 4 + log 4) / 2
    1.3863
    """

    def __init__(self, label_smoothing: float = 0.1, distill_weight: float = 0.5, pad_id: int = 0,
                 name: str = "distillation_loss", **kwargs: Any) -> None:
        super().__init__(label_smoothing, pad_id=pad_id, name=name, **kwargs)
        if not 0.0 <= float(distill_weight) <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight}.")
        self.distill_weight = float(distill_weight)

    def labels(self, y_true: Any) -> Any:
        """The reference ids `(B, T)` of plain or packed labels."""
        return ops.cast(y_true, "int32") if len(y_true.shape) == 2 else unpack_labels(y_true)[0]

    def call(self, y_true: Any, y_pred: Any) -> Any:
        """Per-token losses `(B, T)` (pads included; `__call__` masks them)."""
        if len(y_true.shape) == 2:
            return smoothed_cross_entropy(y_true, y_pred, self.label_smoothing)
        labels, ids, probabilities = unpack_labels(y_true)
        probabilities = probabilities / ops.maximum(ops.sum(probabilities, axis=-1, keepdims=True), 1e-9)
        # Both terms in one pass, with the gradient written out (losses.smoothed_cross_entropy):
        # autodiff of a separate log-softmax and gather made a distilled step 1.31x a plain one
        # (bench/distillation_step.py; fused: 1.07x).
        return smoothed_cross_entropy(labels, y_pred, self.label_smoothing, ids, probabilities,
                                      self.distill_weight)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        per_token = self.call(y_true, y_pred)
        return self.masked_mean(per_token, self.labels(y_true), sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "distill_weight": self.distill_weight}


@keras.saving.register_keras_serializable(package="keras_transformer")
class DistillationAccuracy(MaskedAccuracy):
    """`MaskedAccuracy` against the reference ids of plain or packed (`pack_labels`) labels."""

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        labels = y_true if len(y_true.shape) == 2 else unpack_labels(y_true)[0]
        return super().update_state(labels, y_pred, sample_weight)


# ------------------------------------------------------------------ the teacher file of a workdir
def _load_member(workdir: str | os.PathLike[str], checkpoint: Any) -> Any:
    return load_models(workdir, checkpoint)[0][0]


def _vocabulary(workdir: str | os.PathLike[str]) -> dict[str, bytes]:
    return folder_files(pathlib.Path(workdir) / WORKDIR_VOCAB)


def make_teacher(workdir: str | os.PathLike[str], members: Sequence[tuple[str | os.PathLike[str], Any]], *,
                 top_k: int = 8, tokens_per_batch: int = 8192,
                 output: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Writes the teachers' top-k distributions over `workdir`'s training pairs to `workdir/teacher.npz`.

    Args:
        workdir: a packed workdir (`keras-transformer pack`), the student's.
        members: `[(teacher_workdir, checkpoint), ...]`; each teacher's
            `data/vocab` must equal the student's.
        top_k, tokens_per_batch: as in `teacher_top_k`.
        output: default `workdir/teacher.npz`.

    Returns:
        A dict: `path`, `pairs`, `positions`, `coverage` (mean top-k
        probability mass), `agreement` (how often the teachers' most likely id is the reference).

    Raises:
        FileNotFoundError / ValueError: a missing file, or a teacher with another vocabulary (named).
    """
    workdir = pathlib.Path(workdir)
    if not members:
        raise ValueError("make_teacher needs at least one --member WORKDIR CHECKPOINT.")
    vocabulary = _vocabulary(workdir)
    if not vocabulary:
        raise FileNotFoundError(f"{workdir / 'data' / 'vocab'} holds no vocabulary: is {workdir} a packed workdir?")
    for teacher, _ in members:
        if _vocabulary(teacher) != vocabulary:
            raise ValueError(f"Teacher {teacher} has a different vocabulary from the student {workdir} "
                             f"(their data/vocab folders differ): distillation needs the same vocabulary.")
    sources, targets = load_arrays(workdir)["train"]
    config = TransformerConfig.from_yaml(workdir / "model.yaml")
    models = [_load_member(teacher, checkpoint) for teacher, checkpoint in members]
    ids, probabilities = teacher_top_k(models, sources, targets, top_k=top_k, tokens_per_batch=tokens_per_batch,
                                       pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)
    path = pathlib.Path(output or workdir / TEACHER_FILE)
    save_teacher(path, ids, probabilities, members=[[str(t), str(c)] for t, c in members], top_k=int(top_k))
    coverage = float(np.mean(np.concatenate([p.sum(-1) for p in probabilities])))
    labels = np.concatenate([np.append(t, config.eos_id) for t in targets])
    agreement = float(np.mean(np.concatenate([i[:, 0] for i in ids]) == labels))
    return {"path": str(path), "pairs": len(ids), "positions": int(len(labels)), "coverage": round(coverage, 4),
            "agreement": round(agreement, 4)}


if __name__ == "__main__":  # the module's command line before there was one command
    raise SystemExit("python -m keras_transformer.trainer.distillation is now `keras-transformer distill-targets` "
                     "(the same arguments).")
