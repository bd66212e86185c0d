"""Every place the package reaches into Keras' internals, each with the Keras behaviour it works around.

Nothing else in the package imports `keras.src` or reads a private attribute
of a Keras object: a Keras release that changes one of these breaks this
module, and `tests/test_keras_internals.py` checks each assumption against the
installed Keras, so such a release fails a named test instead of a resumed
training run.

Each `keras.src` module is imported inside the function that uses it, on its
first call, never with this module: a Keras that moves one still imports the
package, and translation and evaluation, which compute no loss, still work.

1. `scale_loss_for_distribution`: the per-replica loss scaling that
   `keras.losses.Loss.__call__` applies, for losses that compute their value
   outside `__call__` (`losses.RDropLoss`). Keras exports no public name for it.
2. `apply_multi_worker_workarounds`: two bugs of Keras' TensorFlow trainer under
   `MultiWorkerMirroredStrategy` (keras-team/keras issues 20329 and 20585),
   fixed by replacing a model method and a trainer function. TensorFlow is passed
   in by the caller (`trainer/distribute.py`), so this module imports keras only.
3. `set_update_count`: with `gradient_accumulation_steps`, an optimizer's
   `iterations` is computed from a private counter of batches, and cannot be
   assigned; `training.initial_updates` sets that counter.
4. `moving_average_pairs` and `keep_raw_weights_after_fit`: an optimizer with
   `use_ema` keeps the moving average of each weight in a private list, and
   every `fit` ends by copying it over the model's weights
   (`finalize_variable_values`), which would make the second of two `fit`
   calls (a resumed epoch's rest, then the remaining epochs) train on from the
   average instead of the raw weights.
5. `schedule_on_updates`: with `gradient_accumulation_steps: k`, Keras
   evaluates a `LearningRateSchedule` at its private count of batches, not at
   `iterations` (the updates applied), so a schedule's warm-up would end after
   `warmup_steps / k` updates. The schedule is given `iterations` instead.
6. `write_weights_to`: a `.weights.h5` file written through a file object that
   keeps a full disk's error from HDF5 (which can end the process on one) and
   raises it once the file is closed; a large variable is written a block of
   rows at a time, where Keras' store would copy it whole first.
7. `quiet_end_of_pass`: Keras warns "Your input ran out of data" at the end of
   every first epoch of a dataset whose length it does not know (a streamed
   corpus); the warning is filtered by those words.
8. `fill_saving_skipsets`: saving and loading weights walk every layer's
   attributes, skipping those of a bare object of its kind; Keras caches that
   skip set under one name and looks it up under another, so it builds a new
   `Layer` for every layer of every save and load (most of the time a backup of
   the tiny model takes). The sets are stored under the name it looks up, before
   every save (`write_weights_to`) and load (`load_weights_from`).
9. `tensorflow_runs_eagerly`: whether Keras' operations run on TensorFlow one at
   a time (not traced into a graph), where a search should prefer one operation
   with a kernel of its own to a loop of small ones (`decoding.sampling`'s
   draw). Keras' own test for it, `in_tf_graph`, has no public name.
10. `initial_values`: a Keras variable runs its initializer when it is
   created, and keeps the result; an import, which overwrites every weight at
   once, builds its model with initial values of its own (memory the operating
   system has not handed over yet) through the variable's private
   `_initialize_with_initializer`: Keras has no public way to create a layer's
   weights without drawing them.
"""

import contextlib
import functools
import io
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np

__all__ = ["END_OF_PASS_WARNING", "WRITE_BLOCK_BYTES", "apply_multi_worker_workarounds", "keep_raw_weights_after_fit",
           "fill_saving_skipsets", "initial_values", "load_weights_from", "moving_average_pairs", "quiet_end_of_pass",
           "scale_loss_for_distribution", "schedule_on_updates", "set_update_count", "tensorflow_runs_eagerly",
           "write_weights_to"]


def scale_loss_for_distribution(value: Any) -> Any:
    """Divides a loss by the number of replicas under a tf.distribute strategy, as `keras.losses.Loss` does.

    Keras sums the replicas' gradients and expects each replica's loss divided
    by the replica count; outside any strategy (and on other backends) the
    value is returned as it is.

    Example:

    >>> float(scale_loss_for_distribution(keras.ops.convert_to_tensor(2.0)))
    2.0
    """
    return _keras_scale_loss()(value)


