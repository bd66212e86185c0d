"""Each assumption `keras_internals` makes about the installed Keras, checked: a Keras release that changes one
fails here, by name, instead of breaking a resumed training run."""

import io
import json
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

from keras_transformer.runtime import keras_internals

# The module fixture runs a subprocess: `make test` (--dist loadgroup) runs the whole file on one worker, so that
# it runs once.
pytestmark = pytest.mark.xdist_group("test_keras_internals")


def _model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


# ------------------------------------------------------------------ two replicas (MirroredStrategy, 2 logical CPUs)
# Logical CPU devices must be configured before TensorFlow starts, hence a subprocess; both checks share it.
_TWO_REPLICAS = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from keras_transformer.runtime import keras_internals
    from keras_transformer.trainer.losses import RDropLoss

    rng = np.random.default_rng(0)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out = {"replicas": mirrored.num_replicas_in_sync}

    # R-Drop: batches of 8 rows (4 pairs) of 3 positions over 6 ids, no pads, so both replicas' halves hold as many
    # tokens and the mean of their losses is the loss of the batch.
    x, y = rng.normal(size=(16, 3, 4)).astype("float32"), rng.integers(1, 6, size=(16, 3))
    kernel = rng.normal(size=(4, 6)).astype("float32")

    def rdrop(strategy):
        with strategy.scope():
            model = keras.Sequential([keras.Input((3, 4)), keras.layers.Dense(6)])
            model.set_weights([kernel, np.zeros(6, "float32")])
            model.compile(optimizer=keras.optimizers.SGD(0.5), loss=RDropLoss(5.0, 0.1), jit_compile=False)
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        return {"loss": history.history["loss"], "weights": [w.tolist() for w in model.get_weights()]}

    out["rdrop"] = {"mirrored": rdrop(mirrored), "one_device": rdrop(tf.distribute.OneDeviceStrategy("/cpu:0"))}

    # The multi-worker workarounds on a model with dict inputs (as the Transformer's), under a strategy they must
    # leave alone; the run without them comes first (they replace a Keras trainer function for the process).
    inputs = {"a": rng.normal(size=(16, 3)).astype("float32"), "b": rng.normal(size=(16, 2)).astype("float32")}
    dataset = tf.data.Dataset.from_tensor_slices((inputs, rng.normal(size=(16, 1)).astype("float32"))).batch(8)

    def dict_model(workarounds):
        with mirrored.scope():
            a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
            model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
            model.set_weights([np.linspace(-1, 1, 5, dtype="float32")[:, None], np.zeros(1, "float32")])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"], jit_compile=False)
        builds = []
        if workarounds:
            keras_internals.apply_multi_worker_workarounds(model, tf)
            keras_build = model._symbolic_build

            def recording_build(data_batch=None, **kwargs):  # what the workaround hands Keras' build
                builds.append([[isinstance(v, tf.distribute.DistributedValues), int(v.shape[0])]
                               for v in tf.nest.flatten(data_batch)])
                return keras_build(data_batch=data_batch, **kwargs)

            model._symbolic_build = recording_build
        history = model.fit(dataset, epochs=2, shuffle=False, verbose=0)
        return {"history": history.history, "builds": builds}

    out["plain"], out["workarounds"] = dict_model(False), dict_model(True)
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def two_replicas():
    completed = subprocess.run([sys.executable, "-c", _TWO_REPLICAS], capture_output=True, text=True, timeout=300)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["replicas"] == 2
    return result


