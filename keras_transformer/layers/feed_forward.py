"""The position-wise feed-forward network FFN(x) = max(0, x W1 + b1) W2 + b2, or its gated form
FFN(x) = (act(x W1) * (x V)) W2 (Shazeer, 2020: GEGLU with GELU, T5 v1.1's "gated-gelu")."""

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
        gated: multiply the activated inner layer by a second, linear one (`inner_linear`) of the same width.
        use_bias: whether the dense layers have biases (T5's have none).

    Example:

    >>> import numpy as np
    >>> tuple(PositionWiseFeedForward(d_model=8, d_ff=32)(np.zeros((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", gated: bool = False,
                 use_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.d_model = int(d_model)
        self.d_ff = int(d_ff)
        self.dropout = float(dropout)
        self.gated = bool(gated)
        self.use_bias = bool(use_bias)
        # A `TransformerConfig.activation` name is kept as such; another activation as Keras serializes it.
        self.activation = (activation if isinstance(activation, str) and activation in ACTIVATIONS
                           else keras.activations.serialize(feed_forward_activation(activation)))
        activation = feed_forward_activation(self.activation)
        if self.d_model <= 0 or self.d_ff <= 0:
            raise ValueError(f"PositionWiseFeedForward: d_model and d_ff must be positive, "
                             f"got {self.d_model} and {self.d_ff}.")
        self.inner = keras.layers.Dense(self.d_ff, activation=activation, use_bias=self.use_bias,
                                        dtype=self.dtype_policy, name="inner")
        self.inner_linear = (keras.layers.Dense(self.d_ff, use_bias=self.use_bias, dtype=self.dtype_policy,
                                                name="inner_linear") if self.gated else None)
        self.inner_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="inner_dropout")
        self.outer = keras.layers.Dense(self.d_model, use_bias=self.use_bias, dtype=self.dtype_policy, name="outer")

    def build(self, x_shape: Any) -> None:
        self.inner.build(x_shape)
        if self.inner_linear is not None:
            self.inner_linear.build(x_shape)
        self.outer.build((*x_shape[:-1], self.d_ff))

    def call(self, x: Any, training: bool | None = None) -> Any:
        hidden = self.inner(x)  # (B, T, d_ff)
        if self.inner_linear is not None:
            hidden = hidden * self.inner_linear(x)  # the gate: act(x W1) * (x V)
        hidden = self.inner_dropout(hidden, training=training)
        return self.outer(hidden)  # (B, T, d_model)

    def compute_output_shape(self, x_shape: Any) -> Any:
        return (*x_shape[:-1], self.d_model)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "dropout": self.dropout, "activation": self.activation, "gated": self.gated, "use_bias": self.use_bias}