@functools.cache
def _keras_scale_loss() -> Callable[[Any], Any]:
    # (1) Keras exports no public name for the scaling `Loss.__call__` applies under a distribution strategy.
    try:
        from keras.src.losses.loss import scale_loss_for_distribution
    except ImportError as error:
        raise ImportError(f"Keras {keras.__version__} has no keras.src.losses.loss.scale_loss_for_distribution, "
                          "which keras_transformer's losses use: install the Keras version setup.cfg allows "
                          "(constraints.txt has the tested one).") from error
    return scale_loss_for_distribution


def set_update_count(optimizer: Any, updates: int) -> None:
    """Makes a built optimizer's `iterations` (the updates it has applied) equal `updates`.

    With gradient accumulation, Keras counts batches in a private variable and
    `iterations` is that count divided by the accumulation steps, a computed
    tensor with no `assign`: the batch counter is set instead.

    Example:

    >>> optimizer = keras.optimizers.Adam(gradient_accumulation_steps=4)
    >>> optimizer.build([keras.Variable(np.zeros(3))])
    >>> set_update_count(optimizer, 7)
    >>> int(optimizer.iterations), int(optimizer._iterations)
    (7, 28)
    """
    steps = optimizer.gradient_accumulation_steps
    if steps:
        optimizer._iterations.assign(updates * steps)  # (3) the batch counter behind `iterations`
    else:
        optimizer.iterations.assign(updates)


def schedule_on_updates(optimizer: Any) -> Any:
    """Makes an optimizer evaluate its learning-rate schedule at the updates it has applied (`iterations`).

    With `gradient_accumulation_steps: k`, Keras calls the schedule with its
    private count of batches, k per update, so update u of a run reads the
    schedule at step `k * u + k - 1` where a run without accumulation reads it
    at `u`: the warm-up ends k times too early and the decay runs k times
    ahead. After this call it reads `iterations`, the update count, which is
    also what Adam's bias correction, `set_update_count`, the logged `step` and
    the step checkpoints count. Without accumulation the two counts are one.

    Args:
        optimizer: a Keras optimizer.

    Returns:
        The same optimizer.

    Example:

    >>> schedule = keras.optimizers.schedules.PolynomialDecay(1.0, decay_steps=10, end_learning_rate=0.0)
    >>> optimizer = schedule_on_updates(keras.optimizers.SGD(schedule, gradient_accumulation_steps=4))
    >>> optimizer.build([keras.Variable(np.zeros(3))])
    >>> set_update_count(optimizer, 2)  # 2 updates, 8 batches
    >>> round(float(optimizer.learning_rate), 6)  # schedule(2), not schedule(8)
    0.8
    """
    keras_learning_rate = optimizer._get_current_learning_rate

    def learning_rate_at_updates() -> Any:
        # (5) Keras' `_get_current_learning_rate` passes the schedule `_iterations`, its count of batches.
        if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return optimizer._learning_rate(optimizer.iterations)
        return keras_learning_rate()

    optimizer._get_current_learning_rate = learning_rate_at_updates  # an instance attribute: this optimizer only
    return optimizer


def moving_average_pairs(optimizer: Any) -> list[tuple[Any, Any]]:
    """`[(weight, its moving average)]` of a built optimizer with `use_ema`, in the order it was built with; `[]`
    for one without.

    Keras keeps the averages in `_model_variables_moving_average`, aligned with
    the variables the optimizer was built with (`_trainable_variables`), with
    None for a variable it does not average; those are left out. A
    `LossScaleOptimizer` (mixed_float16) answers for the optimizer it wraps.

    Example:

    >>> weight = keras.Variable(np.zeros(2))
    >>> optimizer = keras.optimizers.SGD(1.0, use_ema=True, ema_momentum=0.5)
    >>> optimizer.build([weight])
    >>> [(w is weight, tuple(a.shape)) for w, a in moving_average_pairs(optimizer)]
    [(True, (2,))]
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # under mixed_float16: the LossScaleOptimizer's
    if not getattr(optimizer, "use_ema", False) or not optimizer.built:
        return []
    # (4) no public name for the averages nor for the variables they belong to
    return [(weight, average) for weight, average in
            zip(optimizer._trainable_variables, optimizer._model_variables_moving_average) if average is not None]


def keep_raw_weights_after_fit(optimizer: Any) -> Any:
    """Stops `fit` from ending with the moving average copied over the model's weights (Keras'
    `finalize_variable_values` with `use_ema`): the caller decides when the model takes the average.

    Returns:
        The same optimizer.
    """
    optimizer.finalize_variable_values = lambda var_list: None  # (4) an instance attribute: this optimizer only
    return optimizer


END_OF_PASS_WARNING = "Your input ran out of data"  # (7) Keras' words when a dataset ends an epoch


@contextlib.contextmanager
def quiet_end_of_pass() -> Iterator[None]:
    """Silences Keras' "Your input ran out of data; interrupting training" inside the block.

    Keras warns so whenever a dataset whose number of batches it does not know yet stops: at the end of every
    first epoch of a streamed text corpus (its length is learned by reading it), where the end of the pass is the
    end of the epoch by design, not a mistake. Other warnings are kept.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=END_OF_PASS_WARNING, category=UserWarning)
        yield


