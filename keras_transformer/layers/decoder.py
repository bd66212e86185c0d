"""One decoder layer, and the stack of N of them, with key/value caches for decoding."""

from typing import Any

import keras
from keras import ops

from keras_transformer.layers import masking
from keras_transformer.layers.attention import MultiHeadAttention, MultiHeadSelfAttention
from keras_transformer.layers.options import LayerOptions, layer_options


def _check_batch_sizes(x: Any, memory: Any, memory_padding_mask: Any, cross_attention_cache: Any,
                       beam_size: int = 1) -> None:
    """Refuses a target batch `x` whose size is not `beam_size` times the source side's, where both are known.

    Attention would otherwise broadcast a batch of one against the other
    (or fail deep inside a matmul). Sizes are compared only when both are
    Python ints (eager calls, static shapes); symbolic batch sizes pass.
    """
    targets = ops.shape(x)[0]
    if isinstance(cross_attention_cache, (list, tuple)):
        cross_attention_cache = cross_attention_cache[0]  # (keys, values): the keys' batch
    for name, tensor in (("memory", memory), ("memory_padding_mask", memory_padding_mask),
                         ("cross_attention_cache", cross_attention_cache)):
        sources = ops.shape(tensor)[0] if tensor is not None else None
        if isinstance(targets, int) and isinstance(sources, int) and targets != sources * beam_size:
            per_source = "one target per source" if beam_size == 1 else f"{beam_size} targets (beams) per source"
            raise ValueError(f"The decoder got a target batch of {targets} sequence(s) but a source batch of "
                             f"{sources} ({name}); give {per_source}.")


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(LayerOptions):
    """Masked self-attention, cross-attention over the encoder output, then a FFN.

    Each of the three sub-layers sits in a residual sublayer connection.

    Args: as `EncoderLayer` (the window and relative positions, if any, apply to self-attention;
        cross-attention never has either).

    Call args:
        x: `(B, T, d_model)` embedded target prefix.
        memory: `(B, S, d_model)` encoder output (may be None when
            `cross_attention_cache` is given).
        target_padding_mask: bool `(B, T)`, True for real target tokens.
        memory_padding_mask: bool `(B, S)`, True for real source tokens.
        self_attention_cache: `(keys (B, H, T_max, d_k), values (B, H, T_max, d_v))`;
            when given, the new keys/values are written at `cache_index` and
            the updated pair is returned.
        cache_index: position of `x[:, 0]` in the target sequence.
        cross_attention_cache: `(keys (B', H, S, d_k), values (B', H, S, d_v))`,
            the encoder output projected once by `cross_attention.compute_key_value(memory)`.
        beam_size: with `cross_attention_cache`, each of its B' = B / beam_size
            rows serves `beam_size` consecutive rows of `x` (the beams of one
            sentence), and `memory_padding_mask` has B' rows too.
        return_attention_scores: also return `{"self": (B,H,T,T'), "cross": (B,H,T,S)}`.
        self_attention_bias: optional `(1, H, T, T')` logits bias of the self-attention (the stack's relative
            position biases; T' the cache length with a cache).

    Returns:
        `(B, T, d_model)`; with a self-attention cache `(x, cache)`; scores last.

    Example:

    >>> import numpy as np
    >>> layer = DecoderLayer(d_model=8, num_heads=2, d_ff=16)
    >>> tuple(layer(np.zeros((1, 3, 8)), np.zeros((1, 5, 8))).shape)
    (1, 3, 8)
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, **kwargs: Any) -> None:
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.self_attention = MultiHeadSelfAttention(causal=True, name="self_attention",
                                                     **self._self_attention_args())
        self.self_attention_block = self._block("self_attention_block")
        self.cross_attention = MultiHeadAttention(name="cross_attention", **self._attention_args())
        self.cross_attention_block = self._block("cross_attention_block")
        self.feed_forward = self._feed_forward()
        self.feed_forward_block = self._block("feed_forward_block")

    def build(self, x_shape: Any, memory_shape: Any = None) -> None:
        self._check_width(x_shape)
        memory_shape = memory_shape if memory_shape is not None else x_shape
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        for block in (self.self_attention_block, self.cross_attention_block, self.feed_forward_block):
            block.build(x_shape)
        self.feed_forward.build(x_shape)

    def call(self, x: Any, memory: Any = None, target_padding_mask: Any = None, memory_padding_mask: Any = None,
             self_attention_cache: Any = None, cache_index: Any = None, cross_attention_cache: Any = None,
             beam_size: int = 1, return_attention_scores: bool = False, training: bool | None = None,
             self_attention_bias: Any = None) -> Any:
        beam_size = int(beam_size) if cross_attention_cache is not None else 1
        _check_batch_sizes(x, memory, memory_padding_mask, cross_attention_cache, beam_size)
        self_mask = (masking.key_padding_attention_mask(target_padding_mask)
                     if target_padding_mask is not None and self_attention_cache is None else None)
        memory_mask = (masking.key_padding_attention_mask(memory_padding_mask)
                       if memory_padding_mask is not None else None)

        # Masked self-attention (causal; cached keys/values when decoding step by step).
        residual = x  # (B, T, D)
        h = self.self_attention_block.normalize(x)
        if self_attention_cache is not None:
            h, self_attention_cache, self_weights = self.self_attention(
                h, attention_mask=self_mask, cache=self_attention_cache, cache_index=cache_index,
                return_attention_scores=True, training=training, attention_bias=self_attention_bias)
        else:
            h, self_weights = self.self_attention(h, attention_mask=self_mask, return_attention_scores=True,
                                                  training=training, attention_bias=self_attention_bias)
        x = self.self_attention_block(residual, h, training=training)

        # Cross-attention: queries from the decoder, keys and values from the encoder output.
        residual = x
        h = self.cross_attention_block.normalize(x)
        h, cross_weights = self.cross_attention(h, memory, attention_mask=memory_mask,
                                                cache=cross_attention_cache, beam_size=beam_size,
                                                return_attention_scores=True, training=training)
        x = self.cross_attention_block(residual, h, training=training)

        # Position-wise feed-forward.
        residual = x
        h = self.feed_forward(self.feed_forward_block.normalize(x), training=training)
        x = self.feed_forward_block(residual, h, training=training)

        result: tuple[Any, ...] = (x,)
        if self_attention_cache is not None:
            result += (self_attention_cache,)
        if return_attention_scores:
            result += ({"self": self_weights, "cross": cross_weights},)
        return result[0] if len(result) == 1 else result

    def compute_output_shape(self, x_shape: Any, memory_shape: Any = None) -> Any:
        return tuple(x_shape)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoder(LayerOptions):
    """N decoder layers; with pre-norm, a final LayerNorm on top; with relative position buckets, one
    `RelativePositionBias` (causal) computed once per call and added in every layer's self-attention (a decoding
    step's: of the queries at `cache_index` against the whole cache, whose unwritten positions the causal mask
    hides).

    For decoding, each layer keeps its own caches, keys and values apart and
    heads-first (the layout attention reads, so a step transposes and splits
    nothing but the new token): a tuple of N self-attention pairs
    `(keys (B, H, T_max, d_k), values (B, H, T_max, d_v))` from `initial_cache`,
    and a tuple of N cross-attention pairs `(B, H, S, d_k)`, `(B, H, S, d_v)`
    from `cross_attention_cache(memory)`. (Separate tensors per layer, not one
    stacked `(B, N, ...)` tensor: a step then writes one position of each
    layer's cache instead of slicing and re-stacking all layers' caches.)

    Args:
        num_layers: N.
        scale_output: multiply the output by d_model ** -0.5 (T5's, before its tied softmax).
        Other args: as `DecoderLayer`.

    Call args: as `DecoderLayer`, with the tuples of per-layer caches (the
        updated self-attention tuple is returned); with
        `return_attention_scores` a list of per-layer score dicts comes last.

    Example:

    >>> import numpy as np
    >>> dec = TransformerDecoder(num_layers=2, d_model=8, num_heads=2, d_ff=16)
    >>> tuple(dec(np.zeros((1, 3, 8)), np.zeros((1, 5, 8))).shape)
    (1, 3, 8)
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, scale_output: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.num_layers = int(num_layers)
        self.scale_output = bool(scale_output)
        if self.num_layers <= 0:
            raise ValueError(f"TransformerDecoder: num_layers must be positive, got {num_layers}.")
        options = {k: v for k, v in layer_options(self).items() if k not in ("d_model", "num_heads", "d_ff")}
        self.decoder_layers = [
            DecoderLayer(self.d_model, self.num_heads, self.d_ff, dtype=self.dtype_policy,
                         name=f"layer_{i}", **options)
            for i in range(self.num_layers)
        ]
        self.final_norm = self._final_norm()
        self.relative_position_bias = self._relative_bias(bidirectional=False)

    def build(self, x_shape: Any, memory_shape: Any = None) -> None:
        self._check_width(x_shape)
        if self.relative_position_bias is not None:
            self.relative_position_bias.build()
        for layer in self.decoder_layers:
            layer.build(x_shape, memory_shape)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)

    def initial_cache(self, batch_size: int, max_length: int, dtype: Any = None) -> Any:
        """Zeros for the self-attention keys/values: N pairs `((B, H, T_max, d_k), (B, H, T_max, d_v))`.

        Example:

        >>> dec = TransformerDecoder(num_layers=2, d_model=8, num_heads=2, d_ff=16)
        >>> [tuple(t.shape) for t in dec.initial_cache(3, 5)[0]]
        [(3, 2, 5, 4), (3, 2, 5, 4)]
        """
        dtype = dtype or self.compute_dtype
        keys = (batch_size, self.num_heads, max_length, self.key_dim)
        values = (batch_size, self.num_heads, max_length, self.value_dim)
        return tuple((ops.zeros(keys, dtype=dtype), ops.zeros(values, dtype=dtype)) for _ in range(self.num_layers))

    def cross_attention_cache(self, memory: Any) -> Any:
        """Projects the encoder output once per layer: N pairs `((B, H, S, d_k), (B, H, S, d_v))`."""
        return tuple(layer.cross_attention.compute_key_value(memory) for layer in self.decoder_layers)

    def _per_layer(self, cache: Any, name: str) -> Any:
        """Checks that `cache` is None or holds one (keys, values) pair per layer, and returns it as a tuple."""
        if cache is None:
            return (None,) * self.num_layers
        pairs = isinstance(cache, (list, tuple)) and all(isinstance(c, (list, tuple)) and len(c) == 2 for c in cache)
        if not pairs or len(cache) != self.num_layers:
            found = (f"{len(cache)} entries" + ("" if pairs else " (not all (keys, values) pairs)")
                     if isinstance(cache, (list, tuple)) else type(cache).__name__)
            raise ValueError(f"TransformerDecoder: {name} must be a tuple of one (keys, values) pair per layer "
                             f"({self.num_layers}; see initial_cache and cross_attention_cache), got {found}.")
        return tuple(tuple(c) for c in cache)

    def call(self, x: Any, memory: Any = None, target_padding_mask: Any = None, memory_padding_mask: Any = None,
             self_attention_cache: Any = None, cache_index: Any = None, cross_attention_cache: Any = None,
             beam_size: int = 1, return_attention_scores: bool = False, training: bool | None = None) -> Any:
        self_caches = self._per_layer(self_attention_cache, "self_attention_cache")
        cross_caches = self._per_layer(cross_attention_cache, "cross_attention_cache")
        new_caches, all_weights = [], []
        bias = None
        if self.relative_position_bias is not None:
            queries = 1 if len(x.shape) == 2 else ops.shape(x)[1]  # (B, D): a decoding step's one position
            if self_attention_cache is not None:  # queries at cache_index .. against the whole cache
                bias = self.relative_position_bias.bias(queries, ops.shape(self_caches[0][0])[2],
                                                        0 if cache_index is None else cache_index)
            else:
                bias = self.relative_position_bias.bias(queries, queries)  # (1, H, T, T)
        for layer, self_cache, cross_cache in zip(self.decoder_layers, self_caches, cross_caches):
            outputs = layer(
                x, memory, target_padding_mask=target_padding_mask, memory_padding_mask=memory_padding_mask,
                self_attention_cache=self_cache, cache_index=cache_index, cross_attention_cache=cross_cache,
                beam_size=beam_size, return_attention_scores=True, training=training, self_attention_bias=bias)
            if self_attention_cache is not None:
                x, cache, weights = outputs
                new_caches.append(cache)
            else:
                x, weights = outputs
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.scale_output:
            x = x * ops.cast(self.d_model ** -0.5, x.dtype)
        result: tuple[Any, ...] = (x,)
        if self_attention_cache is not None:
            result += (tuple(new_caches),)
        if return_attention_scores:
            result += (all_weights,)
        return result[0] if len(result) == 1 else result

    def compute_output_shape(self, x_shape: Any, memory_shape: Any = None) -> Any:
        return tuple(x_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_layers": self.num_layers, "scale_output": self.scale_output}
