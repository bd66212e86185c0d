"""Positional encodings: the paper's sinusoids, learned positions (Table 3, row E), or relative positions.

Relative positions (Shaw, Uszkoreit and Vaswani, 2018) are not added to the
embeddings: self-attention adds learned embeddings of the clipped distance
j - i to its keys and values (`MultiHeadSelfAttention(max_relative_position=k)`),
and `relative_position_index` says which of the 2k + 1 embeddings each pair uses.

Bucketed relative position biases (T5: Raffel et al., 2020) are not added to the embeddings either: a stack's
`RelativePositionBias` gives each head a learned scalar per bucket of the distance j - i (exact for short
distances, logarithmic up to a maximum distance), added to the attention logits of every self-attention layer
of the stack (`relative_position_bucket`).
"""

from typing import Any

import keras
import numpy as np
from keras import ops

LAYOUTS = ("interleaved", "concatenated", "fairseq")


def sinusoidal_position_encoding(length: Any, d_model: int, layout: str = "interleaved", offset: int = 0) -> Any:
    """Returns the `(length, d_model)` float32 table of the paper's section 3.5, row i for position `offset + i`.

    "interleaved" (the paper): PE(pos, 2i) = sin(pos / 10000^(2i / d_model)), PE(pos, 2i + 1) = cos(...).
    "concatenated": the same sines in the first ceil(d_model / 2) columns, then the cosines (Marian and Hugging
    Face's `MarianSinusoidalPositionalEmbedding`).
    "fairseq": sines in the first h = floor(d_model / 2) columns, then cosines, of pos / 10000^(i / (h - 1)),
    i = 0..h-1, and a zero column for an odd d_model (tensor2tensor's `get_timing_signal_1d`, fairseq's
    `SinusoidalPositionalEmbedding`, Hugging Face's `M2M100SinusoidalPositionalEmbedding`).

    Example:

    >>> table = sinusoidal_position_encoding(4, 6)
    >>> table.shape, float(table[0, 1])
    ((4, 6), 1.0)
    >>> float(sinusoidal_position_encoding(4, 6, "concatenated")[0, 3])
    1.0
    >>> round(float(sinusoidal_position_encoding(1, 6, "fairseq", offset=2)[0, 2]), 6)  # sin(2 / 10000^(2/2))
    0.0002
    """
    if layout not in LAYOUTS:
        raise ValueError(f"sinusoidal_position_encoding: layout must be one of {LAYOUTS}, got {layout!r}.")
    positions = np.arange(offset, offset + length, dtype=np.float64)[:, None]  # (L, 1)
    table = np.zeros((length, d_model), dtype=np.float64)
    if layout == "fairseq":
        half = d_model // 2
        frequencies = np.exp(np.arange(half, dtype=np.float64) * -(np.log(10000.0) / max(half - 1, 1)))
        angles = positions * frequencies[None, :]  # (L, h)
        table[:, :half] = np.sin(angles)
        table[:, half:2 * half] = np.cos(angles)
        return table.astype("float32")
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # (1, ceil(D/2))
    angles = positions / np.power(10000.0, two_i / d_model)
    if layout == "concatenated":
        sines = angles.shape[1]
        table[:, :sines] = np.sin(angles)
        table[:, sines:] = np.cos(angles[:, : d_model // 2])
    else:
        table[:, 0::2] = np.sin(angles)
        table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table.astype("float32")


def relative_position_index(query_length: Any, key_length: Any, max_relative_position: Any, offset: Any = 0) -> Any:
    """The `(T, S)` int32 rows of the relative-position tables each query/key pair uses.

    Query i (at position i + offset) and key j use row clip(j - (i + offset), -k, k) + k of a
    `(2k + 1, d)` table, k = `max_relative_position` (Shaw et al., 2018, section 3.2): distances
    beyond k share the outermost rows. `offset` is the position of the first query when
    queries continue a cached prefix (decoding), as in `masking.causal_mask`.

    Example:

    >>> keras.ops.convert_to_numpy(relative_position_index(3, 4, max_relative_position=1)).tolist()
    [[1, 2, 2, 2], [0, 1, 2, 2], [0, 0, 1, 2]]
    """
    offset = offset if isinstance(offset, int) else ops.cast(offset, "int32")  # a decoding step's index tensor
    queries = ops.expand_dims(ops.arange(query_length, dtype="int32") + offset, 1)  # (T, 1)
    keys = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)  # (1, S)
    distance = ops.clip(keys - queries, -max_relative_position, max_relative_position)  # (T, S)
    return distance + max_relative_position


def relative_position_bucket(relative_position: Any, bidirectional: bool, num_buckets: int, max_distance: int) -> Any:
    """The bucket of each distance j - i (int32, any shape): T5's `_relative_position_bucket`.

    Bidirectional (the encoder), half the buckets are for keys after the query; causal (the decoder), keys after
    the query share bucket 0. Of the buckets of one direction, the first half hold the distances 0 .. n - 1
    exactly, the rest the distances up to `max_distance` on a log scale, and farther ones the last bucket.

    Example:

    >>> keras.ops.convert_to_numpy(relative_position_bucket(np.array([-3, -1, 0, 1, 3, 200]), True, 8, 16)).tolist()
    [2, 1, 0, 5, 6, 7]
    >>> keras.ops.convert_to_numpy(relative_position_bucket(np.array([-200, -5, -1, 0, 2]), False, 8, 16)).tolist()
    [7, 4, 1, 0, 0]
    """
    relative_position = ops.cast(relative_position, "int32")
    buckets = ops.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + ops.cast(relative_position > 0, "int32") * num_buckets
        relative_position = ops.abs(relative_position)
    else:
        relative_position = -ops.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    # in float32 and in this order, as T5's reference computes it, so that the bucket boundaries agree
    scaled = ops.log(ops.cast(ops.maximum(relative_position, 1), "float32") / max_exact)
    scaled = scaled / ops.cast(np.log(max_distance / max_exact), "float32") * (num_buckets - max_exact)
    large = ops.minimum(max_exact + ops.cast(scaled, "int32"), num_buckets - 1)
    return buckets + ops.where(is_small, relative_position, large)


@keras.saving.register_keras_serializable(package="keras_transformer")
class RelativePositionBias(keras.layers.Layer):
    """T5's bucketed relative position biases: a learned `(num_buckets, num_heads)` table whose row for the
    bucket of j - i (`relative_position_bucket`) is added, one scalar per head, to the logits of query i and key j.

    A stack computes the bias once and gives it to each of its self-attention layers.

    Args:
        num_heads: h.
        num_buckets: rows of the table (T5's 32).
        max_distance: distances beyond it share the last bucket (T5's 128).
        bidirectional: keys on both sides (the encoder) or only before the query (the decoder's causal buckets).

    The bias is asked for with `bias(query_length, key_length, offset)` (sizes, not tensors: not a Keras call).

    Example:

    >>> layer = RelativePositionBias(num_heads=2, num_buckets=8, max_distance=16)
    >>> layer.build()
    >>> tuple(layer.bias(3, 5).shape)
    (1, 2, 3, 5)
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_heads, self.num_buckets, self.max_distance = int(num_heads), int(num_buckets), int(max_distance)
        self.bidirectional = bool(bidirectional)
        halves = 4 if self.bidirectional else 2  # each direction's buckets: half exact, half logarithmic
        if self.num_buckets < halves or self.max_distance <= self.num_buckets // halves:
            raise ValueError(f"RelativePositionBias: num_buckets={self.num_buckets} and max_distance="
                             f"{self.max_distance} leave no logarithmic buckets; give num_buckets >= {halves} and "
                             "a max_distance beyond the exact distances.")
        self.embeddings = None

    def build(self, *args: Any) -> None:
        self.embeddings = self.add_weight(name="embeddings", shape=(self.num_buckets, self.num_heads),
                                          initializer="zeros", trainable=True)

    def bias(self, query_length: Any, key_length: Any, offset: Any = 0) -> Any:
        """The `(1, H, T, S)` bias of queries at `offset .. offset + T - 1` (a decoding step's cache index, a
        tensor or an int) against keys at `0 .. S - 1`."""
        offset = offset if isinstance(offset, int) else ops.cast(offset, "int32")
        queries = ops.expand_dims(ops.arange(query_length, dtype="int32") + offset, 1)  # (T, 1)
        keys = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)  # (1, S)
        buckets = relative_position_bucket(keys - queries, self.bidirectional, self.num_buckets, self.max_distance)
        bias = ops.take(ops.cast(self.embeddings, self.compute_dtype), buckets, axis=0)  # (T, S, H)
        return ops.expand_dims(ops.transpose(bias, (2, 0, 1)), 0)  # (1, H, T, S)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_heads": self.num_heads, "num_buckets": self.num_buckets,
                "max_distance": self.max_distance, "bidirectional": self.bidirectional}


KINDS = ("sinusoidal", "learned", "relative", "relative_bias")


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds position information to a `(B, T, D)` sequence of embeddings.

    Args:
        max_length: the longest sequence accepted.
        kind: "sinusoidal" (fixed, the paper), "learned" (a trainable table),
            "relative" or "relative_bias" (nothing is added: the self-attention layers carry the
            positions; the layer still bounds lengths by `max_length`).
        layout: the sinusoids' column order and frequencies, "interleaved" (the paper), "concatenated" or
            "fairseq" (`sinusoidal_position_encoding`).
        offset: the position number of the first token (0; fairseq's models count from pad_id + 1 = 2): the
            sinusoid added at index t is that of position `offset + t`.

    Call args:
        x: `(B, T, D)` embeddings.
        start_index: position of `x[:, 0]` (decoding one token at a time).

    Example:

    >>> import numpy as np
    >>> layer = PositionalEncoding(max_length=10)
    >>> out = layer(np.zeros((1, 3, 4), "float32"))
    >>> np.allclose(out[0], sinusoidal_position_encoding(3, 4))
    True
    """

    def __init__(self, max_length: int, kind: str = "sinusoidal", initializer: Any = "glorot_uniform",
                 layout: str = "interleaved", offset: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if kind not in KINDS:
            raise ValueError(f"PositionalEncoding: kind must be one of {KINDS}, got {kind!r}.")
        if layout not in LAYOUTS:
            raise ValueError(f"PositionalEncoding: layout must be one of {LAYOUTS}, got {layout!r}.")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"PositionalEncoding: offset must be an integer >= 0, got {offset!r}.")
        if offset and kind != "sinusoidal":
            raise ValueError(f"PositionalEncoding: offset applies to sinusoids, not to kind {kind!r}.")
        self.layout = layout
        self.offset = offset
        self.max_length = int(max_length)
        self.kind = kind
        self.initializer = keras.initializers.get(initializer)
        self.table = None

    def build(self, x_shape: Any) -> None:
        d_model = x_shape[-1]
        if d_model is None:
            raise ValueError(f"{self.name}: the embedding width must be known, got shape {x_shape}.")
        if self.kind == "learned":
            self.table = self.add_weight(name="positions", shape=(self.max_length, d_model),
                                         initializer=self.initializer, trainable=True)
        elif self.kind == "sinusoidal":
            self.table = sinusoidal_position_encoding(self.max_length, d_model, self.layout, self.offset)

    def call(self, x: Any, start_index: Any = 0) -> Any:
        length = x.shape[1]
        if isinstance(length, int) and isinstance(start_index, int) and start_index + length > self.max_length:
            raise ValueError(f"{self.name}: sequence of length {start_index + length} exceeds "
                             f"max_length={self.max_length}; truncate inputs or raise max_length.")
        if self.table is None:  # relative positions: no absolute position signal at all
            return x
        table = ops.cast(ops.convert_to_tensor(self.table), x.dtype)
        positions = ops.slice(table, [start_index, 0], [ops.shape(x)[1], ops.shape(x)[2]])
        return x + ops.expand_dims(positions, 0)

    def compute_output_shape(self, x_shape: Any) -> Any:
        return tuple(x_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "max_length": self.max_length, "kind": self.kind,
                "initializer": keras.initializers.serialize(self.initializer), "layout": self.layout,
                "offset": self.offset}
