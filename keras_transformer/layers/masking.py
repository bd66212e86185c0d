"""The one place masks are built. Masks are booleans; True means "may attend".

Shapes: a padding mask is `(B, T)`; an attention mask is `(B, T, S)` (query
positions by key positions) or anything that broadcasts to it, such as
`(B, 1, S)` for key padding alone.
"""

from typing import Any

from keras import ops


def padding_mask(ids: Any, pad_id: int = 0) -> Any:
    """Returns `ids != pad_id` as a boolean `(B, T)` mask.

    Example:

    >>> import numpy as np
    >>> keras.ops.convert_to_numpy(padding_mask(np.array([[5, 6, 0]]))).tolist()
    [[True, True, False]]
    """
    return ops.not_equal(ids, pad_id)


def causal_mask(query_length: Any, key_length: Any = None, offset: Any = 0) -> Any:
    """Returns the `(T, S)` lower-triangular mask: query i may see keys j <= i + offset.

    `offset` is the position of the first query, used when queries continue a
    cached prefix during decoding.

    Example:

    >>> keras.ops.convert_to_numpy(causal_mask(3)).tolist()[1]
    [True, True, False]
    """
    key_length = query_length if key_length is None else key_length
    rows = ops.expand_dims(ops.arange(query_length) + offset, 1)  # (T, 1)
    cols = ops.expand_dims(ops.arange(key_length), 0)  # (1, S)
    return ops.greater_equal(rows, cols)


def window_mask(query_length: Any, key_length: Any = None, window: int = 1, offset: Any = 0) -> Any:
    """Returns the `(T, S)` band mask |i + offset - j| <= window (restricted self-attention).

    Example:

    >>> keras.ops.convert_to_numpy(window_mask(4, window=1)).tolist()[0]
    [True, True, False, False]
    """
    key_length = query_length if key_length is None else key_length
    rows = ops.expand_dims(ops.arange(query_length) + offset, 1)
    cols = ops.expand_dims(ops.arange(key_length), 0)
    return ops.less_equal(ops.abs(rows - cols), window)


def key_padding_attention_mask(key_padding: Any) -> Any:
    """Turns a `(B, S)` key padding mask into a `(B, 1, S)` attention mask."""
    return ops.expand_dims(ops.cast(key_padding, "bool"), 1)


def merge_masks(*masks: Any) -> Any:
    """Logical AND of masks that broadcast together; `None` entries are skipped.

    Example:

    >>> import numpy as np
    >>> keras.ops.convert_to_numpy(merge_masks(np.array([[True, False]]), None, np.array([[True, True]]))).tolist()
    [[True, False]]
    """
    result = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        result = mask if result is None else ops.logical_and(result, mask)
    return result


import keras  # noqa: E402  (the layer below wraps the functions above)


@keras.saving.register_keras_serializable(package="keras_transformer")
class PaddingMask(keras.layers.Layer):
    """Layer form of `padding_mask` for functional models: ids `(B, T)` -> bool `(B, T)`.

    With `keep_first`, position 0 is never padding: a decoder input whose start
    token is the pad id (`TransformerConfig.bos_id == pad_id`, as Marian's) attends to it.

    Example:

    >>> import numpy as np
    >>> keras.ops.convert_to_numpy(PaddingMask(pad_id=0)(np.array([[7, 0]]))).tolist()
    [[True, False]]
    """

    def __init__(self, pad_id: int = 0, keep_first: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pad_id = int(pad_id)
        self.keep_first = bool(keep_first)
        self.built = True

    def call(self, ids: Any) -> Any:
        mask = padding_mask(ids, self.pad_id)
        if self.keep_first:  # the decoder's start token, which may be the pad id (Marian), is never padding
            first = ops.expand_dims(ops.equal(ops.arange(ops.shape(ids)[1]), 0), 0)  # (1, T)
            mask = ops.logical_or(mask, first)
        return mask

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return tuple(input_shape)

    def compute_output_spec(self, ids: Any) -> Any:
        return keras.KerasTensor(ids.shape, dtype="bool")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pad_id": self.pad_id, "keep_first": self.keep_first}
