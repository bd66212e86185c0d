"""The one training loop: build and compile the model, restore or start it, and `model.fit` with the run's
callbacks, finishing an interrupted epoch first.

`fit_experiment` knows nothing of where batches come from: the caller hands
it a `TrainingData` (a tf.data pipeline from `data.build`, or packed numpy
arrays from `arrays`) and, for multi-device runs, a distribution strategy.
Everything around the loop is shared by every data source: the checkpoints and
their names, the resumable backup (mid-epoch included), history.csv, the
learning-rate schedule with its cooldown, clipping and gradient accumulation,
the moving average of the weights (`trainer.ema`) and BLEU on the validation
split. Backend-neutral (keras and numpy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import math
import pathlib
import time
import typing
from typing import TYPE_CHECKING

import keras
import numpy as np

from keras_transformer.config import TransformerConfig
from keras_transformer.errors import CheckpointError, ConfigError
from keras_transformer.evaluation import read_lines
from keras_transformer.layers.lora import enable_lora
from keras_transformer.model import build_model
from keras_transformer.runtime import keras_internals
from keras_transformer.runtime.keras_internals import keep_raw_weights_after_fit, set_update_count
from keras_transformer.trainer import chunked_loss, ema
from keras_transformer.trainer.backup import RestoreMetricState, ResumableBackup, backup_position, stop_on_sigterm
from keras_transformer.trainer.callbacks import (
    BleuCallback,
    EpochCheckpoint,
    HistoryCSV,
    LearningRateLogger,
    NonFiniteGuard,
    ProgressLogger,
    StepCheckpoint,
    best_logged,
)
from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy, RDropLoss
from keras_transformer.trainer.metrics import MaskedAccuracy
from keras_transformer.trainer.optimizers import make_optimizer
from keras_transformer.trainer.precision import progress_verbosity
from keras_transformer.workdir.adapters import adapter_base, base_of, is_adapter_file, set_base
from keras_transformer.workdir.checkpoints import checkpoint_number, epoch_checkpoints, load_weights, weights_only

if TYPE_CHECKING:
    import os
    from collections.abc import Callable

    from keras_transformer.experiment import ExperimentConfig, TrainingSection

log = logging.getLogger("keras_transformer")


@dataclasses.dataclass
class TrainingData:
    """The batches of a run, whatever made them (`data.build.build_data`, `packed.training.packed_data`)."""

    train: typing.Any  # batches of ({"source", "target"}, labels): a tf.data.Dataset or a keras PyDataset
    validation: typing.Any  # the same for validation, or None
    source_vocab_size: int
    target_vocab_size: int
    tokenizers: typing.Any = None  # (source, target) SubwordTokenizers for text data; None otherwise
    valid_pairs: typing.Any = None  # (sources, references) raw validation text, for BLEU
    num_batches: typing.Optional[int] = None  # batches per epoch of `train`, when known
    callbacks: list = dataclasses.field(default_factory=list)  # the data's own, first in `fit` (e.g. the packed
                                                                # batches learn there which epoch is being trained)
    stream_position: typing.Any = None  # `position(epoch, done)`: where a streamed `train` is after `done` batches
                                        # of `epoch` (a dict the backup records); its run resumes there exactly

    def model_fields(self) -> dict[str, int]:
        """The TransformerConfig vocabulary fields this data needs."""
        if self.source_vocab_size == self.target_vocab_size and (
                self.tokenizers is None or self.tokenizers[0] is self.tokenizers[1]):
            return {"vocab_size": self.source_vocab_size}
        return {"vocab_size": max(self.source_vocab_size, self.target_vocab_size),
                "source_vocab_size": self.source_vocab_size, "target_vocab_size": self.target_vocab_size}


@dataclasses.dataclass
class TrainingResult:
    """What `train` returns."""

    model: typing.Any  # the trained keras.Model
    model_config: TransformerConfig
    history: dict  # metric name -> values of the epochs this call ran
    workdir: pathlib.Path
    checkpoints: list  # the epoch checkpoints now in workdir/checkpoints
    strategy: typing.Any = None
    tokenizers: typing.Any = None
    updates: int = 0  # optimizer updates this call applied (one per gradient_accumulation_steps batches)


def batches_per_epoch(training: TrainingSection, data: TrainingData) -> int | None:
    """`training.steps_per_epoch`, or the training data's number of batches; None when it is not known."""
    per_epoch = training.steps_per_epoch or data.num_batches
    return per_epoch if per_epoch and per_epoch > 0 else None


