"""A learned bias on the output logits (Marian's ``final_logits_bias``)."""

from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class OutputBias(keras.layers.Layer):
    """Adds a learned `(vocab_size,)` bias, initialised to zeros, to `(..., vocab_size)` logits.

    The paper's pre-softmax projection has no bias; `TransformerConfig.output_bias`
    adds this layer after it, tied or not (a tied projection reuses the embedding
    matrix, so the bias is the only output weight of its own).

    Args:
        vocab_size: the number of logits.

    Example:

    >>> import numpy as np
    >>> layer = OutputBias(vocab_size=3)
    >>> keras.ops.convert_to_numpy(layer(np.ones((1, 1, 3), "float32"))).tolist()
    [[[1.0, 1.0, 1.0]]]
    """

    def __init__(self, vocab_size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        if self.vocab_size <= 0:
            raise ValueError(f"OutputBias: vocab_size must be positive, got {self.vocab_size}.")
        self.bias = None

    def build(self, logits_shape: Any = None) -> None:
        if logits_shape is not None and logits_shape[-1] not in (None, self.vocab_size):
            raise ValueError(f"{self.name}: logits of width {logits_shape[-1]} do not match vocab_size="
                             f"{self.vocab_size}.")
        self.bias = self.add_weight(name="bias", shape=(self.vocab_size,), initializer="zeros", trainable=True)

    def call(self, logits: Any) -> Any:
        return logits + ops.cast(self.bias, logits.dtype)

    def compute_output_shape(self, logits_shape: Any) -> Any:
        return tuple(logits_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "vocab_size": self.vocab_size}