@pytest.mark.slow  # its fixture: a subprocess of 6-7 s (importing TensorFlow, tracing four small fits)
def test_rdrop_under_a_mirrored_strategy_gives_the_losses_and_weights_of_one_device(two_replicas):
    """RDropLoss computes its value outside `Loss.__call__`, so it divides by the replicas itself
    (`scale_loss_for_distribution`, from Keras' internals): without that, Keras would sum two full-size gradients
    and report twice the loss. Each replica's rows hold whole pairs, so the divergence term is the same too."""
    mirrored, single = two_replicas["rdrop"]["mirrored"], two_replicas["rdrop"]["one_device"]
    assert single["loss"][-1] < single["loss"][0] - 0.5  # it trained
    np.testing.assert_allclose(mirrored["loss"], single["loss"], rtol=1e-5)
    for a, b in zip(mirrored["weights"], single["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)


@pytest.mark.slow  # its fixture: a subprocess of 6-7 s (importing TensorFlow, tracing four small fits)
def test_the_multi_worker_workarounds_build_from_one_replica_and_leave_mirrored_training_as_it_was(two_replicas):
    """Keras builds the model before the first step through the replaced hook, which hands it one replica's batch
    (4 of 8 rows) instead of Keras' cross-replica mean of dict inputs, the call that fails across workers; the
    losses and metrics are those of the same model without the workarounds. (The workers themselves:
    tests/test_distribute.py trains on two processes.)"""
    plain, patched = two_replicas["plain"], two_replicas["workarounds"]
    assert patched["builds"] == [[[False, 4], [False, 4], [False, 4]]]  # inputs a and b, and the targets
    assert plain["history"].keys() == patched["history"].keys() == {"loss", "mae"}
    for name in plain["history"]:
        np.testing.assert_allclose(patched["history"][name], plain["history"][name], rtol=1e-6)
    assert plain["history"]["loss"][-1] < plain["history"]["loss"][0]


# ------------------------------------------------------------------ a Keras that moved its private loss scaling
_WITHOUT_SCALE_LOSS = textwrap.dedent("""
    import builtins, sys
    keras_import = builtins.__import__

    def moved(name, globals=None, locals=None, fromlist=(), level=0):
        # As keras_transformer would see a Keras without it; Keras' own modules still import it.
        if (name == "keras.src.losses.loss" and "scale_loss_for_distribution" in (fromlist or ())
                and (globals or {}).get("__name__", "").startswith("keras_transformer")):
            raise ImportError("cannot import name 'scale_loss_for_distribution' from 'keras.src.losses.loss'")
        return keras_import(name, globals, locals, fromlist, level)

    builtins.__import__ = moved
    import keras_transformer.evaluation, keras_transformer.training, keras_transformer.engines.tensorflow
    from keras_transformer import cli
    from keras_transformer.runtime import keras_internals
    from keras_transformer.trainer import losses
    losses.RDropLoss(5.0)
    try:
        keras_internals.scale_loss_for_distribution(1.0)
    except ImportError as error:
        print("SCALE", error)
    sys.exit(cli.main(["translate", "--model", sys.argv[1], "A dog."]))
""")


@pytest.mark.slow
def test_translate_and_evaluate_import_and_run_without_keras_private_loss_scaling(tmp_path):
    """Only computing a loss needs `keras.src.losses.loss.scale_loss_for_distribution`: with a Keras that moved
    it, the package, its losses, training, evaluation and translation modules import, and `translate` runs until
    it finds no model (this test's stand-in for one); the loss scaling fails by name when called."""
    missing = tmp_path / "no_model"
    completed = subprocess.run([sys.executable, "-c", _WITHOUT_SCALE_LOSS, str(missing)], capture_output=True,
                               text=True, timeout=300)
    assert "SCALE Keras " in completed.stdout and "has no keras.src.losses.loss.scale_loss_for_distribution" \
        in completed.stdout, completed.stdout + completed.stderr[-3000:]
    assert completed.returncode == 2 and f"Model folder not found: {missing}" in completed.stderr, \
        completed.stderr[-3000:]


# ------------------------------------------------------------------ set_update_count
class _StepAsRate(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):  # the learning rate is the step it is given, so an update shows the step it read
        return keras.ops.cast(step, "float32")


@pytest.mark.parametrize("accumulation", [None, 4])
def test_an_optimizer_set_to_7_updates_goes_on_as_one_that_made_them(accumulation):
    """A resumed run goes on counting updates (`training.initial_updates`): after `set_update_count(7)` the
    optimizer makes its next update when, and as, one that applied 7 updates does: after as many batches (4 with
    gradient accumulation), with the same learning rate from the schedule, and then counts 8."""
    def optimizer_and_variable():
        variable = keras.Variable(np.zeros(1, "float32"))
        optimizer = keras.optimizers.SGD(learning_rate=_StepAsRate(), gradient_accumulation_steps=accumulation)
        optimizer.build([variable])
        return optimizer, variable

    batches = accumulation or 1
    ran, ran_variable = optimizer_and_variable()
    for _ in range(7 * batches):
        ran.apply([keras.ops.ones(1)], [ran_variable])
    resumed, resumed_variable = optimizer_and_variable()
    keras_internals.set_update_count(resumed, 7)
    assert int(resumed.iterations) == int(ran.iterations) == 7
    start = float(ran_variable.numpy()[0])
    moves = []
    for _ in range(batches):
        for optimizer, variable in ((ran, ran_variable), (resumed, resumed_variable)):
            optimizer.apply([keras.ops.ones(1)], [variable])
        moves.append((float(ran_variable.numpy()[0]) - start, float(resumed_variable.numpy()[0])))
    assert moves[:-1] == [(0.0, 0.0)] * (batches - 1)  # accumulating: no update before the last batch
    assert moves[-1][0] == moves[-1][1] < 0  # the same update, from the same step of the schedule
    assert int(resumed.iterations) == int(ran.iterations) == 8


class _StepPlusOneAsRate(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):  # never 0, so that every update moves the variable, by the step it read plus one
        return keras.ops.cast(step, "float32") + 1.0

    def get_config(self):
        return {}


def _steps_read(optimizer, batches):
    """The schedule step each update of `optimizer` (SGD on `_StepPlusOneAsRate`) read, over `batches` batches."""
    variable = keras.Variable(np.zeros(1, "float32"))
    optimizer.build([variable])
    steps = []
    for _ in range(batches):
        before = float(variable.numpy()[0])
        optimizer.apply([keras.ops.ones(1)], [variable])
        if float(variable.numpy()[0]) != before:
            steps.append(round(before - float(variable.numpy()[0]) - 1.0))
    return steps


def test_with_gradient_accumulation_keras_reads_the_schedule_at_batches_and_schedule_on_updates_at_updates():
    """Keras evaluates a schedule at its private count of batches, so with accumulation over 4 batches its updates
    read steps 3, 7, 11 where an optimizer without accumulation reads 0, 1, 2 (the warm-up would end 4 times too
    early); `schedule_on_updates` makes them read 0, 1, 2. A Keras that reads the update count itself fails the
    first assertion (and `schedule_on_updates` has become unnecessary); one that no longer asks
    `_get_current_learning_rate` fails the second."""
    def sgd(**kwargs):
        return keras.optimizers.SGD(learning_rate=_StepPlusOneAsRate(), **kwargs)

    assert _steps_read(sgd(), 3) == [0, 1, 2]
    assert _steps_read(sgd(gradient_accumulation_steps=4), 12) == [3, 7, 11]  # Keras' own: the batch count
    on_updates = keras_internals.schedule_on_updates(sgd(gradient_accumulation_steps=4))
    assert _steps_read(on_updates, 12) == [0, 1, 2]
    config = sgd(gradient_accumulation_steps=4, name=on_updates.name).get_config()
    assert on_updates.get_config() == config  # saved as Keras' own


# ------------------------------------------------------------------ moving averages (training.ema_decay)
def test_moving_averages_pair_with_their_weights_and_fit_can_leave_the_raw_weights_in_place():
    """Keras' optimizer EMA: one average per trainable weight, in the order the optimizer was built with, the
    first update copying the weight; `fit` ends by copying the averages over the weights unless
    `keep_raw_weights_after_fit` says otherwise."""
    def fitted(keep_raw):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5), loss="mse")
        model.optimizer.build(model.trainable_variables)
        if keep_raw:
            keras_internals.keep_raw_weights_after_fit(model.optimizer)
        pairs = keras_internals.moving_average_pairs(model.optimizer)
        assert [weight.path for weight, _ in pairs] == [v.path for v in model.trainable_variables]
        x, y = np.ones((4, 2), "float32"), np.zeros((4, 1), "float32")
        raw = []

        class Record(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                raw.append([w.numpy().copy() for w in self.model.trainable_variables])
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=[Record()])
        return model, pairs, raw

    model, pairs, raw = fitted(keep_raw=True)
    expected = [0.5 * first + 0.5 * second for first, second in zip(*raw)]  # the first update copies
    for (weight, average), value, last in zip(pairs, expected, raw[-1]):
        np.testing.assert_allclose(average.numpy(), value, rtol=1e-6)
        np.testing.assert_array_equal(weight.numpy(), last)  # raw weights after fit
    model, pairs, raw = fitted(keep_raw=False)
    for (weight, average), last in zip(pairs, raw[-1]):  # Keras' own ending: the averages replace the weights
        np.testing.assert_array_equal(weight.numpy(), average.numpy())
        assert not np.array_equal(weight.numpy(), last)
    assert keras_internals.moving_average_pairs(keras.optimizers.SGD()) == []