def cooldown_updates(training: TrainingSection, data: TrainingData) -> tuple[int, int] | None:
    """`(first update, length)` of the linear cooldown of `training.cooldown_epochs`, or None without one.

    The schedule counts optimizer updates from `training.initial_updates`: one
    a batch, or one every `training.gradient_accumulation_steps` batches.
    """
    if not training.cooldown_epochs:
        return None
    per_epoch = batches_per_epoch(training, data)
    if per_epoch is None:
        raise ConfigError("training.cooldown_epochs needs the number of batches per epoch, which this data "
                          "does not tell: set training.steps_per_epoch.")
    accumulation = training.gradient_accumulation_steps
    start = training.initial_updates + (training.epochs - training.cooldown_epochs) * per_epoch // accumulation
    end = training.initial_updates + training.epochs * per_epoch // accumulation
    return start, max(1, end - start)


def finished_epochs(output: str | os.PathLike[str]) -> int:
    """The epochs earlier runs finished in `output`: the number of its last epoch checkpoint (0 without one)."""
    checkpoints = epoch_checkpoints(output)
    return (checkpoint_number(checkpoints[-1].name) or 0) if checkpoints else 0


def check_fresh_start(output: pathlib.Path) -> None:
    """Refuses to train from scratch in a folder that holds an earlier run's epoch checkpoints but no backup.

    Training again from epoch 1 would overwrite `ckpt-0001...` one by one while
    the old run's later checkpoints stay, and `average` would mix the two runs.

    Raises:
        ConfigError: `output/checkpoints` has epoch checkpoints.
    """
    checkpoints = epoch_checkpoints(output)
    if checkpoints:
        raise ConfigError(
            f"{output} holds {len(checkpoints)} epoch checkpoint(s) of an earlier run ({checkpoints[0].name} .. "
            f"{checkpoints[-1].name}) but no backup to resume it from ({output / 'backup'} is gone): training from "
            f"scratch here would overwrite them one by one and mix two runs. Train in a new --workdir (with "
            f"training.init_checkpoint: {checkpoints[-1]} to start from its weights), or delete "
            f"{output / 'checkpoints'} to start over here.")


def summary(config: TransformerConfig) -> str:
    """One line describing a model config's sizes, for the log."""
    return (f"{config.encoder_layers}+{config.decoder_layers} layers, d_model {config.d_model}, "
            f"{config.num_heads} heads, d_ff {config.d_ff}, vocab {config.vocab_size}")


def compile_model(experiment: ExperimentConfig, model_config: TransformerConfig, data: TrainingData,
                  loss: typing.Any = None, metrics: list[typing.Any] | None = None,
                  prepare: Callable[[typing.Any], typing.Any] | None = None) -> typing.Any:
    """Builds and compiles the model of a run: the paper's Adam on the Noam schedule (with the run's cooldown,
    clipping, gradient accumulation and moving average of the weights), the label-smoothed loss (R-Drop's with
    `training.rdrop_alpha`; a vocabulary block at a time with `training.chunked_loss`) and the token accuracy;
    then the initial weights and update count of `training`. Call it under a strategy's scope.

    Args:
        experiment: the `ExperimentConfig`.
        model_config: the run's `TransformerConfig`.
        data: the run's `TrainingData` (for the cooldown's length).
        loss, metrics: instead of the defaults (e.g. distillation's).
        prepare: `prepare(model)` after compiling (the TensorFlow multi-worker workarounds).

    Returns:
        The compiled model.
    """
    training = experiment.training
    chunked = chunked_loss.applies(training.chunked_loss, model_config.tgt_vocab_size, loss, training.rdrop_alpha,
                                   lora=training.lora_settings is not None)
    if loss is None:
        loss = LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=model_config.pad_id)
        if training.rdrop_alpha:  # the batches hold each example twice (`data.build.repeat_rows`)
            loss = RDropLoss(training.rdrop_alpha, training.label_smoothing, pad_id=model_config.pad_id)
    cooldown = cooldown_updates(training, data)
    if cooldown:
        log.info("Cooldown: the learning rate falls linearly to 0 from update %d over %d updates", *cooldown)
    model = build_model(model_config)
    if chunked:  # the same layers and weights; its training step never holds the (tokens, V) logits
        model = chunked_loss.ChunkedLossTransformer(model.input, model.output, name=model.name)
    if training.lora_settings is not None:  # the base weights first, then the adapters: only they train
        adapt(model, training.init_checkpoint, *training.lora_settings)
    optimizer = make_optimizer(model_config, training, cooldown=cooldown)
    keep_raw_weights_after_fit(optimizer)  # the model takes the average when the whole run ends (fit_experiment)
    model.compile(optimizer=optimizer, loss=loss,
                  metrics=metrics if metrics is not None else [MaskedAccuracy(pad_id=model_config.pad_id)],
                  jit_compile=training.jit_compile, steps_per_execution=training.steps_per_execution)
    # Without a tf.distribute strategy, Keras builds the optimizer inside the first traced training step, and a
    # tf.function whose first trace creates variables is traced again: built here, the step is traced once
    # (bench/startup.py: a one-epoch tiny run finishes 1.5x sooner).
    model.optimizer.build(model.trainable_variables)
    if prepare is not None:
        prepare(model)
    if training.init_checkpoint and training.lora is None:  # the weights only: the new run's optimizer starts afresh
        load_weights(weights_only(model), training.init_checkpoint)
        log.info("Starting from the weights in %s", training.init_checkpoint)
    if training.initial_updates:  # a resumed run's backup restores its own count over this one
        set_update_count(model.optimizer, training.initial_updates)
        log.info("The optimizer starts at update %d (learning rate %.3g)", training.initial_updates,
                 float(model.optimizer.learning_rate))
    ema.reset_average(model)  # from these weights, not zeros (a resumed run's backup restores its own average)
    return model