def apply_multi_worker_workarounds(model: Any, tf: Any) -> Any:
    """Lets `model.fit`/`evaluate` run under `MultiWorkerMirroredStrategy` (Keras 3 workarounds).

    Keras 3's TensorFlow trainer has two multi-worker bugs (keras-team/keras
    issues 20329 and 20585) that this fixes for `model`:

    1. Before the first step it builds the model by pulling one batch and
       calling `strategy.reduce("MEAN", batch)`; with dict inputs
       (`{"source", "target"}`) that fails ("Attempt to convert a value
       ({'source': PerReplica...}) ... to a Tensor"). The build only needs the
       batch's shapes, so this model's `_maybe_symbolic_build` uses this
       worker's first local value.
    2. Each step averages the logs with `strategy.reduce("MEAN", v, axis=0)`
       (`keras.src.backend.tensorflow.trainer.reduce_per_replica`), which fails
       on scalar losses and metrics ("Invalid reduction dimension 0 for input
       with 0 dimensions"). Scalars are averaged over all replicas instead;
       every other case keeps Keras' own code.

    Harmless under the other strategies, and a no-op for models built outside
    any strategy scope (`model._distribute_strategy` is None).

    Args:
        model: a Keras model created under a strategy scope.
        tf: the `tensorflow` module (the caller's: this module does not import it).

    Returns:
        The same model.
    """
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or not hasattr(model, "_symbolic_build"):
        return model
    _patch_multi_worker_log_reduction(tf)

    def local_value(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def maybe_symbolic_build(iterator: Any = None, data_batch: Any = None) -> None:
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(local_value, next(batches))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build
    return model


def _patch_multi_worker_log_reduction(tf: Any) -> None:
    # Only with the TensorFlow backend (the only one with tf.distribute), hence imported here.
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer
    original = keras_tf_trainer.reduce_per_replica
    if getattr(original, "_keras_transformer_patch", False):
        return

    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        if reduction in ("auto", "mean") and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            def reduce(value: Any) -> Any:
                if getattr(value, "shape", None) is not None and value.shape.rank == 0:
                    # The mean over all replicas. (reduce "MEAN" of a plain tensor gives the sum over workers.)
                    return strategy.reduce("SUM", value, axis=None) / strategy.num_replicas_in_sync
                return original(value, strategy, reduction)
            return tf.nest.map_structure(reduce, values)
        return original(values, strategy, reduction)

    reduce_per_replica._keras_transformer_patch = True  # type: ignore[attr-defined]
    keras_tf_trainer.reduce_per_replica = reduce_per_replica


def write_weights_to(model: Any, handle: io.BufferedIOBase) -> None:
    """Writes the `.weights.h5` file `model.save_weights` would write (weights and, for a compiled model, optimizer
    state) to `handle`, an open binary file, as HDF5 builds it: no copy of the weights is held in memory, and a
    variable larger than `WRITE_BLOCK_BYTES` is written a block of rows at a time (Keras' `H5IOStore` converts
    each variable whole to numpy first: for OPUS-MT's 119 MiB embedding, two transient copies), into the
    dataset Keras would create, made the same way: the file is Keras' own, byte for byte.

    HDF5 writing straight to a disk that fills up reports each failed write from a destructor, goes on, and can
    end the process with a segmentation fault (h5py 3.14, Keras 3.15). Here HDF5 writes through a file object
    (h5py's file-object driver; Keras' `H5IOStore` takes only an `io.BytesIO`, hence the subclass) that keeps the
    first `OSError` of a write (ENOSPC) and drops the writes after it, so that HDF5 closes the file as if all had
    gone well; that `OSError` is raised then, with nothing left open. HDF5 reads nothing back while it writes a
    new file, so the dropped writes are never read. The function that fills the store (`saving_lib._save_state`)
    has no public name.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    >>> handle = io.BytesIO()
    >>> write_weights_to(model, handle)
    >>> handle.getvalue()[:8] == b"\\x89HDF\\r\\n\\x1a\\n"
    True
    """
    from keras.src.saving import saving_lib

    fill_saving_skipsets()
    stream = _WriteThrough(handle)
    store = _block_store()(stream, mode="w")
    try:
        saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables=set())
    finally:
        store.close()
    if stream.error is not None:
        raise stream.error.with_traceback(None)  # not the frames of the save, which hold its arrays


