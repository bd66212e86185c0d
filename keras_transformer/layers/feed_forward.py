"""The position-wise feed-forward network FFN(x) = max(0, x W1 + b1) W2 + b2."""

from typing import Any

import keras


def gelu_tanh(x: Any) -> Any:
    """GELU by its tanh approximation (Hendrycks and Gimpel, 2016), PyTorch's ``gelu(approximate="tanh")``.

    Example:

    >>> round(float(gelu_tanh(keras.ops.convert_to_tensor(1.0))), 4)
    0.8412
    """
    return keras.activations.gelu(x, approximate=True)


# `TransformerConfig.activation` names -> Keras activations ("gelu" is the exact, erf form; "swish" is SiLU).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": gelu_tanh, "swish": "silu"}


def feed_forward_activation(name: str) -> Any:
    """The Keras activation of a `TransformerConfig.activation` name, or any Keras activation given as such.

    Example:

    >>> feed_forward_activation("swish").__name__
    'silu'
    """
    return keras.activations.get(ACTIVATIONS.get(name, name))


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionWiseFeedForward(keras.layers.Layer):
    """Two dense layers applied to every position alike, with a ReLU between.

    Args:
        d_model: output width.
        d_ff: inner width (2048 in the base model).
        dropout: dropout on the inner activations (0 in the paper).
        activation: inner activation (ReLU in the paper): a `TransformerConfig.activation`
            name ("relu", "gelu", "gelu_tanh", "swish") or any Keras activation.

    Example:

    >>> import numpy as np
    >>> tuple(PositionWiseFeedForward(d_model=8, d_ff=32)(np.zeros((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.d_model = int(d_model)
        self.d_ff = int(d_ff)
        self.dropout = float(dropout)
        # A `TransformerConfig.activation` name is kept as such; another activation as Keras serializes it.
        self.activation = (activation if isinstance(activation, str) and activation in ACTIVATIONS
                           else keras.activations.serialize(feed_forward_activation(activation)))
        activation = feed_forward_activation(self.activation)
        if self.d_model <= 0 or self.d_ff <= 0:
            raise ValueError(f"PositionWiseFeedForward: d_model and d_ff must be positive, "
                             f"got {self.d_model} and {self.d_ff}.")
        self.inner = keras.layers.Dense(self.d_ff, activation=activation, dtype=self.dtype_policy,
                                        name="inner")
        self.inner_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="inner_dropout")
        self.outer = keras.layers.Dense(self.d_model, dtype=self.dtype_policy, name="outer")

    def build(self, x_shape: Any) -> None:
        self.inner.build(x_shape)
        self.outer.build((*x_shape[:-1], self.d_ff))

    def call(self, x: Any, training: bool | None = None) -> Any:
        hidden = self.inner_dropout(self.inner(x), training=training)  # (B, T, d_ff)
        return self.outer(hidden)  # (B, T, d_model)

    def compute_output_shape(self, x_shape: Any) -> Any:
        return (*x_shape[:-1], self.d_model)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "dropout": self.dropout, "activation": self.activation}
