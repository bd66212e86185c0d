"""Scaled dot-product attention and the two multi-head layers built on it.

`MultiHeadAttention` takes queries from one sequence and keys/values from
another (the decoder's cross-attention). `MultiHeadSelfAttention` projects
queries, keys and values with one fused matrix and can be causal (the decoder's
masked self-attention) or restricted to a window of neighbours (the paper's
Table 1, "self-attention (restricted)"), and can add relative position
representations to its keys and values (Shaw, Uszkoreit and Vaswani, 2018).

Both layers can run incrementally. Their caches hold keys and values apart, each
heads-first, `(B, H, S, d_k)` and `(B, H, S, d_v)`: the layout attention reads,
so a decoding step attends over the cache with two batched matmuls and no
transpose or split of the cache (the fused kernels are split per head once per
step, on the new token only). Writing a step's keys/values touches one position.
"""

from typing import Any

import keras
from keras import ops

from keras_transformer.layers import masking
from keras_transformer.layers.position import relative_position_index


def masked_softmax(scores: Any, attention_mask: Any, dtype: Any) -> Any:
    """Attention weights from logits `(B, H, T, S)`: a softmax over S in float32 (so that masking and normalisation
    are exact under mixed precision), masked keys at exactly zero weight (even in all-masked rows), cast to `dtype`.

    Example:

    >>> import numpy as np
    >>> keras.ops.convert_to_numpy(masked_softmax(np.zeros((1, 1, 1, 3)), np.array([[[1, 1, 0]]]), "float32"))
    array([[[[0.5, 0.5, 0. ]]]], dtype=float32)
    """
    scores = ops.cast(scores, "float32")
    if attention_mask is not None:
        mask = ops.expand_dims(ops.cast(attention_mask, "bool"), 1)  # (B, 1, T, S)
        scores = ops.where(mask, scores, ops.cast(-1e9, "float32"))
    weights = ops.softmax(scores, axis=-1)
    if attention_mask is not None:
        weights = ops.where(mask, weights, ops.zeros_like(weights))
    return ops.cast(weights, dtype)


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attention_mask: Any = None, scale: bool = True,
                                 dropout_layer: Any = None, training: bool | None = None, relative_keys: Any = None,
                                 relative_values: Any = None, bias: Any = None) -> Any:
    """softmax(Q K^T / sqrt(d_k)) V, per head; with relative position representations if given.

    With `relative_keys` a^K and `relative_values` a^V (Shaw et al., 2018, eqs. 3-4)
    the logits are e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_k) and the outputs
    z_i = sum_j alpha_ij (v_j + a^V_ij).

    Args:
        query: `(B, T, H, d_k)`.
        key: `(B, S, H, d_k)`.
        value: `(B, S, H, d_v)`.
        attention_mask: bool, broadcastable to `(B, T, S)`; True means "may attend".
            Masked keys get exactly zero weight.
        scale: divide the logits by sqrt(d_k) (True, the paper), or not.
        dropout_layer: optional `keras.layers.Dropout` applied to the weights.
        training: passed to the dropout layer.
        relative_keys: optional `(T, S, d_k)` a^K_ij, shared by all heads and sentences.
        relative_values: optional `(T, S, d_v)` a^V_ij.
        bias: optional, broadcastable to `(B, H, T, S)`: added to the logits (T5's relative position biases).

    Returns:
        `(outputs, weights)`: `(B, T, H, d_v)` and `(B, H, T, S)`.

    Example:

    >>> import numpy as np
    >>> q = k = v = np.ones((1, 2, 1, 4), "float32")
    >>> out, w = scaled_dot_product_attention(q, k, v)
    >>> keras.ops.convert_to_numpy(w)[0, 0].tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    if scale:
        query = query * ops.cast(1.0 / (ops.shape(query)[-1] ** 0.5), query.dtype)
    scores = ops.einsum("bthd,bshd->bhts", query, key)  # (B, H, T, S)
    if relative_keys is not None:  # + q_i a^K_ij
        scores = scores + ops.einsum("bthd,tsd->bhts", query, relative_keys)
    if bias is not None:
        scores = scores + ops.cast(bias, scores.dtype)
    weights = masked_softmax(scores, attention_mask, value.dtype)
    dropped = dropout_layer(weights, training=training) if dropout_layer is not None else weights
    outputs = ops.einsum("bhts,bshd->bthd", dropped, value)  # (B, T, H, d_v)
    if relative_values is not None:  # + sum_j alpha_ij a^V_ij
        outputs = outputs + ops.einsum("bhts,tsd->bthd", dropped, relative_values)
    return outputs, weights


def heads_first_attention(query: Any, key: Any, value: Any, attention_mask: Any = None, scale: bool = True,
                          relative_keys: Any = None, relative_values: Any = None, bias: Any = None,
                          heads_last: bool = False) -> Any:
    """softmax(Q K^T / sqrt(d_k)) V on heads-first tensors, the layout of the decoding caches.

    The same computation as `scaled_dot_product_attention` (no dropout: it
    serves inference), without any transpose of `key` or `value`.

    Args:
        query: `(B, H, T, d_k)`.
        key: `(B, H, S, d_k)`.
        value: `(B, H, S, d_v)`.
        attention_mask: bool, broadcastable to `(B, T, S)`; True means "may attend".
        scale: divide the logits by sqrt(d_k).
        relative_keys, relative_values: optional `(T, S, d_k)` and `(T, S, d_v)`
            relative position representations, as in `scaled_dot_product_attention`.
        bias: optional logits bias broadcastable to `(B, H, T, S)`, as in `scaled_dot_product_attention`.
        heads_last: return the outputs `(B, T, H, d_v)` (the layout heads are merged from), not `(B, H, T, d_v)`.

    Returns:
        `(outputs, weights)`: `(B, H, T, d_v)` (`(B, T, H, d_v)` with `heads_last`) and `(B, H, T, S)`.

    Example:

    >>> import numpy as np
    >>> q = k = v = np.ones((1, 1, 2, 4), "float32")
    >>> out, w = heads_first_attention(q, k, v, np.array([[[True, False]]]))
    >>> keras.ops.convert_to_numpy(w)[0, 0].tolist()
    [[1.0, 0.0], [1.0, 0.0]]
    """
    if scale:
        query = query * ops.cast(1.0 / (ops.shape(query)[-1] ** 0.5), query.dtype)
    scores = ops.einsum("bhtd,bhsd->bhts", query, key)  # (B, H, T, S)
    if relative_keys is not None:
        scores = scores + ops.einsum("bhtd,tsd->bhts", query, relative_keys)
    if bias is not None:
        scores = scores + ops.cast(bias, scores.dtype)
    weights = masked_softmax(scores, attention_mask, value.dtype)
    outputs = ops.matmul(weights, value)  # (B, H, T, d_v)
    if heads_last:
        outputs = ops.transpose(outputs, (0, 2, 1, 3))  # (B, T, H, d_v)
    if relative_values is not None:
        # Added in the layout returned (the einsum writes it directly): a sum followed by a transpose is what
        # TensorFlow's layout optimization moves across, and inside a while loop (LiteRT's converted search) that
        # move breaks the graph (a permutation constant taken into the loop's body).
        outputs = outputs + ops.einsum("bhts,tsd->bthd" if heads_last else "bhts,tsd->bhtd", weights,
                                       relative_values)
    return outputs, weights


def write_positions(cache: Any, start: Any, new: Any) -> Any:
    """`cache (B, H, S_max, d)` with `new (B, H, T, d)` written at positions `start .. start + T - 1`.

    One new position (a decoding step) is written with a scatter of one `d`-vector per row and
    head. Measured alternatives: `ops.slice_update` runs in TensorFlow as an XLA op outside XLA,
    whose dispatch cost more than the copy itself (a single-sentence beam search spent a third of
    its time there); a select over the whole cache costs 3-4x the scatter (a broadcast select reads
    and writes every position). Several positions (a prefix fed at once) use `slice_update`.
    """
    new = ops.cast(new, cache.dtype)
    if new.shape[2] != 1:
        return ops.slice_update(cache, [0, 0, start, 0], new)
    heads, size = cache.shape[1], cache.shape[3]
    length = ops.shape(cache)[2]
    flat = ops.reshape(cache, (-1, length, size))  # (B*H, S_max, d)
    rows = ops.shape(flat)[0]
    index = ops.stack([ops.arange(rows, dtype="int32"), ops.full((rows,), start, dtype="int32")], axis=1)
    flat = ops.scatter_update(flat, index, ops.reshape(new, (-1, size)))  # row i, position start
    return ops.reshape(flat, (-1, heads, length, size))


class _AttentionBase(keras.layers.Layer):
    """Shared arguments, output projection and config of the two attention layers."""

    def __init__(self, num_heads: int, key_dim: int, value_dim: int | None = None, output_dim: int | None = None,
                 dropout: float = 0.0, use_bias: bool = True, scale_logits: bool = True,
                 kernel_initializer: Any = "glorot_uniform", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.key_dim = int(key_dim)
        self.value_dim = int(value_dim) if value_dim is not None else self.key_dim
        self.output_dim = int(output_dim) if output_dim is not None else None
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.scale_logits = bool(scale_logits)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        for name in ("num_heads", "key_dim", "value_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{type(self).__name__}: {name} must be positive, got {getattr(self, name)}.")
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy,
                                                      name="attention_dropout")
        self.output_dense: Any = None  # created in build(), once the model width is known

    def _initializer(self) -> Any:
        """A fresh copy of `kernel_initializer` (a shared instance would draw the same values for every weight)."""
        return keras.initializers.get(keras.initializers.serialize(self.kernel_initializer))

    def _dense(self, units: int, name: str) -> Any:
        return keras.layers.Dense(units, use_bias=self.use_bias, kernel_initializer=self._initializer(),
                                  dtype=self.dtype_policy, name=name)

    def _build_output(self, query_shape: Any) -> None:
        out_dim = self.output_dim or query_shape[-1]
        self.output_dense = self._dense(out_dim, "output")
        self.output_dense.build((*query_shape[:-1], self.num_heads * self.value_dim))

    def _split_heads(self, x: Any, size: int) -> Any:
        """`(B, T, H*size)` -> `(B, T, H, size)`; a flat `(B, H*size)` (one position per row) -> `(B, 1, H, size)`."""
        if len(x.shape) == 2:  # a decoding step: a constant target shape, no shape arithmetic in the graph
            return ops.reshape(x, (-1, 1, self.num_heads, size))
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, size))

    def _merge_heads(self, x: Any, flat: bool = False) -> Any:
        """`(B, T, H, d_v)` -> `(B, T, H*d_v)`, or `(B, H*d_v)` for flat inputs (T = 1)."""
        if flat:
            return ops.reshape(x, (-1, self.num_heads * self.value_dim))
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads * self.value_dim))

    def _attend(self, query: Any, key_value: Any, attention_mask: Any, training: bool | None, flat: bool = False,
                relative: Any = (None, None), bias: Any = None) -> Any:
        """The one hook that runs attention: `query (B,T,H,dk)`, `key_value (B,S,H,dk+dv)`.

        `relative`: the `(T, S, d_k)` and `(T, S, d_v)` relative position representations, or Nones;
        `bias`: a logits bias broadcastable to `(B, H, T, S)`, or None.
        """
        # ops.split, not slicing: the gradient of a split is one concat, while each slice's
        # gradient writes a zero-filled copy of the whole tensor (measured: 1.17x a training step).
        key, value = ops.split(key_value, [self.key_dim], axis=-1)  # (B, S, H, dk), (B, S, H, dv)
        outputs, weights = scaled_dot_product_attention(
            query, key, value, attention_mask, scale=self.scale_logits,
            dropout_layer=self.attention_dropout, training=training, relative_keys=relative[0],
            relative_values=relative[1], bias=bias)
        return self.output_dense(self._merge_heads(outputs, flat)), weights

    def _attend_cached(self, query: Any, key: Any, value: Any, attention_mask: Any, beam_size: int = 1,
                       flat: bool = False, relative: Any = (None, None), bias: Any = None) -> Any:
        """Attention over a heads-first cache: `query (B*G, T, H, dk)`, `key/value (B, H, S, d)`.

        With `beam_size` G > 1 each cache row serves G consecutive query rows
        (the beams of one sentence, for cross-attention): their queries are
        attended together, so the cache is neither repeated nor gathered.
        `attention_mask` broadcasts to `(B, G*T, S)` (key padding, `(B, 1, S)`)
        when G > 1, to `(B, T, S)` otherwise. With `flat` (the layer's input
        was `(B*G, D)`, one position per row) the output is `(B*G, D_out)`.
        `relative` and `bias` as in `_attend` (self-attention only, G = 1).
        """
        batch, length = ops.shape(query)[0], ops.shape(query)[1]
        if beam_size > 1:
            query = ops.reshape(query, (-1, beam_size * length, self.num_heads, self.key_dim))
        query = ops.transpose(query, (0, 2, 1, 3))  # (B, H, G*T, dk)
        outputs, weights = heads_first_attention(query, key, value, attention_mask, scale=self.scale_logits,
                                                 relative_keys=relative[0], relative_values=relative[1], bias=bias,
                                                 heads_last=True)  # (B, G*T, H, dv)
        merged = (-1, self.num_heads * self.value_dim) if flat else (batch, length, self.num_heads * self.value_dim)
        outputs = ops.reshape(outputs, merged)  # (B*G, H*dv) or (B*G, T, H*dv)
        if beam_size > 1:  # (B, H, G*T, S) -> (B*G, H, T, S)
            sources = ops.shape(weights)[-1]
            weights = ops.reshape(weights, (batch // beam_size, self.num_heads, beam_size, length, sources))
            weights = ops.reshape(ops.transpose(weights, (0, 2, 1, 3, 4)), (batch, self.num_heads, length, sources))
        return self.output_dense(outputs), weights

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "output_dim": self.output_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "scale_logits": self.scale_logits,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(_AttentionBase):
    """Multi-head attention with queries from one sequence, keys and values from another.

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V); output = Concat(head_1..h) W^O.
    Keys and values come from one fused projection of `value`.

    Args:
        num_heads: h.
        key_dim: d_k, the per-head size of queries and keys.
        value_dim: d_v, the per-head size of values (default: key_dim).
        output_dim: width of the output (default: the query width).
        dropout: dropout rate on the attention weights.
        use_bias: whether projections have biases.
        scale_logits: divide QK^T by sqrt(d_k) (the paper) or not.

    Call args:
        query: `(B, T, D)`.
        value: `(B, S, D_kv)`; ignored when `cache` is given.
        attention_mask: bool, broadcastable to `(B, T, S)`.
        cache: optional precomputed `(keys (B, H, S, d_k), values (B, H, S, d_v))`
            from `compute_key_value(value)`; decoding computes it once per sentence.
        beam_size: with a cache, each cache row serves `beam_size` consecutive
            query rows (beam search); the mask is then `(B, 1, S)` key padding.
        return_attention_scores: also return the `(B, H, T, S)` weights.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadAttention(num_heads=2, key_dim=4)
    >>> tuple(layer(np.zeros((1, 3, 8)), np.zeros((1, 5, 8))).shape)
    (1, 3, 8)
    """

    def __init__(self, num_heads: int, key_dim: int, **kwargs: Any) -> None:
        super().__init__(num_heads, key_dim, **kwargs)
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self.key_value_dense = self._dense(self.num_heads * (self.key_dim + self.value_dim), "key_value")

    def build(self, query_shape: Any, value_shape: Any = None) -> None:
        value_shape = query_shape if value_shape is None else value_shape
        if value_shape[-1] is None or query_shape[-1] is None:
            raise ValueError(f"{self.name}: the last axis of query and value must be known, "
                             f"got query {query_shape} and value {value_shape}.")
        self.query_dense.build(query_shape)
        self.key_value_dense.build(value_shape)
        self._build_output(query_shape)

    def compute_key_value(self, value: Any) -> Any:
        """Projects `value (B, S, D)` once into the heads-first cache `(keys (B, H, S, d_k), values (B, H, S, d_v))`.

        Example:

        >>> import numpy as np
        >>> layer = MultiHeadAttention(num_heads=2, key_dim=4)
        >>> _ = layer(np.zeros((1, 3, 8)), np.zeros((1, 5, 8)))
        >>> [tuple(t.shape) for t in layer.compute_key_value(np.zeros((1, 5, 8)))]
        [(1, 2, 5, 4), (1, 2, 5, 4)]
        """
        key_value = self._split_heads(self.key_value_dense(value), self.key_dim + self.value_dim)
        key, value = ops.split(key_value, [self.key_dim], axis=-1)  # (B, S, H, dk), (B, S, H, dv)
        return ops.transpose(key, (0, 2, 1, 3)), ops.transpose(value, (0, 2, 1, 3))

    def call(self, query: Any, value: Any = None, attention_mask: Any = None, cache: Any = None, beam_size: int = 1,
             return_attention_scores: bool = False, training: bool | None = None) -> Any:
        flat = len(query.shape) == 2  # (B, D): one position per row, a decoding step
        q = self._split_heads(self.query_dense(query), self.key_dim)  # (B, T, H, dk)
        if cache is not None:
            key, value = cache  # (B, H, S, dk), (B, H, S, dv)
            outputs, weights = self._attend_cached(q, key, value, attention_mask, beam_size=int(beam_size),
                                                   flat=flat)
        else:
            key_value = self._split_heads(self.key_value_dense(value), self.key_dim + self.value_dim)
            outputs, weights = self._attend(q, key_value, attention_mask, training, flat)
        return (outputs, weights) if return_attention_scores else outputs

    def compute_output_shape(self, query_shape: Any, value_shape: Any = None) -> Any:
        return (*query_shape[:-1], self.output_dim or query_shape[-1])


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadSelfAttention(_AttentionBase):
    """Multi-head self-attention with one fused QKV projection.

    Args:
        num_heads, key_dim, value_dim, output_dim, dropout, use_bias, scale_logits:
            as in `MultiHeadAttention`.
        causal: position i attends only to positions <= i (decoder self-attention).
        window: if set, position i attends only to positions j with |i - j| <= window
            (restricted self-attention, the paper's Table 1).
        max_relative_position: if set (k), relative position representations
            (Shaw et al., 2018): two learned tables `relative_position_keys`
            `(2k + 1, d_k)` and `relative_position_values` `(2k + 1, d_v)`, shared
            by all heads, whose row clip(j - i, -k, k) + k is added to key j and
            value j when query i attends to them (`relative_position_index`).

    Call args:
        x: `(B, T, D)`.
        attention_mask: bool, broadcastable to `(B, T, S)` (S = T, or the cache length).
        cache: optional `(keys (B, H, S_max, d_k), values (B, H, S_max, d_v))`
            (heads-first, zeros where nothing was written yet); the keys/values
            of `x` are written at `cache_index` and the updated pair is returned.
        cache_index: position of `x[:, 0]` in the sequence (a scalar tensor).
        attention_bias: optional, broadcastable to `(B, H, T, S)`, added to the logits (the stack's
            `RelativePositionBias`; with a cache, of the queries at `cache_index` against the whole cache).
        return_attention_scores: also return the `(B, H, T, S)` weights.

    Returns:
        The `(B, T, D)` output; with a cache, `(output, cache)`; with scores, the
        weights come last.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadSelfAttention(num_heads=2, key_dim=4, causal=True)
    >>> tuple(layer(np.zeros((2, 3, 8))).shape)
    (2, 3, 8)
    """

    def __init__(self, num_heads: int, key_dim: int, causal: bool = False, window: int | None = None,
                 max_relative_position: int | None = None, **kwargs: Any) -> None:
        super().__init__(num_heads, key_dim, **kwargs)
        self.causal = bool(causal)
        self.window = int(window) if window is not None else None
        if self.window is not None and self.window < 0:
            raise ValueError(f"{type(self).__name__}: window must be >= 0, got {self.window}.")
        self.max_relative_position = int(max_relative_position) if max_relative_position is not None else None
        if self.max_relative_position is not None and self.max_relative_position <= 0:
            raise ValueError(f"{type(self).__name__}: max_relative_position must be positive, "
                             f"got {self.max_relative_position}.")
        self.qkv_dense = self._dense(self.num_heads * (2 * self.key_dim + self.value_dim), "qkv")
        self.relative_position_keys = self.relative_position_values = None  # created in build()

    def build(self, x_shape: Any) -> None:
        if x_shape[-1] is None:
            raise ValueError(f"{self.name}: the last axis of the input must be known, got {x_shape}.")
        self.qkv_dense.build(x_shape)
        self._build_output(x_shape)
        if self.max_relative_position is not None:
            # The names and layouts of OpenNMT-tf and CTranslate2: one row per clipped distance -k..k.
            rows = 2 * self.max_relative_position + 1
            self.relative_position_keys = self.add_weight(
                name="relative_position_keys", shape=(rows, self.key_dim), initializer=self._initializer())
            self.relative_position_values = self.add_weight(
                name="relative_position_values", shape=(rows, self.value_dim), initializer=self._initializer())

    def _relative(self, query_length: Any, key_length: Any, offset: Any, dtype: Any) -> Any:
        """`(a^K (T, S, d_k), a^V (T, S, d_v))` for queries at `offset ..` and keys at `0 ..`, or Nones."""
        if self.max_relative_position is None:
            return None, None
        index = relative_position_index(query_length, key_length, self.max_relative_position, offset)  # (T, S)
        return (ops.take(ops.cast(self.relative_position_keys, dtype), index, axis=0),
                ops.take(ops.cast(self.relative_position_values, dtype), index, axis=0))

    def call(self, x: Any, attention_mask: Any = None, cache: Any = None, cache_index: Any = None,
             return_attention_scores: bool = False, training: bool | None = None, attention_bias: Any = None) -> Any:
        flat = len(x.shape) == 2  # (B, D): one position per row, a decoding step
        qkv = self._split_heads(self.qkv_dense(x), 2 * self.key_dim + self.value_dim)  # (B, T, H, 2dk+dv)
        if cache is not None:
            return self._call_cached(qkv, attention_mask, cache, cache_index, return_attention_scores, flat,
                                     attention_bias)
        query, key_value = ops.split(qkv, [self.key_dim], axis=-1)  # (B, T, H, dk), (B, T, H, dk+dv)
        query_length, key_length = ops.shape(query)[1], ops.shape(key_value)[1]
        mask = self._mask(attention_mask, query_length, key_length, 0)
        relative = self._relative(query_length, key_length, 0, query.dtype)
        outputs, weights = self._attend(query, key_value, mask, training, flat, relative, attention_bias)
        return (outputs, weights) if return_attention_scores else outputs

    def _mask(self, attention_mask: Any, query_length: Any, key_length: Any, offset: Any) -> Any:
        """The caller's mask merged with the causal and window masks (None when there is none)."""
        structural = None
        if self.causal:
            structural = masking.causal_mask(query_length, key_length, offset)
        if self.window is not None:
            structural = masking.merge_masks(
                structural, masking.window_mask(query_length, key_length, self.window, offset))
        if structural is not None:
            structural = ops.expand_dims(structural, 0)  # (1, T, S)
        return masking.merge_masks(attention_mask, structural)

    def _call_cached(self, qkv: Any, attention_mask: Any, cache: Any, cache_index: Any, return_attention_scores: bool,
                     flat: bool = False, attention_bias: Any = None) -> Any:
        """One decoding step: writes the new keys/values at `cache_index`, attends over the cache."""
        key_cache, value_cache = cache  # (B, H, S_max, dk), (B, H, S_max, dv)
        offset = 0 if cache_index is None else cache_index
        query, key, value = ops.split(qkv, [self.key_dim, 2 * self.key_dim], axis=-1)  # (B, T, H, d) each
        key_cache = write_positions(key_cache, offset, ops.transpose(key, (0, 2, 1, 3)))
        value_cache = write_positions(value_cache, offset, ops.transpose(value, (0, 2, 1, 3)))
        mask = self._mask(attention_mask, ops.shape(query)[1], ops.shape(key_cache)[2], offset)
        # The query at step t attends keys 0..t: its distance to key j is j - t, t = offset for one step.
        relative = self._relative(ops.shape(query)[1], ops.shape(key_cache)[2], offset, query.dtype)
        outputs, weights = self._attend_cached(query, key_cache, value_cache, mask, flat=flat, relative=relative,
                                               bias=attention_bias)
        if return_attention_scores:
            return outputs, (key_cache, value_cache), weights
        return outputs, (key_cache, value_cache)

    def compute_output_shape(self, x_shape: Any) -> Any:
        return (*x_shape[:-1], self.output_dim or x_shape[-1])

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "causal": self.causal, "window": self.window,
                "max_relative_position": self.max_relative_position}
