"""`LayerOptions`: the options encoder and decoder layers (and their stacks) share, stored and checked once."""

from typing import Any

import keras

from keras_transformer.layers.feed_forward import PositionWiseFeedForward
from keras_transformer.layers.normalization import normalization_layer
from keras_transformer.layers.position import RelativePositionBias
from keras_transformer.layers.sublayer import SublayerConnection


def layer_options(layer: Any) -> dict[str, Any]:
    """The constructor arguments shared by encoder and decoder layers and stacks, as a dict.

    Example:

    >>> sorted(layer_options(LayerOptions(d_model=8, num_heads=2, d_ff=16)))[:3]
    ['activation', 'attention_dropout', 'attention_window']
    """
    return {
        "d_model": layer.d_model, "num_heads": layer.num_heads, "d_ff": layer.d_ff,
        "dropout": layer.dropout, "attention_dropout": layer.attention_dropout,
        "ffn_dropout": layer.ffn_dropout, "key_dim": layer.key_dim, "value_dim": layer.value_dim,
        "norm_first": layer.norm_first, "use_rezero": layer.use_rezero,
        "scale_attention_logits": layer.scale_attention_logits,
        "layer_norm_epsilon": layer.layer_norm_epsilon, "attention_window": layer.attention_window,
        "max_relative_position": layer.max_relative_position, "activation": layer.activation,
        "normalization": layer.normalization, "gated_feed_forward": layer.gated_feed_forward,
        "use_bias": layer.use_bias, "relative_attention_num_buckets": layer.relative_attention_num_buckets,
        "relative_attention_max_distance": layer.relative_attention_max_distance,
    }


class LayerOptions(keras.layers.Layer):
    """Base of the encoder/decoder layers and stacks: stores and checks the options they share.

    Args: as `EncoderLayer` (d_model, num_heads, d_ff, dropout, attention_dropout,
        ffn_dropout, key_dim, value_dim, norm_first, use_rezero,
        scale_attention_logits, layer_norm_epsilon, attention_window,
        max_relative_position, activation, normalization, gated_feed_forward, use_bias,
        relative_attention_num_buckets, relative_attention_max_distance).

    Example:

    >>> LayerOptions(d_model=8, num_heads=2, d_ff=16).key_dim
    4
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1, attention_dropout: float = 0.0,
                 ffn_dropout: float = 0.0, key_dim: int | None = None, value_dim: int | None = None,
                 norm_first: bool = False, use_rezero: bool = False, scale_attention_logits: bool = True,
                 layer_norm_epsilon: float = 1e-6, attention_window: int | None = None,
                 max_relative_position: int | None = None, activation: str = "relu", normalization: str = "layer",
                 gated_feed_forward: bool = False, use_bias: bool = True,
                 relative_attention_num_buckets: int | None = None, relative_attention_max_distance: int = 128,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        if key_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"{type(self).__name__}: d_model={self.d_model} is not divisible by "
                             f"num_heads={self.num_heads}.")
        self.key_dim = int(key_dim) if key_dim is not None else self.d_model // self.num_heads
        self.value_dim = int(value_dim) if value_dim is not None else self.key_dim
        self.dropout = float(dropout)
        self.attention_dropout = float(attention_dropout)
        self.ffn_dropout = float(ffn_dropout)
        self.norm_first = bool(norm_first)
        self.use_rezero = bool(use_rezero)
        self.scale_attention_logits = bool(scale_attention_logits)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.attention_window = int(attention_window) if attention_window is not None else None
        self.max_relative_position = int(max_relative_position) if max_relative_position is not None else None
        self.activation = activation  # the feed-forward activation's name (`TransformerConfig.activation`)
        self.normalization = normalization  # "layer" or "rms" (`normalization.normalization_layer`)
        self.gated_feed_forward = bool(gated_feed_forward)
        self.use_bias = bool(use_bias)  # biases in the attention and feed-forward projections
        # T5's bucketed relative position biases: the stacks' `RelativePositionBias` (None: none)
        self.relative_attention_num_buckets = (int(relative_attention_num_buckets)
                                               if relative_attention_num_buckets is not None else None)
        self.relative_attention_max_distance = int(relative_attention_max_distance)

    def _check_width(self, x_shape: Any) -> None:
        if x_shape[-1] != self.d_model:
            raise ValueError(f"{self.name}: input width {x_shape[-1]} does not match d_model={self.d_model}.")

    def _block(self, name: str) -> SublayerConnection:
        return SublayerConnection(norm_first=self.norm_first, dropout=self.dropout,
                                  use_rezero=self.use_rezero, epsilon=self.layer_norm_epsilon,
                                  normalization=self.normalization, dtype=self.dtype_policy, name=name)

    def _attention_args(self) -> dict[str, Any]:
        return dict(num_heads=self.num_heads, key_dim=self.key_dim, value_dim=self.value_dim,
                    output_dim=self.d_model, dropout=self.attention_dropout,
                    scale_logits=self.scale_attention_logits, use_bias=self.use_bias, dtype=self.dtype_policy)

    def _self_attention_args(self) -> dict[str, Any]:
        """`_attention_args` plus what only self-attention takes: the window and relative positions."""
        return dict(window=self.attention_window, max_relative_position=self.max_relative_position,
                    **self._attention_args())

    def _feed_forward(self) -> PositionWiseFeedForward:
        return PositionWiseFeedForward(self.d_model, self.d_ff, dropout=self.ffn_dropout, activation=self.activation,
                                       gated=self.gated_feed_forward, use_bias=self.use_bias,
                                       dtype=self.dtype_policy, name="feed_forward")

    def _final_norm(self) -> Any:
        """A pre-norm stack's last normalization (None for post-norm)."""
        return (normalization_layer(self.normalization, self.layer_norm_epsilon, dtype=self.dtype_policy,
                                    name="final_norm") if self.norm_first else None)

    def _relative_bias(self, bidirectional: bool) -> RelativePositionBias | None:
        """A stack's `RelativePositionBias`, shared by its layers' self-attention (None without buckets)."""
        if self.relative_attention_num_buckets is None:
            return None
        return RelativePositionBias(self.num_heads, self.relative_attention_num_buckets,
                                    self.relative_attention_max_distance, bidirectional=bidirectional,
                                    dtype=self.dtype_policy, name="relative_position_bias")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **layer_options(self)}
