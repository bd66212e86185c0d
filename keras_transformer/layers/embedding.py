"""Token embeddings scaled by sqrt(d_model), reusable as the tied pre-softmax projection."""

from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Looks up token vectors and multiplies them by sqrt(d_model) (section 3.4).

    Called with `reverse=True` it maps `(B, T, d_model)` hidden states to
    `(B, T, vocab_size)` float32 logits with the transposed matrix, which is how
    the embedding and pre-softmax weights are shared.

    Args:
        vocab_size: number of tokens.
        d_model: embedding width.
        scale: multiply looked-up vectors by sqrt(d_model) (the paper) or not.
        embeddings_initializer: defaults to N(0, d_model^-0.5), so that scaled
            embeddings start with unit variance.

    Example:

    >>> import numpy as np
    >>> emb = TokenEmbedding(vocab_size=10, d_model=4)
    >>> tuple(emb(np.array([[1, 2]])).shape), tuple(emb(np.zeros((1, 2, 4)), reverse=True).shape)
    ((1, 2, 4), (1, 2, 10))
    """

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True, embeddings_initializer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)
        self.scale = bool(scale)
        if self.vocab_size <= 0 or self.d_model <= 0:
            raise ValueError(f"TokenEmbedding: vocab_size and d_model must be positive, "
                             f"got {self.vocab_size} and {self.d_model}.")
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=self.d_model ** -0.5)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embeddings = None

    def build(self, input_shape: Any = None) -> None:
        self.embeddings = self.add_weight(name="embeddings", shape=(self.vocab_size, self.d_model),
                                          initializer=self.embeddings_initializer, trainable=True)

    def call(self, inputs: Any, reverse: bool = False) -> Any:
        if reverse:
            kernel = ops.cast(self.embeddings, inputs.dtype)
            logits = ops.matmul(inputs, ops.transpose(kernel))  # (B, T, V)
            return ops.cast(logits, "float32")
        ids = ops.cast(inputs, "int32")
        vectors = ops.take(ops.cast(self.embeddings, self.compute_dtype), ids, axis=0)  # (B, T, D)
        if self.scale:
            vectors = vectors * ops.cast(self.d_model ** 0.5, vectors.dtype)
        return vectors

    def compute_output_spec(self, inputs: Any, reverse: bool = False) -> Any:
        if reverse:
            return keras.KerasTensor((*inputs.shape[:-1], self.vocab_size), dtype="float32")
        return keras.KerasTensor((*inputs.shape, self.d_model), dtype=self.compute_dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "scale": self.scale,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer)}