def test_a_weights_file_written_through_a_file_object_is_the_one_save_weights_writes(tmp_path):
    """The file of `write_weights_to` loads back as `model.save_weights`' file does: the weights and, for a
    compiled model, the optimizer's state (its update count and moments)."""
    def compiled(seed):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
        return model

    model = compiled(0)
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), epochs=2, verbose=0)
    with open(tmp_path / "through.weights.h5", "w+b") as handle:
        keras_internals.write_weights_to(model, handle)
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    for name in ("through.weights.h5", "keras.weights.h5"):
        other = compiled(1)
        other.optimizer.build(other.trainable_variables)
        other.load_weights(str(tmp_path / name))
        for ours, theirs in zip(other.optimizer.variables, model.optimizer.variables, strict=True):
            np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
        for ours, theirs in zip(other.get_weights(), model.get_weights(), strict=True):
            np.testing.assert_array_equal(ours, theirs)
    assert int(model.optimizer.iterations) == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_large_variable_written_a_block_of_rows_at_a_time_gives_keras_own_file_byte_for_byte(dtype):
    """The assumption of `write_weights_to`'s blocks: they make the dataset `H5IOStore.__setitem__` makes (for
    bfloat16, a named dataset with Keras' ``dtype`` attribute), so the file is the one Keras' own store writes
    (here into memory, as `save_weights` would), byte for byte."""
    from keras.src.saving import saving_lib

    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(2200, 512, dtype=dtype),
                              keras.layers.Dense(2, dtype=dtype)])
    assert 2200 * 512 * 2 > keras_internals.WRITE_BLOCK_BYTES  # the embedding is written in blocks
    keras_own = io.BytesIO()
    store = saving_lib.H5IOStore(keras_own, mode="w")
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="", visited_saveables=set())
    store.close()
    ours = io.BytesIO()
    keras_internals.write_weights_to(model, ours)
    assert ours.getvalue() == keras_own.getvalue()


