"""Training from packed token ids on any Keras backend: the path to a GPU machine without TensorFlow.

The `train` command's data pipeline is TensorFlow's (tf.data, tensorflow-text).
A machine with JAX or PyTorch and a GPU but no TensorFlow can still train the
same model from the same vocabulary, in two steps:

1. Where TensorFlow is installed, `keras-transformer pack --config C --workdir W`
   (`training.pack_arrays`) learns or loads the vocabulary exactly as `train`
   does and writes the tokenized training and validation pairs to
   `W/arrays/` (`.npy` files training memory-maps), next to `experiment.yaml`, `model.yaml` and `data/vocab`.
2. On any backend, `keras-transformer train-packed W` (`train_arrays`)
   trains from those arrays in `train`'s own loop (`trainer.loop.fit_experiment`,
   `model.fit`) with the workdir's `experiment.yaml`: the same checkpoints
   (`W/checkpoints/ckpt-NNNN.weights.h5`), resumable backup (`W/backup`),
   `W/history.csv`, schedule, clipping and gradient accumulation, and at the
   end the average of the last N epochs in `W/averaged.weights.h5` (the
   file `keras-transformer average` writes).

The workdir then serves every TensorFlow-side command unchanged:
`keras-transformer evaluate --model W --average N ...`, `export --workdir W`;
`keras-transformer train-packed W --evaluate SOURCE REFERENCE` (`packed.scoring.evaluate_arrays`) scores it without
TensorFlow.

Batches (`PackedBatches`, a `keras.utils.PyDataset`): a pair's length is its
longer side plus one (eos / bos), rounded up to a multiple of `length_multiple`;
the pairs are sorted by it and cut into token-budget batches as the tf.data
pipeline cuts them (`packed.data.make_batches`). An epoch is one pass over
the pairs, or `training.steps_per_epoch` batches of an endless stream of
passes; each pass's order is a pure function of the seed and the pass, so a
run resumed inside an epoch trains the batches the interrupted one had left.
Batch widths are few (one per L), and with `pad_rows` (whenever
`training.jit_compile` may be on) so are the shapes, which is what XLA (the
only fast way on a GPU) needs: each new shape compiles once.

This module needs only keras, numpy and the package itself: no TensorFlow, which it imports only to feed
`model.fit` on the TensorFlow backend (`_fed_to_the_backend`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from keras_transformer import evaluation
from keras_transformer.config import TransformerConfig
from keras_transformer.engines.packed import PackedTranslator, sentencepiece_processors
from keras_transformer.errors import ConfigError
from keras_transformer.experiment import load_experiment
from keras_transformer.files import exclusive_lock, remove_stale_temporaries
from keras_transformer.packed.data import (
    ARRAYS_FILE,
    Batch,
    IdSequences,
    arrays_path,
    assemble_batch,
    check_not_unreleased_format,
    load_arrays,
    plan_batches,
    sequence_lengths,
)
from keras_transformer.trainer import distillation
from keras_transformer.trainer.backup import backup_position, resumed_seed
from keras_transformer.trainer.callbacks import HistoryCSV
from keras_transformer.trainer.loop import TrainingData, check_fresh_start, finished_epochs, fit_experiment
from keras_transformer.trainer.precision import resolve_precision
from keras_transformer.workdir.checkpoints import average_workdir, checkpoint_number, epoch_checkpoints

if TYPE_CHECKING:
    from keras_transformer.experiment import ExperimentConfig

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ the packed experiment
PACKED_STRATEGIES = ("auto", "default")  # training.strategy values the packed path runs: one device


def packed_experiment(workdir: str | os.PathLike[str], *, epochs: int | None = None,
                      tokens_per_batch: int | None = None, seed: int | None = None, keep_checkpoints: int | None = None,
                      init_weights: str | os.PathLike[str] | None = None, initial_updates: int | None = None,
                      cooldown_epochs: int | None = None, jit_compile: bool | None = None,
                      precision: str | None = None, verbose: int | None = None) -> ExperimentConfig:
    """The typed experiment of a packed workdir (`experiment.yaml`), with `train_arrays`' overrides applied.

    Fields left None keep the workdir's values, whose own defaults are the
    `train` command's (`experiment.TrainingSection`: seed 1234, 10 epochs, ...).
    The data files named in it are not needed (they stay where `pack` read them).

    Raises:
        FileNotFoundError: `workdir` was not packed.
        ConfigError: a bad value, or a setting the packed path cannot apply (named).

    Example:

    >>> packed_experiment("runs/packed", epochs=3).training.epochs  # doctest: +SKIP
    3
    """
    workdir = pathlib.Path(workdir)
    for needed in ("model.yaml", "experiment.yaml"):
        if not (workdir / needed).is_file():
            raise FileNotFoundError(f"{workdir} is not a packed workdir: {workdir / needed} is missing "
                                    "(`keras-transformer pack` writes it).")
    if arrays_path(workdir) is None:
        check_not_unreleased_format(workdir)
        raise FileNotFoundError(f"{workdir} is not a packed workdir: {workdir / ARRAYS_FILE} is missing "
                                "(`keras-transformer pack` writes it).")
    changes = {"training.epochs": epochs, "training.seed": seed, "training.keep_checkpoints": keep_checkpoints,
               "training.init_checkpoint": None if init_weights is None else str(init_weights),
               "training.initial_updates": initial_updates, "training.jit_compile": jit_compile,
               "training.mixed_precision": precision, "training.verbose": verbose,
               "training.cooldown_epochs": cooldown_epochs or None, "data.tokens_per_batch": tokens_per_batch}
    # `--set` overrides, applied before the experiment is checked (JSON values are YAML: paths stay strings)
    overrides = [f"{key}={json.dumps(value)}" for key, value in changes.items() if value is not None]
    if cooldown_epochs == 0:
        overrides.append("training.cooldown_epochs=null")  # 0: none
    experiment = load_experiment(workdir / "experiment.yaml", overrides)
    _refuse_what_packed_arrays_cannot_train(experiment)
    return experiment


def _refuse_what_packed_arrays_cannot_train(experiment: ExperimentConfig) -> None:
    training, data = experiment.training, experiment.data
    refusals = [
        (training.strategy not in PACKED_STRATEGIES, f"training.strategy={training.strategy!r}: training from packed "
         f"arrays runs on one device (strategy {' or '.join(PACKED_STRATEGIES)})"),
        (training.devices is not None, f"training.devices={training.devices!r}: training from packed arrays runs on "
         "the backend's default device"),
        (training.communication != "auto", f"training.communication={training.communication!r}: training from "
         "packed arrays runs on one device"),
        (training.rdrop_alpha, f"training.rdrop_alpha={training.rdrop_alpha}: training from packed arrays does not "
         "implement R-Drop"),
        (data.kind != "text", f"data.kind={data.kind!r}: packed arrays hold text data (keras-transformer pack)"),
        (data.kind == "text" and data.data_config().subword_dropout,
         "data.subword_dropout: packed arrays hold one fixed segmentation, so BPE-dropout cannot apply to them"),
    ]
    for refused, message in refusals:
        if refused:
            raise ConfigError(f"{message}; train with keras-transformer train, or change the workdir's "
                              "experiment.yaml.")


# ------------------------------------------------------------------ batches for model.fit
class PackedBatches(keras.utils.PyDataset):
    """The token-budget batches of packed pairs (`packed.data.make_batches`) for `model.fit`, on any backend.

    Each item is `({"source", "target"}, labels)`. The batches form one
    endless stream of passes over the pairs; with a `seed` the pairs are
    reshuffled every pass, and the order of pass k is a pure function of
    `(seed, k)` (its generator is seeded with `trainer.backup.resumed_seed(seed, k)`).
    An epoch is one pass, or with `steps_per_epoch` that many batches of the
    stream: epoch e serves the batches at positions `e * steps_per_epoch ...`,
    across the end of a pass where it falls inside the epoch. A run resumed
    inside an epoch therefore trains the very batches the interrupted one had
    left. `callback` tells the dataset which epoch `fit` is in; a run resumed
    after `done` batches of epoch e is made with `resumed_at=(e, done)`, and
    its first epoch starts at batch `done`.

    Args:
        sources, targets: lists of id arrays, or `packed.data.PackedSequences` (`load_arrays`).
        tokens_per_batch, length_multiple, pad_rows, pad_id, bos_id, eos_id: as in `make_batches`.
        seed: the shuffling seed, or None for one fixed order (validation).
        teacher: `(ids, probabilities)` of `distillation.load_teacher`, packed into the labels.
        resumed_at: `(epoch, batches)` the run resumes at (`trainer.backup.backup_position`).
        steps_per_epoch: batches an epoch (`training.steps_per_epoch`); None: one pass.

    Example:

    >>> batches = PackedBatches([np.array([5, 6])], [np.array([7])], 64, seed=1)
    >>> inputs, labels = batches[0]
    >>> len(batches), inputs["source"].tolist(), labels.tolist()
    (1, [[5, 6, 3, 0, 0, 0, 0, 0]], [[7, 3, 0, 0, 0, 0, 0, 0]])
    >>> len(PackedBatches([np.array([5, 6])], [np.array([7])], 64, seed=1, steps_per_epoch=3))  # 3 passes an epoch
    3
    """

    def __init__(self, sources: IdSequences, targets: IdSequences, tokens_per_batch: int, *, length_multiple: int = 8,
                 pad_rows: bool = False, pad_id: int = 0, bos_id: int = 2, eos_id: int = 3, seed: int | None = None,
                 teacher: tuple[Sequence[np.ndarray], Sequence[np.ndarray]] | None = None,
                 resumed_at: tuple[int, int] = (0, 0), steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if len(sources) != len(targets):
            raise ValueError(f"PackedBatches: {len(sources)} source but {len(targets)} target sequences.")
        if teacher is not None and not (len(teacher[0]) == len(teacher[1]) == len(targets)):
            raise ValueError(f"PackedBatches: {len(targets)} pairs but teacher distributions for {len(teacher[0])}.")
        self._pairs = (sources, targets)
        self._lengths = (sequence_lengths(sources), sequence_lengths(targets))
        self._options: dict[str, Any] = dict(length_multiple=length_multiple, pad_rows=pad_rows, pad_id=pad_id,
                                             bos_id=bos_id, eos_id=eos_id, teacher=teacher)
        self.tokens_per_batch, self.seed = int(tokens_per_batch), seed
        # pass number -> its batches: the newest `_keep` passes
        self._passes: dict[int, list[tuple[np.ndarray, int, int]]] = {}
        self._keep = 1
        self.epoch, self.offset = resumed_at
        # The same in every pass (the cut depends on lengths only); pass `epoch` is the first an epoch of one
        # pass reads.
        self.pass_length = len(self.pass_plan(self.epoch))
        self._length = int(steps_per_epoch) if steps_per_epoch else self.pass_length
        self._keep = 1 if self._length == self.pass_length else 2  # other epochs read across the end of a pass
        self.offset = self.offset if self.offset < self._length else 0  # more: the epoch trains from its start
        self._first = True
        # (epoch, first batch, batches) of each epoch trained (in part) by this process
        self.trained: list[list[int]] = []
        self.callback = _EpochTracker(self)

    def pass_plan(self, number: int) -> list[tuple[np.ndarray, int, int]]:
        """The `(indices, width, rows)` of each batch of pass `number` over the pairs (`packed.data.plan_batches`):
        the order only, a few bytes per pair; the batches are assembled from the pairs when read."""
        if number not in self._passes:
            rng = None if self.seed is None else np.random.default_rng(resumed_seed(self.seed, number))
            plan = plan_batches(*self._lengths, self.tokens_per_batch, rng=rng,
                                length_multiple=self._options["length_multiple"], pad_rows=self._options["pad_rows"])
            kept = list(self._passes.items())[len(self._passes) - self._keep + 1:]
            self._passes = dict(kept + [(number, plan)])
        return self._passes[number]

    def pass_batches(self, number: int) -> list[Batch]:
        """The `(source, target_input, labels)` batches of pass `number` over the pairs (each pair once), in order."""
        return [self._assemble(entry) for entry in self.pass_plan(number)]

    def _assemble(self, entry: tuple[np.ndarray, int, int]) -> Batch:
        indices, width, rows = entry
        options = {name: self._options[name] for name in ("pad_id", "bos_id", "eos_id", "teacher")}
        return assemble_batch(*self._pairs, indices, width, rows, **options)

    def batch(self, epoch: int, index: int) -> Batch:
        """Batch `index` of `epoch`: the one at position `epoch * len(self) + index` of the stream of passes,
        gathered from the pairs (read from disk when they are memory-mapped) when it is asked for."""
        position = epoch * self._length + index
        return self._assemble(self.pass_plan(position // self.pass_length)[position % self.pass_length])

    def batches(self, epoch: int) -> list[Batch]:
        """The `(source, target_input, labels)` batches of `epoch`, in training order."""
        return [self.batch(epoch, index) for index in range(self._length)]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        # past the epoch's end (a resumed epoch's rest is shorter): read ahead, unused
        source, target_input, labels = self.batch(self.epoch, (self.offset + index) % self._length)
        return {"source": source, "target": target_input}, labels

    def target_tokens(self, epoch: int, first: int, count: int) -> int:
        """Non-pad labels in batches `first .. first + count - 1` of `epoch`."""
        tokens = 0
        for index in range(first, first + count):
            labels = self.batch(epoch, index)[2]
            tokens += int(np.count_nonzero(labels if labels.ndim == 2 else labels[..., 0]))
        return tokens


class _EpochTracker(keras.callbacks.Callback):
    """Sets the epoch of a `PackedBatches` before `fit` reads its batches, and records what each epoch trained."""

    def __init__(self, batches: PackedBatches) -> None:
        super().__init__()
        self.batches = batches

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        data = self.batches
        if not (data._first and epoch == data.epoch):
            data.offset = 0  # only the first epoch of a resumed run starts inside it
        data._first = False
        data.epoch = epoch
        data.trained.append([epoch, data.offset, 0])

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches.trained[-1][2] = batch + 1  # with steps_per_execution, `batch` is the last of the execution


def _fed_to_the_backend(batches: PackedBatches) -> Any:
    """`batches` as `model.fit` takes them on this backend: the PyDataset itself, or on TensorFlow a tf.data
    pipeline over it whose widths are free (Keras infers a PyDataset's shapes from its first two batches,
    which fixes the width whenever they share one)."""
    if keras.config.backend() != "tensorflow":
        return batches
    import tensorflow as tf

    inputs, labels = batches[0]
    signature = ({name: tf.TensorSpec((None, None), tf.int32) for name in inputs},
                 tf.TensorSpec((None, None, *labels.shape[2:]), tf.as_dtype(labels.dtype)))  # (B, T) or (B, T, 1 + 2k)
    dataset = tf.data.Dataset.from_generator(lambda: (batches[i] for i in range(len(batches))),
                                             output_signature=signature)
    options = tf.data.Options()
    options.autotune.enabled = False  # nothing to tune, and a tuned iterator's deletion waits (TextStream.dataset)
    return dataset.apply(tf.data.experimental.assert_cardinality(len(batches))).prefetch(2).with_options(options)


def packed_data(workdir: str | os.PathLike[str], experiment: ExperimentConfig, *, length_multiple: int = 8,
                teacher: tuple[Sequence[np.ndarray], Sequence[np.ndarray]] | None = None,
                resumed_at: tuple[int, int] = (0, 0)) -> tuple[TrainingData, PackedBatches]:
    """`(TrainingData, PackedBatches)` of a packed workdir: the `trainer.loop.TrainingData` of `PackedBatches`
    over `arrays/`, memory-mapped (with the raw validation text for BLEU when `training.bleu_every_epochs` asks for
    it), and its training batches."""
    workdir = pathlib.Path(workdir)
    training = experiment.training
    splits = load_arrays(workdir)  # arrays/ memory-mapped
    config = TransformerConfig.from_yaml(workdir / "model.yaml")
    data_config = experiment.data.data_config()
    seed = experiment.data.seed if experiment.data.seed is not None else training.seed
    # pad_rows under XLA: one batch shape per width, so one compilation each
    options: dict[str, Any] = dict(length_multiple=length_multiple, pad_rows=training.jit_compile is not False,
                                   pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)
    train = PackedBatches(*splits["train"], data_config.tokens_per_batch, seed=seed, teacher=teacher,
                          resumed_at=resumed_at, steps_per_epoch=training.steps_per_epoch, **options)
    validation = (PackedBatches(*splits["valid"], data_config.tokens_per_batch, **options)
                  if "valid" in splits and len(splits["valid"][0]) else None)
    valid_pairs = None
    if training.bleu_every_epochs:
        files = [data_config.valid_source, data_config.valid_target]
        if all(path and pathlib.Path(path).is_file() for path in files):
            valid_pairs = tuple(evaluation.read_lines(str(path)) for path in files)  # both files, checked above
        else:
            log.warning("training.bleu_every_epochs skipped: the validation text (data.valid_source, "
                        "data.valid_target: %s) is not on this machine.", files)
    data = TrainingData(_fed_to_the_backend(train), validation and _fed_to_the_backend(validation),
                        config.source_vocab_size or config.vocab_size, config.target_vocab_size or config.vocab_size,
                        valid_pairs=valid_pairs, num_batches=len(train), callbacks=[train.callback])
    return data, train

# ------------------------------------------------------------------ training
def train_arrays(workdir: str | os.PathLike[str], epochs: int | None = None, *, jit_compile: bool | None = None,
                 precision: str | None = None, average_last: int | None = None, length_multiple: int = 8,
                 tokens_per_batch: int | None = None, seed: int | None = None, keep_checkpoints: int | None = None,
                 init_weights: str | os.PathLike[str] | None = None, initial_updates: int | None = None,
                 teacher: str | os.PathLike[str] | None = None, distill_weight: float = 0.5,
                 cooldown_epochs: int | None = None, verbose: int | None = None) -> dict[str, Any]:
    """Trains the packed experiment in `workdir` (see `training.pack_arrays`), resuming a previous run.

    The loop is `train`'s (`trainer.loop.fit_experiment`): the same
    checkpoints (`checkpoints/ckpt-NNNN.weights.h5`), backup (`backup/`, inside
    an epoch with `training.backup_every_steps`), `history.csv` columns,
    schedule with its cooldown, clipping (`training.clipnorm`), gradient
    accumulation, step checkpoints and BLEU on validation. Every
    setting comes from the workdir's `experiment.yaml` (whose defaults are
    `train`'s); the arguments below replace the ones they name.

    Args:
        workdir: a folder written by `pack_arrays` (`experiment.yaml`,
            `model.yaml`, `arrays/`).
        epochs: total epochs (`training.epochs`); 0 trains nothing (and averages).
        jit_compile: `training.jit_compile` (XLA, the fast path on a GPU).
        precision: `training.mixed_precision`, e.g. `"mixed_bfloat16"` on a GPU.
        average_last: after training, average the last N epoch checkpoints into
            `averaged.weights.h5`, the file `keras-transformer average` writes
            (default: `decoding.average_last`; 0: none).
        length_multiple: batch widths are multiples of it.
        tokens_per_batch: `data.tokens_per_batch`.
        seed: `training.seed`; pass k over the pairs shuffles with `resumed_seed(seed, k)`.
        keep_checkpoints: `training.keep_checkpoints`.
        init_weights: `training.init_checkpoint` (weights only; a resumed run's
            backup replaces them).
        initial_updates: `training.initial_updates`.
        teacher: a `distillation.save_teacher` file made for this workdir:
            train with `distillation.DistillationLoss` towards it.
        distill_weight: the teacher term's weight w in that loss.
        cooldown_epochs: `training.cooldown_epochs` (0: none).
        verbose: `training.verbose`.

    Returns:
        A dict: `history` (rows of `history.csv` written by this call),
        `checkpoints` (the epoch checkpoints this call wrote), `average` (path
        or None), `updates` (optimizer updates applied by this call), `batches`
        (batches trained by this call: `gradient_accumulation_steps` an update), `seconds`,
        `target_tokens` (non-pad labels trained on by this call), `backend` (Keras', e.g. "jax").

    Raises:
        FileNotFoundError: no `arrays/` (an unreleased version's `arrays.npz`: named) / `model.yaml` in `workdir`, or
            no `init_weights` / `teacher` file.
        ConfigError: a bad setting, or one the packed path cannot apply (named).
        ValueError: a teacher file made for other training pairs.
        FloatingPointError: the loss became NaN (training stopped).
    """
    started = time.perf_counter()
    workdir = pathlib.Path(workdir)
    experiment = packed_experiment(workdir, epochs=epochs or None, tokens_per_batch=tokens_per_batch, seed=seed,
                                   keep_checkpoints=keep_checkpoints, init_weights=init_weights,
                                   initial_updates=initial_updates, cooldown_epochs=cooldown_epochs,
                                   jit_compile=jit_compile, precision=precision, verbose=verbose)
    with exclusive_lock(workdir, "train"):  # one writer per workdir; the lock goes with this process
        for folder in (workdir, workdir / "checkpoints", workdir / "backup"):
            remove_stale_temporaries(folder)  # what a killed run left half-written
        before = finished_epochs(workdir)
        result = {"history": [], "checkpoints": [], "updates": 0, "batches": 0, "target_tokens": 0}
        if epochs != 0:
            result = _fit_packed(workdir, experiment, before, length_multiple, teacher, distill_weight)
        average_last = experiment.decoding.average_last if average_last is None else average_last
        chosen = epoch_checkpoints(workdir)[-int(average_last):] if average_last else []
        result["average"] = None
        if chosen:  # the last epochs' average, in the file `keras-transformer average` writes
            result["average"], _ = average_workdir(workdir, checkpoints=chosen)
            log.info("Averaged %d checkpoints (%s .. %s) into %s", len(chosen), chosen[0].name, chosen[-1].name,
                     result["average"])
    result["seconds"], result["backend"] = time.perf_counter() - started, keras.config.backend()
    return result


def _fit_packed(workdir: pathlib.Path, experiment: ExperimentConfig, before: int, length_multiple: int,
                teacher: str | os.PathLike[str] | None, distill_weight: float) -> dict[str, Any]:
    """`fit_experiment` on the packed data; the parts of `train_arrays`' result that training gives."""
    training = experiment.training
    teacher_arrays = None
    if teacher:
        teacher_arrays = distillation.load_teacher(teacher, load_arrays(workdir)["train"][1])[:2]
    resumed_at = backup_position(workdir / "backup")
    if resumed_at == (0, 0):
        check_fresh_start(workdir)
    # Before the model is built: its dropout generators take their state from this seed. A resumed run gets a
    # seed of its own so that it does not repeat the first run's dropout masks (Keras does not save them).
    keras.utils.set_random_seed(resumed_seed(training.seed, *resumed_at))
    if resumed_at != (0, 0):
        log.info("Resuming from %s at epoch %d%s", workdir / "backup", resumed_at[0] + 1,
                 f", batch {resumed_at[1] + 1}" if resumed_at[1] else "")
    data, batches = packed_data(workdir, experiment, length_multiple=length_multiple, teacher=teacher_arrays,
                                   resumed_at=resumed_at)
    config = TransformerConfig.from_yaml(workdir / "model.yaml")
    loss = metrics = None
    if teacher:
        loss = distillation.DistillationLoss(training.label_smoothing, distill_weight, pad_id=config.pad_id)
        metrics = [distillation.DistillationAccuracy(pad_id=config.pad_id)]
    make_translator = None
    if data.valid_pairs is not None:  # BLEU on validation decodes with the model being trained
        processors = sentencepiece_processors(workdir / "data" / "vocab")
        make_translator = functools.partial(PackedTranslator, processors=processors, config=config)
    policy = resolve_precision(training.policy)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        fitted = fit_experiment(experiment, config, data, workdir, resumed_at=resumed_at,
                                make_translator=make_translator, loss=loss, metrics=metrics)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    _, rows = HistoryCSV(workdir / "history.csv").read()
    return {"history": [row for row in rows if int(row["epoch"]) > before],
            "checkpoints": [path for path in epoch_checkpoints(workdir)
                            if (checkpoint_number(path.name) or 0) > before],
            "updates": fitted.updates, "batches": sum(count for _, _, count in batches.trained),
            "target_tokens": sum(batches.target_tokens(*trained) for trained in batches.trained)}
