"""Resuming a run where it stopped: the backup callback, its position, the resumed run's seeds.

A run's `backup/` folder holds `latest.weights.h5` (weights and optimizer
state), `training_metadata.json` (the epoch, the batches of it already
trained, whether the optimizer keeps a moving average of the weights, and the
digest of the weights file it goes with) and, inside an
epoch, `metrics.npz` (the epoch's running loss and metrics); the backup before
it stays beside them as `latest.weights.h5.bkp` and `training_metadata.json.bkp`.
The same command run again restores them and trains only what is left; its
dropout and shuffling are seeded by `resumed_seed`, so that it does not replay
the first run's noise. Backend-neutral (keras and numpy).

What survives what: every file is written under a temporary name, flushed to
disk and renamed; the previous backup is kept until the new one is complete;
and a backup counts only when its weights file has the digest its metadata
records. A process killed in the middle of a backup, or a weights file or
metadata torn in any way, leaves a workdir that resumes from the newest backup
that is whole, with one log line saying which. (Keras' own `BackupAndRestore`
rewrites its files in place and falls back only on an `OSError`.)
"""

import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import shutil
import signal
import threading
import typing
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Literal

import keras
import numpy as np

from keras_transformer.errors import CheckpointError, RunStopped
from keras_transformer.files import (
    atomic_copy,
    atomic_write,
    file_digest,
    fsync_folder,
    temporary_path,
    write_temporary,
)
from keras_transformer.runtime.keras_internals import load_weights_from
from keras_transformer.trainer.ema import has_average
from keras_transformer.workdir.checkpoints import write_weights_file

log = logging.getLogger("keras_transformer")

WEIGHTS = "latest.weights.h5"
METADATA = "training_metadata.json"
PREVIOUS = ".bkp"  # the backup before the latest: WEIGHTS + PREVIOUS, METADATA + PREVIOUS


def resumed_seed(seed: int, epoch: int = 0, batch: int = 0) -> int:
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


def accumulation_steps(optimizer: Any) -> int:
    """The batches an optimizer accumulates gradients over before each update (its
    `gradient_accumulation_steps`): 1 without accumulation.

    Example:

    >>> [accumulation_steps(keras.optimizers.Adam(gradient_accumulation_steps=k)) for k in (None, 4)]
    [1, 4]
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # under mixed_float16: the LossScaleOptimizer's
    return int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)


@dataclasses.dataclass(frozen=True)
class BackupState:
    """A whole backup: its files and the position it resumes at."""

    weights: pathlib.Path
    metadata: pathlib.Path
    epoch: int  # epochs finished
    done: int  # batches of the next epoch already trained
    previous: bool  # the `.bkp` pair: the latest one was not whole
    problems: tuple = ()  # why the backups before it were passed over, one line each
    moving_average: bool = False  # the optimizer state holds a moving average of the weights (training.ema_decay)
    accumulation: int = 1  # training.gradient_accumulation_steps of the run that wrote it
    stream: typing.Optional[dict] = None  # where the training data's stream resumes (`TrainingData.stream_position`)

    @property
    def position(self) -> tuple[int, int]:
        return (self.epoch, self.done)


def _read_pair(weights: pathlib.Path,
               metadata: pathlib.Path) -> tuple[int, int, bool, int, dict[str, Any] | None]:
    """`(epoch, batches done, moving average, gradient accumulation steps, stream position or None)` of a
    weights file and its metadata; raises on anything that makes them unusable."""
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} is missing")
    try:
        record = json.loads(metadata.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{metadata} is missing") from None
    except ValueError as error:
        raise ValueError(f"{metadata} is not JSON ({error})") from None
    if not isinstance(record, dict) or not isinstance(record.get("epoch"), int):
        raise ValueError(f"{metadata} has no epoch")
    missing = [key for key in ("batches_done", "weights_blake2b", "gradient_accumulation_steps") if key not in record]
    if missing:  # Keras' own record ({"epoch", "batch"}), which versions before 0.2.0 could leave
        raise ValueError(f"{metadata} records no {', '.join(missing)}: a backup of another program or an earlier "
                         "version, which this one does not resume")
    if file_digest(weights) != record["weights_blake2b"]:
        raise ValueError(f"{weights} is not the file {metadata.name} describes (torn or replaced)")
    stream = record.get("stream")
    return (int(record["epoch"]), int(record["batches_done"]), bool(record.get("moving_average", False)),
            int(record["gradient_accumulation_steps"]), stream if isinstance(stream, dict) else None)


def find_backup(backup_dir: str | os.PathLike[str]) -> BackupState | None:
    """The newest whole backup in `backup_dir`: the latest, or the one before it when the latest is not whole.

    Returns:
        A `BackupState`, or None when there is no backup at all.

    Raises:
        CheckpointError: there are backup files, but neither backup is whole (both are named).
    """
    backup_dir = pathlib.Path(backup_dir)
    pairs = [(backup_dir / WEIGHTS, backup_dir / METADATA, False),
             (backup_dir / (WEIGHTS + PREVIOUS), backup_dir / (METADATA + PREVIOUS), True)]
    if not any(path.exists() for weights, metadata, _ in pairs for path in (weights, metadata)):
        return None
    problems = []
    for weights, metadata, previous in pairs:
        try:
            epoch, done, moving_average, accumulation, stream = _read_pair(weights, metadata)
        except (OSError, ValueError, TypeError) as error:
            problems.append(str(error))
            continue
        return BackupState(weights, metadata, epoch, done, previous, tuple(problems), moving_average, accumulation,
                           stream)
    raise CheckpointError(
        f"Cannot resume: no whole training backup in {backup_dir} ({'; '.join(problems)}). To go on from the "
        f"newest epoch checkpoint, start a new workdir with training.init_checkpoint set to it (the optimizer "
        f"starts afresh); to start again from scratch, delete {backup_dir.parent}.")


def backup_position(backup_dir: str | os.PathLike[str]) -> tuple[int, int]:
    """`(epoch, batches)` a run resumes at from `backup_dir`: the epochs finished, and how many batches of the
    next one were trained. `(0, 0)` when there is no backup to resume.

    Raises:
        CheckpointError: there are backup files, but none is whole.
    """
    state = find_backup(backup_dir)
    return (0, 0) if state is None else state.position


def backup_stream(backup_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The training stream's position the newest whole backup in `backup_dir` records (a dict), or None.

    Example:

    >>> import tempfile
    >>> backup_stream(tempfile.mkdtemp()) is None
    True
    """
    state = find_backup(backup_dir)
    return None if state is None else state.stream


