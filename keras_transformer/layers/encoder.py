"""One encoder layer, and the stack of N of them (with pre-norm's final LayerNorm)."""

import keras

from keras_transformer import masking
from keras_transformer.layers.attention import MultiHeadSelfAttention
from keras_transformer.layers.feed_forward import PositionWiseFeedForward
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.layers.sublayer import SublayerConnection


def _layer_options(layer):
    """The constructor arguments shared by encoder and decoder layers and stacks."""
    return {
        "d_model": layer.d_model, "num_heads": layer.num_heads, "d_ff": layer.d_ff,
        "dropout": layer.dropout, "attention_dropout": layer.attention_dropout,
        "ffn_dropout": layer.ffn_dropout, "key_dim": layer.key_dim, "value_dim": layer.value_dim,
        "norm_first": layer.norm_first, "use_rezero": layer.use_rezero,
        "scale_attention_logits": layer.scale_attention_logits,
        "layer_norm_epsilon": layer.layer_norm_epsilon, "attention_window": layer.attention_window,
    }


class _LayerOptions(keras.layers.Layer):
    """Stores and checks the options shared by encoder/decoder layers and stacks."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, attention_dropout=0.0, ffn_dropout=0.0,
                 key_dim=None, value_dim=None, norm_first=False, use_rezero=False,
                 scale_attention_logits=True, layer_norm_epsilon=1e-6, attention_window=None, **kwargs):
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

    def _check_width(self, x_shape):
        if x_shape[-1] != self.d_model:
            raise ValueError(f"{self.name}: input width {x_shape[-1]} does not match d_model={self.d_model}.")

    def _block(self, name):
        return SublayerConnection(norm_first=self.norm_first, dropout=self.dropout,
                                  use_rezero=self.use_rezero, epsilon=self.layer_norm_epsilon,
                                  dtype=self.dtype_policy, name=name)

    def _attention_args(self):
        return dict(num_heads=self.num_heads, key_dim=self.key_dim, value_dim=self.value_dim,
                    output_dim=self.d_model, dropout=self.attention_dropout,
                    scale_logits=self.scale_attention_logits, dtype=self.dtype_policy)

    def _feed_forward(self):
        return PositionWiseFeedForward(self.d_model, self.d_ff, dropout=self.ffn_dropout,
                                       dtype=self.dtype_policy, name="feed_forward")

    def get_config(self):
        return {**super().get_config(), **_layer_options(self)}


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(_LayerOptions):
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

    Call args:
        x: `(B, S, d_model)`.
        padding_mask: bool `(B, S)`, True for real tokens.
        return_attention_scores: also return the `(B, H, S, S)` weights.

    Example:

    >>> import numpy as np
    >>> tuple(EncoderLayer(d_model=8, num_heads=2, d_ff=16)(np.zeros((1, 4, 8))).shape)
    (1, 4, 8)
    """

    def __init__(self, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.self_attention = MultiHeadSelfAttention(window=self.attention_window, name="self_attention",
                                                     **self._attention_args())
        self.self_attention_block = self._block("self_attention_block")
        self.feed_forward = self._feed_forward()
        self.feed_forward_block = self._block("feed_forward_block")

    def build(self, x_shape):
        self._check_width(x_shape)
        for layer in (self.self_attention, self.self_attention_block, self.feed_forward,
                      self.feed_forward_block):
            layer.build(x_shape)

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None):
        mask = masking.key_padding_attention_mask(padding_mask) if padding_mask is not None else None
        residual = x  # (B, S, D)
        h = self.self_attention_block.normalize(x)
        h, weights = self.self_attention(h, attention_mask=mask, return_attention_scores=True,
                                         training=training)
        x = self.self_attention_block(residual, h, training=training)
        residual = x
        h = self.feed_forward(self.feed_forward_block.normalize(x), training=training)
        x = self.feed_forward_block(residual, h, training=training)
        return (x, weights) if return_attention_scores else x

    def compute_output_shape(self, x_shape):
        return tuple(x_shape)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoder(_LayerOptions):
    """N encoder layers; with pre-norm, a final LayerNorm on top.

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

    def __init__(self, num_layers, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.num_layers = int(num_layers)
        if self.num_layers <= 0:
            raise ValueError(f"TransformerEncoder: num_layers must be positive, got {num_layers}.")
        options = {k: v for k, v in _layer_options(self).items() if k not in ("d_model", "num_heads", "d_ff")}
        self.encoder_layers = [
            EncoderLayer(self.d_model, self.num_heads, self.d_ff, dtype=self.dtype_policy,
                         name=f"layer_{i}", **options)
            for i in range(self.num_layers)
        ]
        self.final_norm = (LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
                                              name="final_norm")
                           if self.norm_first else None)

    def build(self, x_shape):
        self._check_width(x_shape)
        for layer in self.encoder_layers:
            layer.build(x_shape)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None):
        all_weights = []
        for layer in self.encoder_layers:
            x, weights = layer(x, padding_mask=padding_mask, return_attention_scores=True, training=training)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, all_weights) if return_attention_scores else x

    def compute_output_shape(self, x_shape):
        return tuple(x_shape)

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers}