def load_weights_from(model: Any, path: str | os.PathLike[str]) -> None:
    """`model.load_weights(path)` (a `.weights.h5` file), with the attribute skip sets of its walk cached first
    (`fill_saving_skipsets`): the same weights and optimizer state, several times faster for a small model.

    Example:

    >>> load_weights_from(model, "run/checkpoints/ckpt-0001.weights.h5")  # doctest: +SKIP
    """
    fill_saving_skipsets()
    model.load_weights(str(path))


# The kinds of object whose attributes `saving_lib._walk_saveable` skips (`get_attr_skipset`): a model's layers,
# its optimizer, metrics and losses. Kinds not listed (feature-space preprocessing) are left to Keras.
SKIPSET_KINDS = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss")


def fill_saving_skipsets() -> None:
    """Caches the attribute skip set of each kind in `SKIPSET_KINDS` where Keras' saving looks it up.

    Saving and loading weights (`saving_lib._save_state`, `_load_state`) walk each saveable object's attributes,
    skipping the names a bare object of its kind has (`saving_lib.get_attr_skipset`, which builds one: a new
    `Layer()` and its `dir()`, about 3 ms). Keras 3.15 stores the result as the global attribute
    `saving_attr_skipset_<kind>` but reads `saving_attr_skiplist_<kind>`, so it never finds it and builds the bare
    object again for every layer of every save and load. Here each set is built once and stored under the name it
    reads, in this thread's Keras state (thread-local; `keras.utils.clear_session` empties it, and the next call
    fills it again). The sets are the ones Keras computes, so what is written and read is unchanged. If a Keras
    release reads the name it writes, this is one lookup per kind.

    Example:

    >>> from keras.src.backend.common import global_state
    >>> from keras.src.saving import saving_lib
    >>> fill_saving_skipsets()
    >>> global_state.get_global_attribute("saving_attr_skiplist_Layer") == saving_lib.get_attr_skipset("Layer")
    True
    """
    from keras.src.backend.common import global_state
    from keras.src.saving import saving_lib

    for kind in SKIPSET_KINDS:
        name = f"saving_attr_skiplist_{kind}"
        if global_state.get_global_attribute(name) is None:
            global_state.set_global_attribute(name, saving_lib.get_attr_skipset(kind))


WRITE_BLOCK_BYTES = 1 << 21  # `write_weights_to` writes a larger variable in blocks of rows of about this size