def load_backup_weights(model: Any, path: str | os.PathLike[str]) -> Any:
    """`model.load_weights` of a backup's weights file, the previous one (`latest.weights.h5.bkp`) included:
    Keras reads only names ending in `.weights.h5`, so that one is read through a temporary link."""
    path = pathlib.Path(path)
    if path.name.endswith(".weights.h5"):
        load_weights_from(model, path)
        return model
    link = temporary_path(path.with_name("previous.weights.h5"))
    try:
        try:
            os.link(path, link)
        except OSError:
            shutil.copyfile(path, link)
        load_weights_from(model, link)
    finally:
        with contextlib.suppress(OSError):
            link.unlink()
    return model


class ResumableBackup(keras.callbacks.Callback):
    """Backs up the model and optimizer every epoch (or every `save_freq` batches), and restores the newest
    whole backup; a run resumes where it stopped, inside an epoch too.

    Compared with Keras' `BackupAndRestore`, which it replaces:

    - each backup records `batches_done`, the batches of its epoch already
      trained, which `train` uses to run only the rest of an interrupted epoch
      (Keras restores the epoch alone and trains it again from its first batch);
    - with a batch frequency it also backs up at the end of every epoch, and
      skips the backup of an epoch's last batch that this one replaces;
    - a backup is written under temporary names, flushed and renamed, the
      previous one is kept until it is complete, and the metadata records the
      weights file's digest; `restore` takes the newest whole backup and says
      so when that is not the latest;
    - a `guard` (`NonFiniteGuard`) can veto a backup of weights that are no longer finite.

    SIGTERM (how clusters stop a job), while `stop_on_sigterm` is active, lets the
    batch being trained finish, writes a backup at it and raises `RunStopped`:
    the same command resumes at that batch (docs/training.md).

    `restore()` runs before `fit` (which then starts at the restored epoch);
    `offset` is the number of the epoch's batches trained before the current
    `fit` began: `train` sets it for the fit that finishes an interrupted epoch.

    Args:
        backup_dir: the backup folder (created at the first backup).
        save_freq: `"epoch"`, or a number of batches between backups.
        guard: an object with `safe_to_save(model)`, or None.
        position: `position(epoch, done)`, the training data's stream position after `done` batches of
            `epoch` (a JSON-able dict, recorded as `stream`), or None.
    """

    def __init__(self, backup_dir: str | os.PathLike[str], save_freq: Literal["epoch"] | int = "epoch",
                 guard: Any = None, position: Callable[[int, int], dict[str, Any] | None] | None = None) -> None:
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError(f"ResumableBackup: save_freq must be 'epoch' or a positive number of batches, "
                             f"got {save_freq!r}.")
        self.backup_dir = pathlib.Path(backup_dir)
        self.save_freq = save_freq
        self.guard = guard
        self.position = position
        self.offset = 0
        self.epoch = 0  # the epoch being trained (0-based)
        self._done = 0  # its batches trained, those before `offset` included
        self._since = 0  # batches since the last backup
        self._last_end = 0  # `batch + 1` of the last batch end seen in this epoch (steps_per_execution jumps)
        self._latest_whole = False  # whether backup_dir's latest pair is whole, so that it may become `.bkp`
        self.stop_signal: str | None = None  # the name of a signal that asked the run to stop (`stop_on_sigterm`)

    @property
    def weights_path(self) -> pathlib.Path:
        """`backup_dir/latest.weights.h5`: weights and optimizer state."""
        return self.backup_dir / WEIGHTS

    @property
    def metadata_path(self) -> pathlib.Path:
        """`backup_dir/training_metadata.json`: the position the backup resumes at."""
        return self.backup_dir / METADATA

    def restore(self) -> BackupState | None:
        """Loads the newest whole backup into the (built, compiled) model.

        Returns:
            The `BackupState` restored, or None when there is no backup.

        Raises:
            CheckpointError: no backup is whole, or the whole one does not load into this model.
        """
        state = find_backup(self.backup_dir)
        if state is None:
            return None
        if state.previous:
            log.warning("The latest backup is not whole (%s): resuming from the one before it, %s.",
                        "; ".join(state.problems), state.weights)
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        averaged = has_average(model)
        if state.moving_average != averaged:
            now, then = ("on", "off") if averaged else ("off", "on")
            raise CheckpointError(
                f"Cannot resume {self.backup_dir.parent}: training.ema_decay is {now} now but was {then} in the run "
                f"that wrote {state.weights}, and the moving average cannot be added to or taken from a run half "
                f"way. Set training.ema_decay as that run had it (its experiment.yaml), or train in a new workdir "
                f"with training.init_checkpoint set to one of its checkpoints.")
        accumulation = accumulation_steps(model.optimizer)
        if state.accumulation != accumulation:
            # Keras would load the optimizer state of another k as it stands (the update count read at another
            # scale), or skip it all with a warning (from or to 1: its variables differ in number), the update
            # count, and so the schedule, starting over.
            raise CheckpointError(
                f"Cannot resume {self.backup_dir.parent}: training.gradient_accumulation_steps is {accumulation} "
                f"now but was {state.accumulation} in the run that wrote {state.weights}, whose optimizer state "
                f"(its update count, and the gradients it accumulated) belongs to that setting. Set it as that run "
                f"had it (its experiment.yaml), or train in a new workdir with training.init_checkpoint set to one "
                f"of its checkpoints and training.initial_updates to its update count.")
        try:
            load_backup_weights(model, state.weights)
        except Exception as error:  # noqa: BLE001 - h5py and Keras raise many kinds; the file is named
            raise CheckpointError(
                f"Cannot resume: the training backup {state.weights} is corrupt or does not load into this model "
                f"({error}). "
                f"Was model.yaml or the model section changed? To start again from scratch, delete "
                f"{self.backup_dir.parent} (or use a new workdir).") from error
        self.epoch = state.epoch
        self._latest_whole = not state.previous
        return state

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch = epoch
        self._since, self._last_end = 0, 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._done = self.offset + batch + 1
        steps: Any = (self.params or {}).get("steps")
        last = bool(steps) and batch + 1 >= steps  # the epoch's last batch: the epoch-end backup follows
        if self.stop_signal is not None and not last and self._may_stop():
            self.save(self.epoch, self._done)
            raise RunStopped(self.stop_signal, (self.epoch, self._done), self.backup_dir)
        if self.save_freq == "epoch":
            return
        self._since += batch + 1 - self._last_end
        self._last_end = batch + 1
        if last:
            return
        if self._since >= self.save_freq:
            self._since = 0
            self.save(self.epoch, self._done)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._done, self.offset = 0, 0
        self.save(epoch + 1, 0)
        if self.stop_signal is not None and self._may_stop():
            raise RunStopped(self.stop_signal, (epoch + 1, 0), self.backup_dir)

    def _may_stop(self) -> bool:
        """Whether a stop may end the run here: not when the guard stopped it for a non-finite loss (its own
        error then says what was saved)."""
        return self.guard is None or not getattr(self.guard, "tripped", False)

    def save(self, epoch: int, done: int) -> None:
        """Writes a backup that resumes after `done` batches of epoch `epoch` (0-based: the epochs finished)."""
        if self.guard is not None and not self.guard.safe_to_save(self.model):
            return
        self.backup_dir.mkdir(parents=True, exist_ok=True)
        # The new pair is complete on disk before anything is renamed.
        weights = write_temporary(self.weights_path, lambda path: write_weights_file(self.model, path))
        if done:  # inside an epoch: its running loss and metrics, for the process that trains the rest
            save_metric_state(self.model, self.backup_dir, epoch, done)
        record = {"epoch": int(epoch), "batches_done": int(done),
                  "updates": int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)),
                  "moving_average": has_average(self.model),
                  "gradient_accumulation_steps": accumulation_steps(self.model.optimizer),
                  "weights_blake2b": file_digest(weights)}
        stream = self.position(epoch, done) if self.position is not None else None
        if stream is not None:
            record["stream"] = stream
        metadata = write_temporary(self.metadata_path,
                                   lambda path: pathlib.Path(path).write_text(json.dumps(record), encoding="utf-8"))
        # At every instant below, one of the two pairs is whole (its digest matches), whatever is killed when.
        if self._latest_whole:
            atomic_copy(self.weights_path, self.backup_dir / (WEIGHTS + PREVIOUS))
            atomic_copy(self.metadata_path, self.backup_dir / (METADATA + PREVIOUS))
        weights.replace(self.weights_path)
        metadata.replace(self.metadata_path)
        fsync_folder(self.backup_dir)
        self._latest_whole = True


