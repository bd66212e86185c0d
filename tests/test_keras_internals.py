"""Each assumption `keras_internals` makes about the installed Keras, checked: a Keras release that changes one
fails here, by name, instead of breaking a resumed training run."""

import inspect
import json

import keras
import numpy as np

from keras_transformer import keras_internals
from keras_transformer.trainer.backup import ResumableBackup


def _model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_backup_and_restore_keeps_the_private_state_backup_hooks_name(tmp_path):
    callback = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=1, double_checkpoint=True)
    for name in ("_weights_path", "_training_metadata_path", "_current_epoch", "_last_batch_seen",
                 "_batches_seen_since_last_saving", "_save_model"):
        assert hasattr(callback, name), f"keras.callbacks.BackupAndRestore no longer has {name}"
    assert str(callback._weights_path).endswith("latest.weights.h5")
    assert str(callback._training_metadata_path).endswith("training_metadata.json")


def test_keras_saves_every_backup_through_the_routine_backup_hooks_extends(tmp_path):
    """Keras' epoch-end and batch backups both call `_save_model`; `after_save` then writes our metadata."""
    saved = []

    class Recording(keras_internals.BackupHooks):
        def after_save(self):
            saved.append((self.recorded_epoch, self.last_batch_seen))

    model = _model()
    x, y = np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[Recording(str(tmp_path), save_freq=1, delete_checkpoint=False)])
    # Batch backups record the epochs finished and Keras' zero-based batch index.
    assert saved == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (tmp_path / "latest.weights.h5").is_file()


def test_resumable_backup_records_the_batches_done_after_keras_own_fields(tmp_path):
    model = _model()
    x, y = np.zeros((12, 2), "float32"), np.zeros((12, 1), "float32")
    backup = ResumableBackup(tmp_path, save_freq=1)
    model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[backup])
    position = json.loads((tmp_path / "training_metadata.json").read_text())
    assert position == {"epoch": 1, "batch": 0, "batches_done": 0}  # the epoch-end backup replaced the batch's


def test_losses_scale_by_the_function_keras_internals_reexports():
    """Keras' losses divide by the replicas through this function when they reduce; outside a strategy the value
    is unchanged."""
    from keras.src.losses import loss as keras_loss
    assert "scale_loss_for_distribution(loss)" in inspect.getsource(keras_loss.reduce_values)
    value = keras.ops.convert_to_tensor(3.0)
    assert float(keras_internals.scale_loss_for_distribution(value)) == 3.0


def test_the_multi_worker_workarounds_find_the_trainer_parts_they_replace():
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer
    assert callable(keras_tf_trainer.reduce_per_replica)
    assert list(inspect.signature(keras_tf_trainer.reduce_per_replica).parameters) == ["values", "strategy",
                                                                                       "reduction"]
    model = _model()
    for name in ("_symbolic_build", "_maybe_symbolic_build", "_distribute_strategy"):
        assert hasattr(model, name), f"keras.Model no longer has {name}"
    assert "data_batch" in inspect.signature(model._symbolic_build).parameters
