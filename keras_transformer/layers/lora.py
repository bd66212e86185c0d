"""LoRA adapters (Hu et al., 2021) on a model's attention projections and feed-forward layers, through Keras' own
`Dense.enable_lora`.

An adapted `Dense` computes x W + (alpha / r) (x A) B + b, never merging W + (alpha / r) A B in training: the base
kernel W is frozen, A `(d_in, r)` starts He-uniform and B `(r, d_out)` at zero, so the adapted model starts as the
base model. Only A and B train
(`enable_lora` freezes every other weight of the model). `merged_kernel` is W + (alpha / r) A B, the plain kernel
that computes what the adapted layer computes.

Keras' `Dense` saves an adapted layer's merged kernel and drops A and B; an `AdaptedDense` (what `enable_lora` turns
the chosen layers into) saves W, b, A and B as they are, so a training backup resumes with the base bit for bit and
the adapters as they were.
"""

from typing import Any

import keras
import numpy as np

from keras_transformer.layers.attention import MultiHeadAttention, MultiHeadSelfAttention
from keras_transformer.layers.feed_forward import PositionWiseFeedForward

# `training.lora.targets` names -> the layers whose dense projections take adapters.
TARGETS = ("attention", "self_attention", "cross_attention", "feed_forward")


@keras.saving.register_keras_serializable(package="keras_transformer")
class AdaptedDense(keras.layers.Dense):
    """A `keras.layers.Dense` with LoRA enabled whose weights file holds the base kernel and the adapters apart
    (kernel, bias, A, B), not Keras' merged kernel.

    Example:

    >>> import numpy as np
    >>> layer = AdaptedDense(4, lora_rank=2, name="proj")
    >>> layer.build((1, 3))
    >>> [w.path for w in layer.trainable_weights]
    ['proj/bias', 'proj/lora_kernel_a', 'proj/lora_kernel_b']
    """

    def call(self, inputs: Any, training: Any = None) -> Any:
        """x W + (alpha / r) (x A) B + b, the adapters applied to the input.

        Keras' `Dense` merges W + (alpha / r) A B into a `(d_in, d_out)` kernel at every call: a training step then
        keeps one such matrix per adapted layer for its backward pass and differentiates it at full size, the
        memory and work of a full fine-tuning's kernel gradients. Here no `(d_in, d_out)` tensor is made but W.
        """
        if not self.lora_enabled:
            return super().call(inputs, training=training)
        x = keras.ops.matmul(inputs, self._kernel)
        adapters = keras.ops.matmul(keras.ops.matmul(inputs, self.lora_kernel_a), self.lora_kernel_b)
        x = keras.ops.add(x, keras.ops.multiply(adapters, self.lora_alpha / self.lora_rank))
        if self.bias is not None:
            x = keras.ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x

    def _own_variables(self) -> list[Any]:
        bias = [self.bias] if self.bias is not None else []
        adapters = [self.lora_kernel_a, self.lora_kernel_b] if self.lora_enabled else []
        return [self._kernel, *bias, *adapters]

    def save_own_variables(self, store: Any) -> None:
        if not self.built:
            return
        for index, variable in enumerate(self._own_variables()):
            store[str(index)] = variable

    def load_own_variables(self, store: Any) -> None:
        if not self.built:
            return
        variables = self._own_variables()
        if len(store.keys()) != len(variables):
            raise ValueError(f"{self.path}: the file holds {len(store.keys())} variables, the adapted layer "
                             f"{len(variables)} (was it written without adapters?).")
        for index, variable in enumerate(variables):
            variable.assign(store[str(index)])


def target_layers(model: Any, targets: list[str] | tuple[str, ...]) -> dict[str, list[Any]]:
    """The `Dense` layers of `model` each target names, by target (an empty list: that target matches no layer).

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=20))
    >>> {name: len(layers) for name, layers in target_layers(model, ["self_attention", "feed_forward"]).items()}
    {'self_attention': 8, 'feed_forward': 8}
    """
    found: dict[str, list[Any]] = {name: [] for name in targets}
    kinds: tuple[str, ...]
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, PositionWiseFeedForward):
            kinds, denses = ("feed_forward",), [dense for dense in (layer.inner, layer.inner_linear, layer.outer)
                                                if dense is not None]  # inner_linear: a gated network's
        elif isinstance(layer, MultiHeadSelfAttention):
            kinds, denses = ("attention", "self_attention"), [layer.qkv_dense, layer.output_dense]
        elif isinstance(layer, MultiHeadAttention):
            kinds, denses = ("attention", "cross_attention"), [layer.query_dense, layer.key_value_dense,
                                                                layer.output_dense]
        else:
            continue
        for name in targets:
            if name in kinds:
                found[name].extend(denses)
    return found


def enable_lora(model: Any, rank: int, alpha: float, targets: list[str] | tuple[str, ...]) -> list[Any]:
    """Adds LoRA adapters of `rank` (scaled by `alpha / rank`) to the `Dense` layers `targets` name, and freezes
    every other weight of the built `model`: only the adapters train.

    Args:
        model: a built model from `build_model`, holding its base weights.
        rank: r, the adapters' inner width.
        alpha: the adapters' output is scaled by alpha / r.
        targets: names from `TARGETS`.

    Returns:
        The adapted layers (`AdaptedDense`), in the model's order.

    Raises:
        ValueError: a target that is unknown or matches no layer (named).

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=20))
    >>> len(enable_lora(model, 4, 8, ["attention"])), len(model.trainable_weights)
    (14, 28)
    """
    unknown = [name for name in targets if name not in TARGETS]
    if unknown:
        raise ValueError(f"unknown LoRA target {unknown[0]!r}; the targets are {', '.join(TARGETS)}.")
    adapted: list[Any] = []
    for name, layers in target_layers(model, targets).items():
        if not layers:
            raise ValueError(f"the LoRA target {name!r} matches no layer of this model.")
        adapted.extend(layer for layer in layers if all(layer is not other for other in adapted))
    for variable in model.weights:
        variable.trainable = False
    for layer in adapted:
        layer.enable_lora(int(rank), lora_alpha=float(alpha))
        layer.__class__ = AdaptedDense  # the same layer, saved with its adapters apart
    return adapted


def adapted_layers(model: Any) -> list[Any]:
    """The model's `Dense` layers with LoRA enabled.

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> from keras_transformer.model import build_model
    >>> adapted_layers(build_model(TransformerConfig.preset("tiny", vocab_size=20)))
    []
    """
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, keras.layers.Dense) and layer.lora_enabled]


def base_kernel(layer: Any) -> Any:
    """The frozen kernel variable W of an adapted `Dense` (its `kernel` property is the merged value instead).

    Example:

    >>> layer = keras.layers.Dense(4, lora_rank=2, name="proj")
    >>> layer.build((1, 3))
    >>> base_kernel(layer).path, base_kernel(layer).trainable
    ('proj/kernel', False)
    """
    return layer._kernel


def merged_kernel(kernel: Any, lora_a: Any, lora_b: Any, rank: int, alpha: float) -> np.ndarray:
    """W + (alpha / r) A B, in float64 and cast back to W's dtype: the plain kernel of an adapted layer.

    Example:

    >>> merged_kernel(np.zeros((2, 2), "float32"), np.ones((2, 1)), np.ones((1, 2)), rank=1, alpha=2.0)
    array([[2., 2.],
           [2., 2.]], dtype=float32)
    """
    kernel = np.asarray(kernel)
    delta = (float(alpha) / int(rank)) * (np.asarray(lora_a, "float64") @ np.asarray(lora_b, "float64"))
    return (kernel.astype("float64") + delta).astype(kernel.dtype)
