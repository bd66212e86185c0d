"""The run and export layout (`keras_transformer.workdir`): the one model loader and its vocabulary checks."""

import time

import numpy as np
import pytest
from factories import make_workdir, tiny_config

from keras_transformer.errors import CheckpointError, CheckpointNotFoundError, ConfigError
from keras_transformer.workdir import checkpoints as workdir
from keras_transformer.workdir import layout


def _run(root, seed, vocab_files):
    """A training workdir of the tiny preset: model.yaml, one epoch checkpoint of noise drawn from `seed`, and
    `data/vocab` files."""
    (model,) = make_workdir(root, tiny_config(vocab_size=24), vocab_files=vocab_files, seed=seed)
    return model


SEPARATE = {"source/tokenizer.json": b"{}", "source/spm.model": b"english", "target/tokenizer.json": b"{}",
            "target/spm.model": b"german"}


def test_separate_vocabularies_that_differ_are_told_apart(tmp_path):
    """Separate vocabularies live in source/ and target/: comparing only top-level files found two empty sets."""
    _run(tmp_path / "a", 1, SEPARATE)
    _run(tmp_path / "b", 2, {**SEPARATE, "target/spm.model": b"french"})
    assert not layout.same_vocabulary(tmp_path / "a" / "data" / "vocab", tmp_path / "b" / "data" / "vocab")
    with pytest.raises(ConfigError, match="different vocabulary"):
        workdir.load_models([tmp_path / "a", tmp_path / "b"])
    # Fine-tuning into a workdir whose own separate vocabulary differs from the checkpoint's is refused too.
    with pytest.raises(ConfigError, match="differs from it"):
        layout.adopt_vocabulary(tmp_path / "a" / "checkpoints" / "ckpt-0001.weights.h5",
                                 tmp_path / "b" / "data" / "vocab")


def test_an_ensemble_of_runs_sharing_a_vocabulary_loads_each_run_s_own_weights(tmp_path):
    first = _run(tmp_path / "a", 1, SEPARATE)
    second = _run(tmp_path / "b", 2, SEPARATE)
    models, configs, vocab, _ = workdir.load_models([tmp_path / "a", tmp_path / "b"])
    assert vocab == tmp_path / "a" / "data" / "vocab" and len(configs) == 2
    for loaded, original in zip(models, (first, second)):
        for a, b in zip(loaded.get_weights(), original.get_weights()):
            np.testing.assert_array_equal(a, b)
    # A fresh copy of the vocabulary for a fine-tuning workdir: the same files, subfolders included.
    layout.adopt_vocabulary(tmp_path / "a" / "checkpoints" / "ckpt-0001.weights.h5", tmp_path / "c" / "data" / "vocab")
    assert layout.folder_files(tmp_path / "c" / "data" / "vocab") == {
        name: content for name, content in sorted(SEPARATE.items())}


def test_averaging_by_the_loader_is_the_mean_of_the_checkpoints(tmp_path):
    model = _run(tmp_path / "a", 1, SEPARATE)
    later = [w + 2.0 for w in model.get_weights()]
    model.set_weights(later)
    workdir.save_weights(model, tmp_path / "a" / "checkpoints" / "ckpt-0002.weights.h5")
    (averaged,), _, _, _ = workdir.load_models(tmp_path / "a", average=2)
    (last,), _, _, _ = workdir.load_models(tmp_path / "a")
    for mean, newest in zip(averaged.get_weights(), last.get_weights()):
        np.testing.assert_allclose(mean, newest - 1.0, rtol=0, atol=1e-5)


def test_missing_folders_configs_and_checkpoints_are_named_with_one_error_type(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="Model folder not found"):
        workdir.load_models(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="not a model folder: not a training workdir .*, a SavedModel "
                                                      "export .*, a CTranslate2 export .* or a LiteRT export"):
        workdir.load_models(tmp_path / "empty")
    _run(tmp_path / "a", 1, SEPARATE)
    with pytest.raises(CheckpointNotFoundError, match="Checkpoint not found: .*ckpt-0009"):
        workdir.load_models(tmp_path / "a", checkpoint=tmp_path / "a" / "checkpoints" / "ckpt-0009.weights.h5")
    (tmp_path / "a" / "checkpoints" / "ckpt-0002.weights.h5").write_bytes(b"not HDF5")
    with pytest.raises(CheckpointError, match="corrupt"):
        workdir.load_models(tmp_path / "a")
    assert issubclass(CheckpointNotFoundError, FileNotFoundError) and issubclass(CheckpointError, ValueError)
    with pytest.raises(ConfigError, match="not both"):
        workdir.load_models(tmp_path / "a", checkpoint="x.weights.h5", average=2)


def test_readers_load_a_whole_set_of_checkpoints_while_train_rotates_them(tmp_path):
    """A `train` with `keep_checkpoints` deletes its oldest checkpoint after each save. A reader that averages the
    newest ones meanwhile (`evaluate --average`, `export --average`, `translate`) loads a set the run held at one
    instant, never a file that has just gone; the deletions the readers held off are made by the next rotation
    that meets no reader."""
    import threading

    from keras_transformer.trainer.callbacks import EpochCheckpoint

    (trainer_model,) = make_workdir(tmp_path, tiny_config(vocab_size=24), epochs=(1,), seed=0)
    marker = trainer_model.weights[-1]  # each epoch's checkpoint holds its epoch number here
    callback = EpochCheckpoint(tmp_path / "checkpoints", keep=2)  # what `train` runs after each epoch
    callback.set_model(trainer_model)
    saved = []

    def save_epoch():
        epoch = len(saved) + 1
        marker.assign(np.full(marker.shape, float(epoch), marker.dtype))
        callback.on_epoch_end(epoch - 1)  # writes ckpt-{epoch}, then deletes all but the newest two
        saved.append(epoch)

    save_epoch()
    save_epoch()
    stop = threading.Event()

    def train():
        while not stop.wait(0.1):  # an epoch every few tenths of a second: a model load sees several
            save_epoch()

    thread = threading.Thread(target=train)
    thread.start()
    averages, errors = [], []
    deadline = time.monotonic() + 120
    try:
        while len(averages) + len(errors) < 4 or len(saved) < 2 + 5:  # reads while rotations happen, however fast
            seen = len(saved)
            try:
                models = workdir.load_models(tmp_path, average=2).models
            except CheckpointNotFoundError as error:
                errors.append(str(error))
            else:
                averages.append(float(np.unique(models[0].weights[-1].numpy())[0]))
            # The next load waits for a rotation (one may have happened during this one): loading back to back,
            # the reader held the interpreter's lock and slowed each save (a Python write per HDF5 block) tenfold.
            while len(saved) == seen:
                assert time.monotonic() < deadline and thread.is_alive(), "the training thread stopped saving"
                time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:3]
    assert saved[-1] > 2 + 4  # checkpoints were written (and rotated) while the readers read
    for average in averages:  # the mean of two consecutive epochs: a set the run held at one instant
        assert average * 2 == round(average * 2) and round(average * 2) % 2 == 1, averages
    save_epoch()  # no reader now: the rotation deletes what the readers held off
    assert [path.name for path in workdir.epoch_checkpoints(tmp_path)] == [
        f"ckpt-{epoch:04d}.weights.h5" for epoch in saved[-2:]]
