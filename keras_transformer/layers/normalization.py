"""Layer normalization with its gradient written out (the same layer as Keras', cheaper to train), and RMS
normalization (T5's, without mean or bias); `normalization_layer` builds either by its `TransformerConfig` name."""

from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` over the last axis, with a hand-written gradient.

    Same weights (`gamma`, `beta`), same config, same outputs: y = (x - mean) / sqrt(var + eps) * gamma + beta,
    statistics in float32 under mixed precision. Autodiff of Keras' formulation emits about twenty small ops
    per normalization on the backward pass; the closed form
    dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / sqrt(var + eps), with dxhat = dy * gamma,
    needs about ten (history/experiments.md has the measured effect). Any other setting (another axis,
    `rms_scaling`, no centering or scaling) and the torch backend, which has a fused kernel, use Keras' own call.

    Example:

    >>> import numpy as np
    >>> x = np.array([[1.0, 2.0, 3.0, 6.0]], "float32")
    >>> y = LayerNormalization(epsilon=1e-6)(x)
    >>> np.allclose(y, keras.layers.LayerNormalization(epsilon=1e-6)(x), atol=1e-6)
    True
    """

    def _closed_form(self, inputs: Any) -> bool:
        axes = list(self.axis) if isinstance(self.axis, (list, tuple)) else [self.axis]
        last_axis_only = len(axes) == 1 and axes[0] in (-1, len(inputs.shape) - 1)
        return (last_axis_only and self.center and self.scale and not self.rms_scaling
                and keras.config.backend() != "torch")

    def call(self, inputs: Any) -> Any:
        if not self._closed_form(inputs):
            return super().call(inputs)
        epsilon = self.epsilon

        @ops.custom_gradient
        def layer_norm(x: Any, gamma: Any, beta: Any) -> tuple[Any, Any]:  # x: (..., D); gamma, beta: float32 (D,)
            x32 = ops.cast(x, "float32")
            centered = x32 - ops.mean(x32, axis=-1, keepdims=True)
            inverse_std = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
            normalized = centered * inverse_std  # xhat
            outputs = ops.cast(normalized * gamma + beta, self.compute_dtype)

            def grad(*args: Any, upstream: Any = None) -> tuple[Any, Any, Any]:
                dy = ops.cast(args[0] if upstream is None else upstream, "float32")
                d_normalized = dy * gamma
                dx = inverse_std * (d_normalized - ops.mean(d_normalized, axis=-1, keepdims=True)
                                    - normalized * ops.mean(d_normalized * normalized, axis=-1, keepdims=True))
                batch_axes = tuple(range(len(dy.shape) - 1))
                return (ops.cast(dx, x.dtype), ops.sum(dy * normalized, axis=batch_axes),
                        ops.sum(dy, axis=batch_axes))

            return outputs, grad

        return layer_norm(inputs, ops.cast(self.gamma, "float32"), ops.cast(self.beta, "float32"))


@keras.saving.register_keras_serializable(package="keras_transformer")
class RMSNormalization(keras.layers.Layer):
    """Root-mean-square normalization over the last axis: y = x / sqrt(mean(x^2) + eps) * gamma.

    No mean is subtracted and no bias added (Zhang and Sennrich, 2019; T5's `T5LayerNorm`); the statistics
    are float32 under mixed precision.

    Args:
        epsilon: added to the mean square.

    Example:

    >>> import numpy as np
    >>> layer = RMSNormalization(epsilon=0.0)
    >>> keras.ops.convert_to_numpy(layer(np.array([[3.0, 4.0]], "float32"))).round(4)  # rms 3.5355
    array([[0.8485, 1.1314]], dtype=float32)
    """

    def __init__(self, epsilon: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        self.gamma = None

    def build(self, x_shape: Any) -> None:
        if x_shape[-1] is None:
            raise ValueError(f"{self.name}: the last axis must be known, got shape {x_shape}.")
        self.gamma = self.add_weight(name="gamma", shape=(x_shape[-1],), initializer="ones", trainable=True)

    def call(self, x: Any) -> Any:
        x32 = ops.cast(x, "float32")
        inverse_rms = ops.rsqrt(ops.mean(ops.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return ops.cast(x32 * inverse_rms * ops.cast(self.gamma, "float32"), self.compute_dtype)

    def compute_output_shape(self, x_shape: Any) -> Any:
        return tuple(x_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "epsilon": self.epsilon}


NORMALIZATIONS = ("layer", "rms")


def normalization_layer(kind: str, epsilon: float, **kwargs: Any) -> keras.layers.Layer:
    """A `LayerNormalization` ("layer") or an `RMSNormalization` ("rms") with `epsilon`; `kwargs` go to the layer.

    Example:

    >>> type(normalization_layer("rms", 1e-6)).__name__
    'RMSNormalization'
    """
    if kind not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {kind!r}.")
    if kind == "rms":
        return RMSNormalization(epsilon=epsilon, **kwargs)
    return LayerNormalization(epsilon=epsilon, **kwargs)