@contextlib.contextmanager
def stop_on_sigterm(backup: ResumableBackup) -> Iterator[ResumableBackup]:
    """While active, SIGTERM asks `backup` (a `ResumableBackup`) to stop the run at the end of the batch being
    trained, after a backup at it; a second SIGTERM ends the process at once, as SIGTERM does by default (the
    backups being atomic, nothing written is lost either way). Outside the main thread, where Python cannot take
    signals, it does nothing.

    Example:

    >>> backup = ResumableBackup("/tmp/kt_backup_example")
    >>> with stop_on_sigterm(backup):
    ...     signal.raise_signal(signal.SIGTERM)  # as `kill PID` does
    >>> backup.stop_signal
    'SIGTERM'
    """
    if threading.current_thread() is not threading.main_thread():
        yield backup
        return

    def handler(number: int, frame: FrameType | None) -> None:
        if backup.stop_signal is not None:  # the second: stop now
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        backup.stop_signal = signal.Signals(number).name

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield backup
    finally:
        signal.signal(signal.SIGTERM, previous)


METRIC_STATE = "metrics.npz"  # in the backup folder


def save_metric_state(model: Any, backup_dir: str | os.PathLike[str], epoch: int, done: int) -> None:
    """Writes the model's metric accumulators (the loss tracker's total and count, the accuracy's) as they stand
    after `done` batches of `epoch`, atomically."""
    values = {f"v{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.metrics_variables)}
    names = np.array([v.path for v in model.metrics_variables])
    atomic_write(pathlib.Path(backup_dir) / METRIC_STATE,
                 lambda path: np.savez(path, epoch=epoch, done=done, names=names, **values))


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

    def __init__(self, backup_dir: str | os.PathLike[str], epoch: int, done: int, replicas: int = 1) -> None:
        super().__init__()
        self.path = pathlib.Path(backup_dir) / METRIC_STATE
        self.epoch, self.done, self.replicas = epoch, done, replicas
        self._pending = False

    def _saved(self) -> list[np.ndarray] | None:
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

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._pending = epoch == self.epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
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
