"""Resuming a run where it stopped: the backup callback, its position, the resumed run's seeds.

A run's `backup/` folder holds `latest.weights.h5` (weights and optimizer
state), `training_metadata.json` (the epoch, and the batches of it already
trained) and, inside an epoch, `metrics.npz` (the epoch's running loss and
metrics). The same command run again restores them and trains only what is
left; its dropout and shuffling are seeded by `resumed_seed`, so that it does
not replay the first run's noise. Backend-neutral (keras and numpy).
"""

import json
import logging
import os
import pathlib

import keras
import numpy as np

from keras_transformer.errors import CheckpointError
from keras_transformer.keras_internals import BackupHooks

log = logging.getLogger("keras_transformer")


def resumed_seed(seed, epoch=0, batch=0):
    """The seed of a run that starts at `(epoch, batch)`: `seed` itself for a fresh run.

    Keras does not save the dropout generators' state, and a seeded tf.data
    shuffle restarts its sequence of orders in every process: a run resumed with
    its first seed would repeat the noise of the first run's first epochs, the
    same examples in the same batches under the same dropout masks. A resumed run
    takes a seed derived from the seed and where it starts instead.

    Example:

    >>> resumed_seed(1234), resumed_seed(1234, 0, 0)
    (1234, 1234)
    >>> resumed_seed(1234, 84) == resumed_seed(1234, 84), resumed_seed(1234, 84) == resumed_seed(1234, 85)
    (True, False)
    """
    if epoch == 0 and batch == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(epoch), int(batch)]).generate_state(1)[0] & 0x7FFFFFFF)


def backup_position(backup_dir):
    """`(epoch, batches)` a BackupAndRestore directory resumes at: the epoch, and how many of its batches were
    trained. `(0, 0)` when there is no backup to resume.

    Backups written before `batches_done` was recorded give Keras' zero-based
    `batch`: a value of 0 there cannot tell one trained batch from none, and counts as none.
    """
    backup_dir = pathlib.Path(backup_dir)
    if not (backup_dir / "latest.weights.h5").is_file():
        return (0, 0)
    try:
        position = json.loads((backup_dir / "training_metadata.json").read_text(encoding="utf-8"))
        done = position.get("batches_done")
        if done is None:
            batch = int(position.get("batch", 0) or 0)
            done = batch + 1 if batch else 0
        return (int(position.get("epoch", 0)), int(done))
    except (OSError, ValueError, TypeError, AttributeError):
        return (0, 0)  # unreadable: the restore that follows stops with the file named (CheckpointError)


class ResumableBackup(BackupHooks):
    """Keras' BackupAndRestore, made to resume where it stopped inside an epoch.

    What it changes:

    - the epoch a resumed run's batch backups record is the restored one (Keras
      records epoch 0 until the first resumed epoch ends, so a second interruption
      there started the run's epochs over);
    - each backup records `batches_done`, the batches of its epoch already
      trained, which `train` uses to run only the rest of an interrupted epoch
      (Keras restores the epoch alone and trains it again from its first batch);
    - with a batch frequency it also backs up at the end of every epoch, and
      skips the backup of an epoch's last batch that this one replaces;
    - a backup that does not load stops with a `CheckpointError` naming the file.

    `offset` is the number of the epoch's batches trained before the current
    `fit` began: `train` sets it for the fit that finishes an interrupted epoch.
    """

    def __init__(self, backup_dir, save_freq="epoch"):
        super().__init__(str(backup_dir), save_freq=save_freq, double_checkpoint=True, delete_checkpoint=False)
        self.offset = 0
        self._done = 0

    def on_train_begin(self, logs=None):
        try:
            super().on_train_begin(logs)
        except (OSError, ValueError, KeyError) as error:
            raise CheckpointError(
                f"Cannot resume: the training backup {self.weights_path} (or "
                f"{self.metadata_path}) is corrupt or does not match this model ({error}). "
                f"Delete {self.backup_dir} to start again from scratch, or set training.init_checkpoint "
                f"to a checkpoint in checkpoints/ to start from saved weights.") from error
        self.recorded_epoch = backup_position(self.backup_dir)[0]

    def on_train_batch_end(self, batch, logs=None):
        self._done = self.offset + batch + 1
        steps = (self.params or {}).get("steps")
        if steps and batch + 1 >= steps and self.save_freq != "epoch":
            return  # the epoch-end backup follows
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._done, self.offset = 0, 0
        super().on_epoch_end(epoch, logs)
        if self.save_freq != "epoch":
            self.restart_batch_count()
            self.save()

    def after_save(self):
        if self._done:  # inside an epoch: its running loss and metrics, for the process that trains the rest
            save_metric_state(self.model, self.backup_dir, self.recorded_epoch, self._done)
        position = {"epoch": self.recorded_epoch, "batch": self.last_batch_seen, "batches_done": self._done}
        with open(self.metadata_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(position))


METRIC_STATE = "metrics.npz"  # in the backup folder


def save_metric_state(model, backup_dir, epoch, done):
    """Writes the model's metric accumulators (the loss tracker's total and count, the accuracy's) as they stand
    after `done` batches of `epoch`, atomically."""
    path = pathlib.Path(backup_dir) / METRIC_STATE
    values = {f"v{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.metrics_variables)}
    temporary = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(temporary, epoch=epoch, done=done, names=np.array([v.path for v in model.metrics_variables]), **values)
    os.replace(temporary, path)


class RestoreMetricState(keras.callbacks.Callback):
    """Adds the interrupted epoch's metric accumulators from the backup to the resumed process's, so that the
    epoch's history row averages all of its batches, the ones trained before the interruption included.

    `ResumableBackup` saves them with each batch backup (`metrics.npz`): the loss
    tracker's total and count, the accuracy's correct and total, all sums.
    Keras creates the compiled metrics' variables at the first batch, so they are
    added after it; the next batch's logs and the epoch's row include them.
    Without a matching file (another position, other metrics, or several
    replicas, whose accumulators are per replica) the row averages the resumed
    batches alone, with a warning.
    """

    def __init__(self, backup_dir, epoch, done, replicas=1):
        super().__init__()
        self.path = pathlib.Path(backup_dir) / METRIC_STATE
        self.epoch, self.done, self.replicas = epoch, done, replicas
        self._pending = False

    def _saved(self):
        if self.replicas != 1:
            return None
        try:
            with np.load(self.path) as saved:
                names = [str(name) for name in saved["names"]]
                if (int(saved["epoch"]), int(saved["done"])) != (self.epoch, self.done) or \
                        names != [v.path for v in self.model.metrics_variables]:
                    return None
                return [saved[f"v{i}"] for i in range(len(names))]
        except (OSError, KeyError, ValueError):
            return None

    def on_epoch_begin(self, epoch, logs=None):
        self._pending = epoch == self.epoch

    def on_train_batch_end(self, batch, logs=None):
        if not self._pending:
            return
        self._pending = False
        values = self._saved()
        if values is None:
            log.warning("Epoch %d's loss and metrics in history.csv average only the batches trained after the "
                        "resume: the backup has no matching record of its first %d.", self.epoch + 1, self.done)
            return
        for variable, value in zip(self.model.metrics_variables, values):
            variable.assign_add(value)
