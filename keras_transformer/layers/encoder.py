"""One encoder layer, and the stack of N of them (with pre-norm's final LayerNorm)."""

from typing import Any

import keras
from keras import ops

from keras_transformer.layers import masking
from keras_transformer.layers.attention import MultiHeadSelfAttention
from keras_transformer.layers.options import LayerOptions, layer_options


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(LayerOptions):
    """Self-attention then a position-wise FFN, each inside a residual sublayer connection.

    Args:
        d_model, num_heads, d_ff: the layer's sizes (h heads of d_model / h).
        dropout: on each sub-layer output before the residual add.
        attention_dropout: on the attention weights.
        ffn_dropout: inside the FFN.
        key_dim, value_dim: per-head sizes (default d_model / num_heads).
        norm_first: pre-norm instead of the paper's post-norm.
        use_rezero: ReZero residual scaling.
        scale_attention_logits: divide QK^T by sqrt(d_k).
        layer_norm_epsilon: LayerNorm epsilon.
        attention_window: restrict self-attention to +-window positions.
        max_relative_position: if set (k), self-attention adds learned embeddings of the
            distance clip(j - i, -k, k) to its keys and values (Shaw et al., 2018);
            the layer's inputs then carry no position signal of their own.
        activation: the feed-forward activation ("relu", "gelu", "gelu_tanh", "swish").
        normalization: "layer" (LayerNorm) or "rms" (RMS normalization, T5's).
        gated_feed_forward: the gated feed-forward network (T5 v1.1's gated GELU).
        use_bias: biases in the attention and feed-forward projections (T5 has none).
        relative_attention_num_buckets, relative_attention_max_distance: T5's bucketed relative position
            biases (`RelativePositionBias`), which the stack computes and gives its layers.

    Call args:
        x: `(B, S, d_model)`.
        padding_mask: bool `(B, S)`, True for real tokens.
        attention_bias: optional `(1, H, S, S)` logits bias (the stack's relative position biases).
        return_attention_scores: also return the `(B, H, S, S)` weights.

    Example:

    >>> import numpy as np
    >>> tuple(EncoderLayer(d_model=8, num_heads=2, d_ff=16)(np.zeros((1, 4, 8))).shape)
    (1, 4, 8)
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, **kwargs: Any) -> None:
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.self_attention = MultiHeadSelfAttention(name="self_attention", **self._self_attention_args())
        self.self_attention_block = self._block("self_attention_block")
        self.feed_forward = self._feed_forward()
        self.feed_forward_block = self._block("feed_forward_block")

    def build(self, x_shape: Any) -> None:
        self._check_width(x_shape)
        for layer in (self.self_attention, self.self_attention_block, self.feed_forward,
                      self.feed_forward_block):
            layer.build(x_shape)

    def call(self, x: Any, padding_mask: Any = None, return_attention_scores: bool = False,
             training: bool | None = None, attention_bias: Any = None) -> Any:
        mask = masking.key_padding_attention_mask(padding_mask) if padding_mask is not None else None
        residual = x  # (B, S, D)
        h = self.self_attention_block.normalize(x)
        h, weights = self.self_attention(h, attention_mask=mask, return_attention_scores=True,
                                         training=training, attention_bias=attention_bias)
        x = self.self_attention_block(residual, h, training=training)
        residual = x
        h = self.feed_forward(self.feed_forward_block.normalize(x), training=training)
        x = self.feed_forward_block(residual, h, training=training)
        return (x, weights) if return_attention_scores else x

    def compute_output_shape(self, x_shape: Any) -> Any:
        return tuple(x_shape)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoder(LayerOptions):
    """N encoder layers; with pre-norm, a final LayerNorm on top; with relative position buckets, one
    `RelativePositionBias` (bidirectional) computed once and added in every layer's self-attention.

    Args:
        num_layers: N.
        Other args: as `EncoderLayer`.

    Call args:
        x: `(B, S, d_model)` embedded source (positions added).
        padding_mask: bool `(B, S)`.
        return_attention_scores: also return a list with each layer's weights.

    Example:

    >>> import numpy as np
    >>> enc = TransformerEncoder(num_layers=2, d_model=8, num_heads=2, d_ff=16)
    >>> tuple(enc(np.zeros((1, 4, 8))).shape)
    (1, 4, 8)
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, **kwargs: Any) -> None:
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.num_layers = int(num_layers)
        if self.num_layers <= 0:
            raise ValueError(f"TransformerEncoder: num_layers must be positive, got {num_layers}.")
        options = {k: v for k, v in layer_options(self).items() if k not in ("d_model", "num_heads", "d_ff")}
        self.encoder_layers = [
            EncoderLayer(self.d_model, self.num_heads, self.d_ff, dtype=self.dtype_policy,
                         name=f"layer_{i}", **options)
            for i in range(self.num_layers)
        ]
        self.final_norm = self._final_norm()
        self.relative_position_bias = self._relative_bias(bidirectional=True)

    def build(self, x_shape: Any) -> None:
        self._check_width(x_shape)
        if self.relative_position_bias is not None:
            self.relative_position_bias.build()
        for layer in self.encoder_layers:
            layer.build(x_shape)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)

    def call(self, x: Any, padding_mask: Any = None, return_attention_scores: bool = False,
             training: bool | None = None) -> Any:
        all_weights = []
        bias = None
        if self.relative_position_bias is not None:
            length = ops.shape(x)[1]
            bias = self.relative_position_bias.bias(length, length)  # (1, H, S, S)
        for layer in self.encoder_layers:
            x, weights = layer(x, padding_mask=padding_mask, return_attention_scores=True, training=training,
                               attention_bias=bias)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, all_weights) if return_attention_scores else x

    def compute_output_shape(self, x_shape: Any) -> Any:
        return tuple(x_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_layers": self.num_layers}
