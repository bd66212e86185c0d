"""Setting a Keras variable of the TensorFlow backend from a large numpy array without a full-size copy.

`variable.assign(array)` converts the array to a tensor (TensorFlow copies it,
twice on the way) before assigning it: for OPUS-MT's shared embedding
(119 MiB) that is two transient copies beside the array read from the
checkpoint and the variable. Here the array becomes a tensor without a copy
(DLPack: the tensor holds the array, which stays alive as long as it does), and
`AssignVariableOp`, given a tensor no other holds, takes its buffer for the
variable and frees the variable's own: after the assignment the array's memory
is the variable's. TensorFlow's CPU kernels assume 64-byte aligned data, so an
array that is not aligned, not contiguous, or whose memory numpy does not own
(a memory-mapped file's) is copied first, once, into one that is
(`imports.checkpoint.SafetensorsFile` reads into aligned arrays, which need no
copy). A model built for an import starts from zeros held the same way
(`unmapped_zeros`, through `runtime.keras_internals.initial_values`): memory
the operating system maps in only where it is written to, which it never is (the
checkpoint's arrays take its place), so the build costs no resident memory and
draws no random numbers. (Assigning blocks of rows in place, with `scatter_update` or a sliced
assignment, puts the variable in TensorFlow's copy-on-read mode: every later
read, such as the weights file's, copies it whole.)

Imported by `imports.family`; TensorFlow only here.
"""

from typing import Any

import ml_dtypes
import numpy as np
import tensorflow as tf

from keras_transformer.imports.checkpoint import ALIGNMENT, aligned_empty

LARGE_BYTES = 1 << 21  # arrays up to this size go through `variable.assign`, copies and all


def assign_array(variable: Any, value: np.ndarray) -> None:
    """Sets `variable` (a Keras variable of `value`'s shape) to `value` rounded to the variable's dtype (bfloat16:
    to nearest, even); a large float array on TensorFlow without a full-size copy, its memory taken over by the
    variable (`value` must not be written to afterwards), or, where it must be rounded or realigned, one copy
    made straight into memory the variable takes over.

    Args:
        variable: a `keras.Variable`.
        value: a numpy array of the variable's shape (a float32 or bfloat16 variable takes a large one without an
            intermediate copy; other dtypes, and other backends, go through `variable.assign`).

    Example:

    >>> import keras
    >>> variable = keras.Variable(np.zeros((1024, 1024), np.float32))
    >>> assign_array(variable, np.ones((1024, 1024), np.float32)); float(variable.numpy().sum())
    1048576.0
    """
    target = variable.value
    dtype = np.dtype(ml_dtypes.bfloat16 if variable.dtype == "bfloat16" else variable.dtype)
    if (dtype.itemsize * value.size <= LARGE_BYTES or not isinstance(target, tf.Variable)
            or dtype not in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))):
        variable.assign(np.asarray(value, dtype=dtype))
        return
    if not (value.dtype == dtype and value.flags.c_contiguous and value.ctypes.data % ALIGNMENT == 0
            and _owns_memory(value)):
        aligned = aligned_empty(value.shape, dtype)
        np.copyto(aligned, value, casting="unsafe")  # rounded as `astype` rounds: to nearest, even
        value = aligned
    if target.dtype == tf.bfloat16:  # DLPack has no bfloat16: its bits as uint16, reinterpreted (no copy)
        target.assign(tf.bitcast(tf.experimental.dlpack.from_dlpack(value.view(np.uint16).__dlpack__()), tf.bfloat16))
        return
    target.assign(tf.experimental.dlpack.from_dlpack(value.__dlpack__()))


def unmapped_zeros(shape: tuple[int, ...], dtype: str) -> Any:
    """A float32 or bfloat16 tensor of zeros over memory that is not resident until written to (a large
    `calloc`, shared with TensorFlow without a copy), for a large variable's initial value; None for a small
    one (up to `LARGE_BYTES`) or another dtype, which keep their initializer.

    Example:

    >>> unmapped_zeros((3,), "float32") is None, float(tf.reduce_sum(unmapped_zeros((1024, 1024), "float32")))
    (True, 0.0)
    """
    numpy_dtype = {"float32": np.float32, "bfloat16": np.uint16}.get(dtype)
    if numpy_dtype is None or np.dtype(numpy_dtype).itemsize * int(np.prod(shape)) <= LARGE_BYTES:
        return None
    value = tf.experimental.dlpack.from_dlpack(aligned_empty(shape, numpy_dtype, zeros=True).__dlpack__())
    return tf.bitcast(value, tf.bfloat16) if dtype == "bfloat16" else value  # DLPack has no bfloat16: its bits


def _owns_memory(array: np.ndarray) -> bool:
    """Whether numpy allocated `array`'s memory (itself or the array it is a view of), not a mapped file."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base is None


__all__ = ["LARGE_BYTES", "assign_array", "unmapped_zeros"]
