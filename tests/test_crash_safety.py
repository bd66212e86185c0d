"""What survives what while training: a kill inside a backup write, a torn backup, a full disk, SIGTERM, a loss
that is not finite, a stale temporary. (Exports: tests/test_export.py; two writers on one workdir:
tests/test_cli.py; other faults and their exit statuses: tests/test_faults.py.)"""

import csv
import errno
import io
import os
import pathlib
import shutil

import keras
import numpy as np
import pytest
from factories import SMALL_MODEL, SMALL_RUN, TINY_EXPERIMENT, sigterm_at_update

from keras_transformer import cli, files, training
from keras_transformer.errors import CheckpointError, ConfigError
from keras_transformer.experiment import load_experiment
from keras_transformer.trainer import backup as trainer_backup
from keras_transformer.trainer import loop as trainer_loop
from keras_transformer.trainer.callbacks import HistoryCSV, LearningRateLogger
from keras_transformer.workdir import checkpoints as workdir_module
from keras_transformer.workdir.checkpoints import epoch_checkpoints

# Its module fixtures and traced translators are shared by its tests: `make test` (--dist loadgroup) runs the
# whole file on one worker, so they are built once.
pytestmark = pytest.mark.xdist_group("test_crash_safety")

TINY = TINY_EXPERIMENT
REPO = pathlib.Path(__file__).resolve().parents[1]
# The reference run of this file: two epochs of two batches, in a fixed order (no shuffling, no dropout).
REFERENCE = SMALL_RUN + ["training.epochs=2", "data.shuffle=false"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """`(workdir, final weights)` of REFERENCE trained without interruption, once for the module (never write into
    the workdir: copy it)."""
    workdir = tmp_path_factory.mktemp("uninterrupted") / "run"
    return workdir, training.train(load_experiment(TINY, REFERENCE), workdir).model.get_weights()


def _train_command(workdir, settings=REFERENCE):
    return ["train", "--config", str(TINY), "--workdir", str(workdir)] + [
        part for setting in settings for part in ("--set", setting)]




class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no `except Exception` catches it."""


def _small_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _kernel(path):
    return trainer_backup.load_backup_weights(_small_model(), path).get_weights()[0]


def test_a_backup_killed_at_any_step_of_its_write_leaves_a_whole_one(tmp_path, monkeypatch):
    """A backup renames four files into place; killed before any of those renames (or with none left), the folder
    holds a whole backup, the new one or the one before, whose weights are the ones its position was saved with."""
    model = _small_model()
    kernels = {}

    def save(backup, epoch):
        kernels[epoch] = np.full((2, 3), float(epoch), "float32")
        model.layers[0].kernel.assign(kernels[epoch])
        backup.save(epoch, 0)

    base = tmp_path / "base"
    first = trainer_backup.ResumableBackup(base)
    first.set_model(model)
    save(first, 1)
    save(first, 2)
    assert trainer_backup.backup_position(base) == (2, 0)

    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda *args: (renames.append(args), real_replace(*args))[1])
    counted = tmp_path / "counted"
    shutil.copytree(base, counted)
    backup = trainer_backup.ResumableBackup(counted)
    backup.set_model(model)
    backup.restore()
    save(backup, 3)
    steps = len(renames)
    assert steps >= 4  # the previous pair's two copies, then the new pair's two files

    for kill_at in range(steps + 1):
        folder = tmp_path / f"killed-{kill_at}"
        shutil.copytree(base, folder)
        calls = []

        def replace(*args, kill_at=kill_at):
            if len(calls) == kill_at:
                raise _Killed()
            calls.append(args)
            return real_replace(*args)

        monkeypatch.setattr(os, "replace", real_replace)
        backup = trainer_backup.ResumableBackup(folder)
        backup.set_model(model)
        assert backup.restore().position == (2, 0)
        monkeypatch.setattr(os, "replace", replace)
        try:
            save(backup, 3)
        except _Killed:
            pass
        monkeypatch.setattr(os, "replace", real_replace)
        state = trainer_backup.find_backup(folder)
        assert state is not None and state.position in {(2, 0), (3, 0)}, kill_at
        np.testing.assert_array_equal(_kernel(state.weights), kernels[state.position[0]])
        # A rerun resumes from it and its next backup is whole again.
        resumed = trainer_backup.ResumableBackup(folder)
        resumed.set_model(model)
        assert resumed.restore().position == state.position
        save(resumed, 4)
        assert trainer_backup.find_backup(folder).position == (4, 0)
        assert not trainer_backup.find_backup(folder).previous


@pytest.mark.slow
def test_a_torn_latest_backup_resumes_from_the_one_before_to_the_uninterrupted_run_s_weights(tmp_path, caplog,
                                                                                               uninterrupted):
    """The latest weights cut in half, then (after a rerun made the backups whole again) the latest metadata
    emptied: each time the same command resumes from the backup before it and ends with the weights of an
    uninterrupted run."""
    experiment = load_experiment(TINY, REFERENCE)
    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted[0], workdir)
    uninterrupted = uninterrupted[1]
    caplog.set_level("WARNING", logger="keras_transformer")
    weights, metadata = workdir / "backup" / "latest.weights.h5", workdir / "backup" / "training_metadata.json"
    for tear in (lambda: weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2]),
                 lambda: metadata.write_text("")):
        assert (workdir / "backup" / "latest.weights.h5.bkp").is_file()  # the epoch-1 backup, kept beside
        tear()
        caplog.clear()
        result = training.train(experiment, workdir)  # the same command
        assert "resuming from the one before it" in caplog.text
        assert len(result.history["loss"]) == 1  # epoch 2 again, from the epoch-1 backup
        for ours, reference in zip(result.model.get_weights(), uninterrupted):
            np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)
        assert trainer_backup.find_backup(workdir / "backup").position == (2, 0)


def test_without_any_whole_backup_the_error_names_both_and_what_to_do(tmp_path):
    backup = tmp_path / "run" / "backup"
    backup.mkdir(parents=True)
    for name in ("latest.weights.h5", "latest.weights.h5.bkp"):
        (backup / name).write_bytes(b"\x89HDF torn")
    (backup / "training_metadata.json").write_text("")
    with pytest.raises(CheckpointError) as error:
        training.train(load_experiment(TINY, SMALL_RUN), tmp_path / "run")
    message = str(error.value)
    assert "training_metadata.json is not JSON" in message and "training_metadata.json.bkp is missing" in message
    assert "training.init_checkpoint" in message


def test_a_fresh_run_refuses_a_workdir_with_checkpoints_but_no_backup(tmp_path):
    """Deleting backup/ used to start at epoch 1 again and overwrite ckpt-0001.. while the old run's later
    checkpoints stayed, for `average` to mix."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    for epoch in (1, 2, 3):
        (tmp_path / "run" / "checkpoints" / f"ckpt-{epoch:04d}.weights.h5").write_bytes(b"old run")
    with pytest.raises(ConfigError, match="holds 3 epoch checkpoint.*no backup.*new --workdir"):
        training.train(load_experiment(TINY, SMALL_RUN), tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints" / "ckpt-0001.weights.h5").read_bytes() == b"old run"


def _poison(monkeypatch, update, when):
    """Makes the next `train` produce a non-finite number at optimizer update `update`: its loss (NaN weights
    before the batch) or, with a finite loss, the weights the update leaves (as a non-finite gradient would)."""
    class Poison(LearningRateLogger):
        def _poison(self):
            variable = self.model.trainable_variables[0]
            variable.assign(np.full(variable.shape, np.nan, "float32"))

        def on_train_batch_begin(self, batch, logs=None):
            if when == "loss" and int(self.model.optimizer.iterations) == update - 1:
                self._poison()

        def on_train_batch_end(self, batch, logs=None):
            if when == "gradient" and int(self.model.optimizer.iterations) == update:
                self._poison()

    monkeypatch.setattr(trainer_loop, "LearningRateLogger", Poison)


def _finite(path):
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model

    model = build_model(TransformerConfig.from_yaml(path.parents[1] / "model.yaml" if path.parent.name in (
        "checkpoints", "backup") else path.parent / "model.yaml"))
    if path.parent.name == "backup":
        model.compile(optimizer="adam")
        model.optimizer.build(model.trainable_variables)
    trainer_backup.load_backup_weights(model, path)
    return all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.slow
@pytest.mark.parametrize("when, update, last_backup, steps", [("loss", 13, (1, 4), (4, 8, 12)),
                                                              ("gradient", 12, (1, 2), (4, 8))])
def test_a_non_finite_loss_or_weight_never_reaches_the_disk(tmp_path, monkeypatch, when, update, last_backup, steps):
    """8 batches an epoch, a backup every 2 and a step checkpoint every 4: at update 13 the loss becomes NaN (what
    update 12 saved is the last good state); at update 12 the weights do, with a finite loss (the saves due after
    it are vetoed)."""
    settings = SMALL_MODEL + ["data.train_examples=256", "data.val_examples=32", "data.batch_size=32",
                              "training.epochs=2", "training.verbose=0", "training.tensorboard=false",
                              "training.backup_every_steps=2", "training.checkpoint_every_steps=4",
                              "training.validation=false"]
    experiment = load_experiment(TINY, settings)
    workdir = tmp_path / "run"
    _poison(monkeypatch, update, when)
    with pytest.raises(FloatingPointError) as error:
        training.train(experiment, workdir)
    message = str(error.value)
    saved = sorted((workdir / "checkpoints").glob("*.weights.h5"))
    assert [p.name for p in saved] == ["ckpt-0001.weights.h5"] + [f"step-{n:08d}.weights.h5" for n in steps]
    assert all(_finite(path) for path in saved)
    assert f"update {update}" in message
    assert f"the newest checkpoint, {max(saved, key=lambda path: path.stat().st_mtime)}, holds finite" in message
    assert f"epoch {last_backup[0] + 1}, batch {last_backup[1] + 1}" in message
    assert trainer_backup.backup_position(workdir / "backup") == last_backup
    assert _finite(workdir / "backup" / "latest.weights.h5") and _finite(workdir / "backup" / "latest.weights.h5.bkp")
    assert [row["epoch"] for row in HistoryCSV(workdir / "history.csv").read()[1]] == ["1"]

    monkeypatch.undo()
    result = training.train(experiment, workdir)  # the same command resumes from the last good backup
    assert int(result.model.optimizer.iterations) == 2 * 8
    assert all(np.isfinite(w).all() for w in result.model.get_weights())
    assert [p.name for p in epoch_checkpoints(workdir)] == [f"ckpt-{n:04d}.weights.h5" for n in (1, 2)]


@pytest.mark.slow  # a training run (5 CPU s)
def test_a_run_removes_the_temporaries_a_killed_one_left(tmp_path):
    """A training run started in a workdir where a killed run left temporaries removes them and takes the lock."""
    workdir = tmp_path / "run"
    experiment = load_experiment(TINY, SMALL_RUN)
    training.train(experiment, workdir)
    stale = [workdir / "checkpoints" / ".ckpt-0002.tmp-99999999.weights.h5", workdir / "backup" /
             ".latest.tmp-99999999.weights.h5", workdir / "history.csv.tmp", workdir / ".model.tmp.yaml"]
    for path in stale:
        path.write_bytes(b"half")
    (workdir / "data" / ".vocab.tmp-99999999-abcd").mkdir(parents=True)
    training.train(experiment, workdir)  # nothing to train; still cleans
    assert not any(path.exists() for path in stale) and not (workdir / "data" / ".vocab.tmp-99999999-abcd").exists()
    assert files.lock_holder(workdir)["command"] == "train"


def test_on_nonfinite_offers_stop_only_and_says_why_not_skip():
    assert load_experiment(TINY, ["training.on_nonfinite=stop"]).training.on_nonfinite == "stop"
    with pytest.raises(ConfigError, match="'skip' is not offered"):
        load_experiment(TINY, ["training.on_nonfinite=skip"])
    with pytest.raises(ConfigError, match="training.on_nonfinite must be 'stop'"):
        load_experiment(TINY, ["training.on_nonfinite=ignore"])


class _FullDisk(io.FileIO):
    """A file on a disk that fills up half way through the first write: what `write` returns on a full disk."""

    def write(self, data):
        super().write(bytes(memoryview(data)[:len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.slow
def test_a_full_disk_during_a_backup_ends_in_one_line_loses_nothing_and_the_same_command_resumes(
        tmp_path, monkeypatch, capsys, uninterrupted):
    """The disk fills up while the third epoch's backup is written: one line of ours (the file, the space left,
    that nothing was lost, what to do), status 4, no traceback; the second epoch's backup is whole and untouched;
    the same command, once there is space, resumes from it and trains the third epoch."""
    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted[0], workdir)
    backup = workdir / "backup"
    before = {name: (backup / name).read_bytes() for name in ("latest.weights.h5", "training_metadata.json")}
    command = _train_command(workdir, REFERENCE + ["training.epochs=3"])
    real_open = open

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        if "latest" in os.fspath(path) and "w" in mode:
            return _FullDisk(path, "w")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(workdir_module, "open", open_on_a_full_disk, raising=False)  # the weights file writer
    assert cli.main(command) == 4
    monkeypatch.undo()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("keras-transformer train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"out of disk space writing {backup / 'latest.weights.h5'} (" in lines[0]
    assert "free there): nothing was lost" in lines[0] and "run the same command again to resume" in lines[0]
    assert {name: (backup / name).read_bytes() for name in before} == before
    assert trainer_backup.find_backup(backup).position == (2, 0)
    assert not [path.name for path in backup.iterdir() if files.is_temporary(path.name)]

    assert cli.main(command) == 0
    assert trainer_backup.find_backup(backup).position == (3, 0)
    assert [path.name for path in epoch_checkpoints(workdir)] == [f"ckpt-{n:04d}.weights.h5" for n in (1, 2, 3)]


@pytest.mark.slow
def test_sigterm_mid_epoch_backs_up_that_batch_and_the_same_command_trains_the_rest(tmp_path):
    """SIGTERM to a `train` process during the first batch of its first epoch: the batch finishes, a backup at
    it is written, the process says where it stopped in one line and exits with status 143; the same command
    trains only the batches that epoch had left. (Synthetic data draws a resumed epoch's remaining batches from a
    reseeded order; the packed path serves the very batches left, and its SIGTERM test in tests/test_arrays.py
    ends with the uninterrupted run's weights.)"""
    workdir = tmp_path / "run"
    returncode, err = sigterm_at_update("keras_transformer.cli", _train_command(workdir), 1, tmp_path)
    assert returncode == 143, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("keras-transformer train: error:")]
    assert lines == [f"keras-transformer train: error: stopped by SIGTERM at epoch 1, batch 1 (the backup in "
                     f"{workdir / 'backup'} resumes there); run the same command again to resume."], err[-3000:]
    assert "Traceback" not in err
    assert trainer_backup.find_backup(workdir / "backup").position == (0, 1)
    assert epoch_checkpoints(workdir) == []

    assert cli.main(_train_command(workdir)) == 0  # the same command
    assert trainer_backup.find_backup(workdir / "backup").position == (2, 0)
    with open(workdir / "history.csv", encoding="utf-8") as f:
        assert [(row["epoch"], float(row["step"])) for row in csv.DictReader(f)] == [("1", 2), ("2", 4)]