@pytest.mark.slow  # a save and a load of a model twice over (7 CPU s)
def test_the_saving_walk_s_skip_sets_are_built_once_each_and_are_the_sets_keras_builds(tmp_path, monkeypatch):
    """The assumption of `fill_saving_skipsets`: Keras' own save and load build a bare `Layer` for every layer they
    walk (the skip set it caches is looked up under another name). Filled, a save and a load build none, and each
    kind's set is the one Keras computes."""
    from keras.src.backend.common import global_state
    from keras.src.layers.layer import Layer
    from keras.src.saving import saving_lib

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), *(keras.layers.Dense(4) for _ in range(5)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), epochs=1, verbose=0)
    bare = []
    original = Layer.__init__

    def counting(self, *args, **kwargs):
        if type(self) is Layer:
            bare.append(self)
        original(self, *args, **kwargs)

    keras.utils.clear_session()  # this thread's Keras state empty: no skip set cached under either name
    monkeypatch.setattr(Layer, "__init__", counting)
    keras_own = io.BytesIO()  # Keras' own store, as in the test above
    store = saving_lib.H5IOStore(keras_own, mode="w")
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="", visited_saveables=set())
    store.close()
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    model.load_weights(str(tmp_path / "keras.weights.h5"))
    assert len(bare) >= 3 * 6  # Keras alone: one bare Layer per layer walked, at every save and load
    keras_built = {kind: saving_lib.get_attr_skipset(kind) for kind in keras_internals.SKIPSET_KINDS}
    keras.utils.clear_session()
    keras_internals.fill_saving_skipsets()
    bare.clear()
    ours = io.BytesIO()
    keras_internals.write_weights_to(model, ours)
    keras_internals.load_weights_from(model, tmp_path / "keras.weights.h5")
    assert bare == []
    for kind, expected in keras_built.items():
        assert global_state.get_global_attribute(f"saving_attr_skiplist_{kind}") == expected
        assert saving_lib.get_attr_skipset(kind) == expected
    assert ours.getvalue() == keras_own.getvalue()


