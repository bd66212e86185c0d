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
copy). (Assigning blocks of rows in place, with `scatter_update` or a sliced
assignment, puts the variable in TensorFlow's copy-on-read mode: every later
read, such as the weights file's, copies it whole.)

Imported by `imports.family`; TensorFlow only here.
"""

from typing import Any

import numpy as np
import tensorflow as tf

from keras_transformer.imports.checkpoint import ALIGNMENT, aligned_empty

LARGE_BYTES = 1 << 21  # arrays up to this size go through `variable.assign`, copies and all


def assign_array(variable: Any, value: np.ndarray) -> None:
    """Sets `variable` (a Keras variable of `value`'s shape) to `value`; a large float array on TensorFlow without
    a full-size copy, its memory taken over by the variable (`value` must not be written to afterwards).

    Args:
        variable: a `keras.Variable`.
        value: a numpy array of the variable's shape and dtype (float32, or ml_dtypes' bfloat16; other dtypes,
            and other backends, go through `variable.assign`).

    Example:

    >>> import keras
    >>> variable = keras.Variable(np.zeros((1024, 1024), np.float32))
    >>> assign_array(variable, np.ones((1024, 1024), np.float32)); float(variable.numpy().sum())
    1048576.0
    """
    target = variable.value
    if (value.nbytes <= LARGE_BYTES or not isinstance(target, tf.Variable)
            or value.dtype != target.dtype.as_numpy_dtype):
        variable.assign(value)
        return
    if not (value.flags.c_contiguous and value.ctypes.data % ALIGNMENT == 0 and _owns_memory(value)):
        aligned = aligned_empty(value.shape, value.dtype)
        np.copyto(aligned, value)
        value = aligned
    if target.dtype == tf.bfloat16:  # DLPack has no bfloat16: its bits as uint16, reinterpreted (no copy)
        target.assign(tf.bitcast(tf.experimental.dlpack.from_dlpack(value.view(np.uint16).__dlpack__()), tf.bfloat16))
        return
    target.assign(tf.experimental.dlpack.from_dlpack(value.__dlpack__()))


def _owns_memory(array: np.ndarray) -> bool:
    """Whether numpy allocated `array`'s memory (itself or the array it is a view of), not a mapped file."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base is None


__all__ = ["LARGE_BYTES", "assign_array"]