def _rows_per_block(value: Any) -> int | None:
    """The rows of `value` to write at a time, or None for a value Keras' store writes as it is (not a float
    variable of more than `WRITE_BLOCK_BYTES`)."""
    if not isinstance(value, keras.Variable) or len(value.shape) == 0:
        return None
    dtype = keras.backend.standardize_dtype(value.dtype)
    if dtype not in ("bfloat16", "float16", "float32", "float64"):
        return None
    row_bytes = int(np.prod(value.shape[1:], dtype=np.int64)) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    rows = max(1, WRITE_BLOCK_BYTES // max(1, row_bytes))
    return rows if rows < value.shape[0] else None


@functools.cache
def _block_store() -> type:
    from keras.src.saving import saving_lib

    class BlockStore(saving_lib.H5IOStore):
        """Keras' store, with a large variable written a block of rows at a time, the way `H5IOStore.__setitem__`
        writes one whole (the entry's group made at its first value; `group[key] = array`, which makes an
        anonymous dataset and links it by name; for bfloat16, `create_dataset(key, data=array)` and a ``dtype``
        attribute), so that the file is the same, byte for byte."""

        def __setitem__(self, key: str, value: Any) -> None:
            rows = _rows_per_block(value) if self.mode == "w" else None
            if rows is None:
                super().__setitem__(key, value)
                return
            if not self._h5_entry_initialized:  # (6) H5IOStore's own steps, private
                self._create_h5_group(self._h5_entry_path)
            bfloat16 = keras.backend.standardize_dtype(value.dtype) == "bfloat16"
            first = keras.ops.convert_to_numpy(value[:rows])
            dataset = self._h5_entry_group.create_dataset(key if bfloat16 else None, shape=tuple(value.shape),
                                                          dtype=first.dtype)
            dataset[:rows] = first
            for start in range(rows, value.shape[0], rows):
                dataset[start:start + rows] = keras.ops.convert_to_numpy(value[start:start + rows])
            if bfloat16:
                dataset.attrs["dtype"] = "bfloat16"
            else:
                self._h5_entry_group[key] = dataset

    return BlockStore


class _WriteThrough(io.BytesIO):
    """`handle` behind the `io.BytesIO` type that Keras' `H5IOStore` requires (its own buffer stays empty): what
    h5py's file-object driver calls (seek, tell, read, write, truncate, flush) goes to `handle`, except that the
    first `OSError` of a write, truncate or flush is kept in `error` and the writes after it are dropped."""

    def __init__(self, handle: io.BufferedIOBase) -> None:
        super().__init__()
        self.handle = handle
        self.error: OSError | None = None

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()

    def read(self, size: int | None = -1) -> bytes:
        return self.handle.read(size)

    def readinto(self, buffer: Any) -> int:
        return self.handle.readinto(buffer)

    def write(self, data: Any) -> int:
        if self.error is None:
            try:
                return self.handle.write(data)
            except OSError as error:
                self.error = error
        return memoryview(data).nbytes

    def truncate(self, size: int | None = None) -> Any:
        if self.error is None:
            try:
                return self.handle.truncate(size)
            except OSError as error:
                self.error = error
        return size

    def flush(self) -> None:
        if self.error is None:
            try:
                self.handle.flush()
            except OSError as error:
                self.error = error


def tensorflow_runs_eagerly() -> bool:
    """True where Keras runs on TensorFlow and its operations execute one at a time: not inside a `tf.function`
    (with or without XLA) or a `tf.data` pipeline's graph. False on other backends (JAX compiles every operation
    with XLA).

    Example:

    >>> keras.backend.backend() != "tensorflow" or tensorflow_runs_eagerly()
    True
    """
    if keras.backend.backend() != "tensorflow":
        return False
    from keras.src.utils.backend_utils import in_tf_graph

    return not in_tf_graph()


@contextlib.contextmanager
def initial_values(replace: Callable[[tuple[int, ...], str], Any]) -> Iterator[None]:
    """Within the block, a Keras variable created with an initializer starts from `replace(shape, dtype)` where that
    returns a value (a tensor of that shape and dtype), and from its initializer, as usual, where it returns None.

    Layers create their weights from initializers (random draws, for most); an import that overwrites every
    weight has no use for the draws, and its peak memory would hold them beside the checkpoint's values.
    Not thread-safe: variables created by other threads meanwhile take `replace`'s values too.

    Example:

    >>> with initial_values(lambda shape, dtype: keras.ops.full(shape, 7.0, dtype) if shape == (2,) else None):
    ...     layer = keras.layers.Dense(2); layer.build((None, 3))
    >>> layer.bias.numpy().tolist(), bool(layer.kernel.numpy().std() > 0)
    ([7.0, 7.0], True)
    """
    variable_class = keras.Variable
    original = variable_class._initialize_with_initializer  # (10) no public hook between initializer and value

    def initialize(variable: Any, initializer: Any) -> None:
        def initial(shape: Any, dtype: Any = None) -> Any:
            value = replace(tuple(shape), keras.backend.standardize_dtype(dtype))
            return initializer(shape, dtype=dtype) if value is None else value

        original(variable, initial)

    variable_class._initialize_with_initializer = initialize
    try:
        yield
    finally:
        variable_class._initialize_with_initializer = original