def test_a_full_disk_while_a_weights_file_is_written_raises_its_os_error_once_hdf5_has_closed_the_file(tmp_path):
    """HDF5 sees no failed write (the one that fails and those after it are dropped): the file is closed, no HDF5
    object is left open, and the disk's own `OSError` is what the caller gets."""
    import errno
    import os

    import h5py

    class FullDisk(io.FileIO):
        def __init__(self, path, room):
            super().__init__(path, "w+")
            self.room = room

        def write(self, data):
            if self.room < memoryview(data).nbytes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.room -= memoryview(data).nbytes
            return super().write(data)

    model = keras.Sequential([keras.Input((300,)), keras.layers.Dense(400), keras.layers.Dense(2)])
    open_before = h5py.h5f.get_obj_count(types=h5py.h5f.OBJ_FILE)
    with FullDisk(tmp_path / "full.weights.h5", room=100_000) as handle:
        with pytest.raises(OSError) as raised:
            keras_internals.write_weights_to(model, handle)
    assert raised.value.errno == errno.ENOSPC
    assert h5py.h5f.get_obj_count(types=h5py.h5f.OBJ_FILE) == open_before
    assert (tmp_path / "full.weights.h5").stat().st_size <= 100_000


def test_keras_warns_when_a_dataset_of_unknown_length_ends_its_first_epoch_and_the_filter_silences_it():
    """The assumption of `quiet_end_of_pass`: Keras' words when a dataset whose length it does not know ends an
    epoch (the first of a streamed corpus). If Keras changes them, this fails and the filter must follow."""
    import tensorflow as tf

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((tf.ones((2, 2)), tf.zeros((2, 1)))).repeat(3)
    data = data.filter(lambda x, y: True)  # a filter hides the length from Keras, as a stream's windows do
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(data, epochs=1, verbose=0, shuffle=False)
    assert any(keras_internals.END_OF_PASS_WARNING in str(w.message) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with keras_internals.quiet_end_of_pass():
            model.fit(data, epochs=1, verbose=0, shuffle=False)
            warnings.warn("another warning")
    assert [str(w.message) for w in caught] == ["another warning"]


def test_tensorflow_runs_eagerly_outside_a_graph_only():
    """The assumption of `tensorflow_runs_eagerly` (Keras' `in_tf_graph`): True where operations run one at a
    time, False while a `tf.function` traces (with or without XLA), so that sampling sorts eagerly only."""
    import tensorflow as tf

    seen = []

    def record():
        seen.append(keras_internals.tensorflow_runs_eagerly())
        return tf.constant(0)

    record()
    tf.function(record)()
    tf.function(record, jit_compile=True)()
    assert seen == [True, False, False]


def test_initial_values_replace_the_draws_of_the_variables_they_give_a_value_and_only_within_the_block():
    """The assumption of `initial_values` (a Keras variable's private `_initialize_with_initializer`): inside the
    block a layer's large weights start from the given values, for float32 and bfloat16, and a weight it gives no
    value keeps its initializer; after the block, and after an error inside it, layers draw as before."""
    from keras_transformer.imports.tensorflow_weights import unmapped_zeros

    def built(dtype="float32"):
        layer = keras.layers.Dense(2048, dtype=dtype)
        layer.build((None, 1024))
        return layer

    for dtype in ("float32", "bfloat16"):
        with keras_internals.initial_values(unmapped_zeros):
            layer = built(dtype)
        kernel = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(layer.kernel, "float32")))
        assert layer.kernel.dtype == dtype and not kernel.any()  # 4 or 8 MiB: zeros, not a draw
        assert layer.bias.dtype == dtype  # 4 or 8 KiB: its initializer ("zeros" too) ran
    with keras_internals.initial_values(lambda shape, dtype: None):
        assert built().kernel.numpy().std() > 0  # no value given: glorot_uniform's draw
    with pytest.raises(RuntimeError), keras_internals.initial_values(unmapped_zeros):
        raise RuntimeError("inside")
    assert built().kernel.numpy().std() > 0
