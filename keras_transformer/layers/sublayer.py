"""The residual "sublayer connection" around every attention and feed-forward block."""

from typing import Any

import keras

from keras_transformer.layers.normalization import normalization_layer


@keras.saving.register_keras_serializable(package="keras_transformer")
class SublayerConnection(keras.layers.Layer):
    """Residual connection with dropout and LayerNorm, written once and reused.

    Post-norm (the paper): `LayerNorm(x + Dropout(Sublayer(x)))`.
    Pre-norm: `x + Dropout(Sublayer(LayerNorm(x)))`.
    With ReZero the sub-layer output is multiplied by a learned scalar that
    starts at 0, so every block starts as the identity.

    Use: `h = block.normalize(x)`, run the sub-layer on `h`, then `x = block(x, sublayer_output)`.

    Args:
        norm_first: pre-norm (True) or post-norm (False).
        dropout: rate on the sub-layer output before the residual add.
        use_rezero: scale the sub-layer output by a learned scalar (init 0).
        epsilon: LayerNorm epsilon.
        normalization: "layer" (LayerNorm) or "rms" (RMS normalization, T5's).

    Example:

    >>> import numpy as np
    >>> block = SublayerConnection(norm_first=False, dropout=0.0)
    >>> x = np.random.rand(1, 3, 4).astype("float32")
    >>> y = block(x, np.zeros_like(x))
    >>> np.allclose(y.numpy().mean(-1), 0, atol=1e-5)
    True
    """

    def __init__(self, norm_first: bool = False, dropout: float = 0.0, use_rezero: bool = False, epsilon: float = 1e-6,
                 normalization: str = "layer", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.norm_first = bool(norm_first)
        self.dropout = float(dropout)
        self.use_rezero = bool(use_rezero)
        self.epsilon = float(epsilon)
        self.normalization = normalization
        self.norm = normalization_layer(normalization, self.epsilon, dtype=self.dtype_policy, name="layer_norm")
        self.output_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="dropout")
        self.rezero_alpha = None

    def build(self, x_shape: Any, sublayer_output_shape: Any = None) -> None:
        self.norm.build(x_shape)
        if self.use_rezero:
            self.rezero_alpha = self.add_weight(name="rezero_alpha", shape=(), initializer="zeros",
                                                trainable=True)

    def normalize(self, x: Any) -> Any:
        """The sub-layer's input: LayerNorm(x) with pre-norm, x itself with post-norm."""
        return self.norm(x) if self.norm_first else x

    def call(self, x: Any, sublayer_output: Any, training: bool | None = None) -> Any:
        y = self.output_dropout(sublayer_output, training=training)
        if self.use_rezero:
            y = y * keras.ops.cast(self.rezero_alpha, y.dtype)
        x = x + y
        return x if self.norm_first else self.norm(x)

    def compute_output_shape(self, x_shape: Any, sublayer_output_shape: Any = None) -> Any:
        return tuple(x_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "norm_first": self.norm_first, "dropout": self.dropout,
                "use_rezero": self.use_rezero, "epsilon": self.epsilon, "normalization": self.normalization}