def adapt(model: typing.Any, base: typing.Any, rank: int, alpha: float, targets: list[str]) -> None:
    """Loads the weights file `base` into `model` and adds LoRA adapters to it (`layers.lora.enable_lora`): its
    checkpoints then hold the adapters and the digest of `base` (`workdir.adapters`)."""
    load_weights(weights_only(model), base)
    try:
        layers = enable_lora(model, rank, alpha, targets)
    except ValueError as error:
        raise ConfigError(f"training.lora.targets: {error}") from error
    digest = set_base(model, base)
    log.info("LoRA rank %d, alpha %g on %d layers of %s (SHA-256 %s...): %d trainable parameters of %d", rank, alpha,
             len(layers), base, digest[:12], sum(int(np.prod(v.shape)) for v in model.trainable_weights),
             sum(int(np.prod(v.shape)) for v in model.weights))


def check_same_base(model: typing.Any, output: pathlib.Path) -> None:
    """Refuses to resume a LoRA run whose base weights file changed since its newest epoch checkpoint."""
    checkpoints = [path for path in epoch_checkpoints(output) if is_adapter_file(path)]
    if not checkpoints:
        return
    named, digest = adapter_base(checkpoints[-1])
    base, now = base_of(model)
    if now != digest:
        raise CheckpointError(f"Cannot resume {output}: training.init_checkpoint {base} is not the base its "
                              f"adapters were trained on ({named}, SHA-256 {digest[:16]}...).")


def make_callbacks(experiment: ExperimentConfig, model_config: TransformerConfig, data: TrainingData,
                   output: pathlib.Path, resumed_at: tuple[int, int] = (0, 0),
                   make_translator: Callable[..., typing.Any] | None = None,
                   ) -> tuple[list[typing.Any], ResumableBackup]:
    """The run's callbacks, in the order that matters, and its backup (the last of them).

    The guard against non-finite losses comes first, so that every writer after
    it knows when a batch went wrong; callbacks that add to the epoch logs come
    before the ones that write them, and the backup comes last, so that a run
    stopped before it resumes from an epoch whose checkpoint and history are written.

    Returns:
        `(callbacks, backup)`; `backup.guard` is the run's `NonFiniteGuard`.
    """
    training = experiment.training
    guard = NonFiniteGuard()
    backup = ResumableBackup(output / "backup", training.backup_every_steps or "epoch", guard=guard,
                             position=data.stream_position)
    callbacks = [*data.callbacks, guard, LearningRateLogger(), ema.ValidateOnAverage()]
    if training.bleu_every_epochs and data.valid_pairs is not None and make_translator is not None:
        best_path = output / "checkpoints" / "best.weights.h5"
        sources, references = (list(side[:training.bleu_max_sentences]) for side in data.valid_pairs)
        tokenized = None
        if experiment.data.valid_tokenized_target:
            tokenized = read_lines(experiment.data.valid_tokenized_target)[:len(references)]
        callbacks.append(BleuCallback(
            sources, references, make_translator=make_translator, every_n_epochs=training.bleu_every_epochs,
            lang=experiment.data.pipeline.get("target_language") if tokenized else None,
            tokenized_references=tokenized, best_path=best_path, best=best_logged(
                output / "history.csv", f"val_{training.validation_metric}", resumed_at[0])
            if best_path.is_file() else -math.inf, metric=training.validation_metric,
            batch_size=experiment.decoding.batch_size, guard=guard,
            translator_options={"options": experiment.decoding.options.replace(
                strategy="beam", beam_size=training.bleu_beam_size, n_best=1)}))
    callbacks += [
        EpochCheckpoint(output / "checkpoints", keep=training.keep_checkpoints, guard=guard),
        HistoryCSV(output / "history.csv", guard=guard),
    ]
    if training.checkpoint_every_steps:
        callbacks.append(StepCheckpoint(output / "checkpoints", training.checkpoint_every_steps,
                                        training.keep_step_checkpoints, guard=guard))
    if training.tensorboard:
        # Optional: Keras' TensorBoard callback writes through tensorboard and tf.summary, on any backend.
        if all(_importable(name) for name in ("tensorboard", "tensorflow")):
            callbacks.append(keras.callbacks.TensorBoard(log_dir=str(output / "logs")))
        else:
            log.warning("TensorBoard logs skipped: they need the tensorboard and tensorflow packages "
                        "(training.tensorboard).")
    # the progress line last, after every callback added to the logs
    callbacks += [backup, ProgressLogger(epochs=training.epochs)]
    return callbacks, backup


def _importable(name: str) -> bool:
    """Whether `name` can be imported, without importing it (an import hook that refuses it counts as no)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def fit_experiment(experiment: ExperimentConfig, model_config: TransformerConfig, data: TrainingData,
                   output: str | os.PathLike[str], *, strategy: typing.Any = None, resumed_at: tuple[int, int] = (0, 0),
                   make_translator: Callable[..., typing.Any] | None = None, loss: typing.Any = None,
                   metrics: list[typing.Any] | None = None,
                   prepare: Callable[[typing.Any], typing.Any] | None = None) -> TrainingResult:
    """Trains a run to `training.epochs`, resuming its backup in `output`; the loop every data source shares.

    Args:
        experiment: the `ExperimentConfig`.
        model_config: the run's `TransformerConfig`.
        data: a `TrainingData`.
        output: the folder of checkpoints, backup, logs and history.csv.
        strategy: a tf.distribute strategy to build the model under, or None.
        resumed_at: `(epoch, batches)` the backup resumes at (`trainer.backup.backup_position`).
        make_translator: `make_translator(model, **options)` for BLEU on validation (`training.bleu_every_epochs`).
        loss, metrics, prepare: see `compile_model`.

    Returns:
        A `TrainingResult`.

    Raises:
        RunStopped: SIGTERM stopped the run after the batch it was training; a backup at that batch is written.
        FloatingPointError: the training loss or a weight became non-finite (training stopped before
            anything of that epoch was saved).
    """
    training = experiment.training
    output = pathlib.Path(output)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = compile_model(experiment, model_config, data, loss=loss, metrics=metrics, prepare=prepare)
    if training.lora is not None:
        check_same_base(model, output)
    callbacks, backup = make_callbacks(experiment, model_config, data, output, resumed_at, make_translator)
    backup.set_model(model)
    restored = backup.restore()
    if (restored.position if restored else (0, 0)) != tuple(resumed_at):
        raise CheckpointError(f"The backup in {backup.backup_dir} changed while the run started (it resumes at "
                              f"{restored.position if restored else (0, 0)}, not {tuple(resumed_at)}): is another "
                              f"process writing to {output}?")
    first_update = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    validation = data.validation if training.validation else None
    fit = dict(validation_data=validation, callbacks=callbacks, verbose=progress_verbosity(training.verbose),
               shuffle=False)  # the data sources shuffle themselves
    start = time.time()
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    # SIGTERM: a backup at the current batch, then `RunStopped`; a streamed pass ending an epoch is no mistake
    with stop_on_sigterm(backup), keras_internals.quiet_end_of_pass():
        histories = _finish_interrupted_epoch(model, data, training, resumed_at, backup, fit, replicas=replicas)
        if not model.stop_training:
            initial_epoch = resumed_at[0] + 1 if histories else resumed_at[0]
            histories.append(model.fit(data.train, epochs=training.epochs, steps_per_epoch=training.steps_per_epoch,
                                       initial_epoch=initial_epoch, **fit))
    history = _merge_histories(histories)
    if history.epoch:
        log.info("Trained %d epoch(s) in %.1f s; checkpoints in %s", len(history.epoch), time.time() - start,
                 output / "checkpoints")
    else:
        log.info("Nothing to train: %s already has %d epoch(s), and training.epochs is %d; raise training.epochs "
                 "to train further.", output, finished_epochs(output), training.epochs)
    if backup.guard.tripped:
        raise FloatingPointError(_nonfinite_message(backup.guard, output))
    if ema.has_average(model):
        ema.use_average(model)  # what was checkpointed and validated; the backup keeps the raw weights
        log.info("The model holds the moving average of its weights (training.ema_decay %g)", training.ema_decay)
    return TrainingResult(model=model, model_config=model_config, history=history.history, workdir=output,
                          checkpoints=epoch_checkpoints(output), strategy=strategy, tokenizers=data.tokenizers,
                          updates=int(keras.ops.convert_to_numpy(model.optimizer.iterations)) - first_update)


def _nonfinite_message(guard: NonFiniteGuard, output: pathlib.Path) -> str:
    """The error of a run its `NonFiniteGuard` stopped: where, why, what is left on disk, what to do."""
    saved = sorted((output / "checkpoints").glob("*.weights.h5"), key=lambda path: path.stat().st_mtime)
    newest = f"the newest checkpoint, {saved[-1]}, holds finite weights" if saved else "no checkpoint was written"
    try:
        position = backup_position(output / "backup")
        resume = (f"the backup resumes at epoch {position[0] + 1}" + (f", batch {position[1] + 1}" if position[1]
                                                                       else "")) if position != (0, 0) else \
            "there is no backup yet: a rerun starts afresh"
    except CheckpointError:
        resume = "the backup is not readable"
    return (f"Training stopped at update {guard.update}: {guard.reason}. Nothing of that epoch was saved: "
            f"{newest}, and {resume}. Run the same command again to resume from there (dropout and shuffling "
            f"are reseeded), or first lower the learning rate (training.learning_rate_scale, a resumable change), "
            f"or set training.clipnorm.")


def _finish_interrupted_epoch(model: typing.Any, data: TrainingData, training: TrainingSection,
                              resumed_at: tuple[int, int], backup: ResumableBackup, fit: dict[str, typing.Any],
                              replicas: int = 1) -> list[typing.Any]:
    """Trains the batches an epoch interrupted after a batch backup had left; `[history]`, or `[]` when there is
    no such epoch or its length is not known (it then trains again from its first batch, with a warning)."""
    epoch, done = resumed_at
    if not done or epoch >= training.epochs:
        return []
    per_epoch = batches_per_epoch(training, data)
    if per_epoch is None and data.stream_position is not None:  # the stream resumes at its place: the pass's rest
        log.info("Epoch %d was interrupted after %d batches: training the rest of its pass", epoch + 1, done)
        backup.offset = done
        restore = RestoreMetricState(backup.backup_dir, epoch, done, replicas=replicas)
        fit = dict(fit, callbacks=[restore, *fit["callbacks"]])
        return [model.fit(data.train, epochs=epoch + 1, initial_epoch=epoch, **fit)]
    if per_epoch is None:
        log.warning("Epoch %d was interrupted after %d batches, but this data does not tell its number of batches "
                    "per epoch (set training.steps_per_epoch): it trains again from its first batch.", epoch + 1, done)
        return []
    if done >= per_epoch:  # a backup of Keras' own at an epoch's last batch, or data that changed length since
        log.warning("The backup records %d trained batches of epoch %d, which has %d: the epoch trains again from "
                    "its first batch.", done, epoch + 1, per_epoch)
        return []
    log.info("Epoch %d was interrupted after %d of its %d batches: training the other %d", epoch + 1, done,
             per_epoch, per_epoch - done)
    backup.offset = done
    restore = RestoreMetricState(backup.backup_dir, epoch, done, replicas=replicas)
    fit = dict(fit, callbacks=[restore, *fit["callbacks"]])
    return [model.fit(data.train, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=per_epoch - done,
                      **fit)]


def _merge_histories(histories: list[typing.Any]) -> typing.Any:
    """One `keras.callbacks.History` of several `fit` calls, in order."""
    merged = keras.callbacks.History()
    merged.epoch, merged.history = [], {}
    for history in histories:
        merged.epoch += history.epoch
        for key, values in history.history.items():
            merged.history.setdefault(key, []).extend(values)
    return merged
