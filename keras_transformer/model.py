"""`build_model`: the Transformer of "Attention Is All You Need" as a functional Keras model.

Besides the model, this module offers `parts`, the model's layers by role,
and `encode` and `decode`, which run those layers separately, so that decoding
can encode a source once and then run the decoder one token at a time with
key/value caches.
"""

import dataclasses
from typing import Any

import keras

from keras_transformer.config import TransformerConfig
from keras_transformer.layers import (
    LayerNormalization,
    OutputBias,
    PositionalEncoding,
    TokenEmbedding,
    TransformerDecoder,
    TransformerEncoder,
)
from keras_transformer.layers.masking import PaddingMask, padding_mask


def _stack_options(config: TransformerConfig) -> dict[str, Any]:
    return dict(d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff,
                dropout=config.dropout, attention_dropout=config.attention_dropout,
                ffn_dropout=config.ffn_dropout, key_dim=config.key_dim, value_dim=config.value_dim,
                norm_first=config.norm_first, use_rezero=config.use_rezero,
                scale_attention_logits=config.scale_attention_logits,
                layer_norm_epsilon=config.layer_norm_epsilon, attention_window=config.attention_window,
                max_relative_position=config.max_relative_position if config.position == "relative" else None,
                activation=config.activation, normalization=config.normalization,
                gated_feed_forward=config.gated_feed_forward, use_bias=config.use_bias,
                relative_attention_num_buckets=(config.relative_attention_num_buckets
                                                if config.position == "relative_bias" else None),
                relative_attention_max_distance=config.relative_attention_max_distance)


def build_model(config: TransformerConfig, name: str = "transformer", dtype: Any = None) -> keras.Model:
    """Builds the encoder-decoder Transformer described by `config`.

    Inputs are a dict `{"source": int32 (B, S), "target": int32 (B, T)}` where
    `target` is the decoder input (the reference shifted right, starting with
    `bos_id`), padded with `pad_id`. The output is float32 logits `(B, T, V)`.

    Layer names (used by `encode`/`decode` and by checkpoints):
    `shared_embedding` (tie "all" or "embeddings") or `source_embedding`/`target_embedding`,
    `source_position`, `target_position`, `source_embedding_norm` and
    `target_embedding_norm` with `config.embedding_norm`, `encoder`, `decoder`,
    `output_projection` when the softmax weights are not tied, and
    `output_bias` with `config.output_bias`.

    Args:
        config: a `TransformerConfig`.
        name: the model's name.
        dtype: the Keras dtype policy of its layers (None: the global one, `keras.config.dtype_policy()`).
            "bfloat16" stores the weights and multiplies matrices in bfloat16 (a serving precision:
            `cast_model`); under any policy the attention softmax, the layer-norm statistics and the logits
            are float32.

    Returns:
        A functional `keras.Model`.

    Example:

    >>> import numpy as np
    >>> config = TransformerConfig.preset("tiny", vocab_size=100)
    >>> model = build_model(config)
    >>> tuple(model({"source": np.ones((2, 7), "int32"), "target": np.ones((2, 5), "int32")}).shape)
    (2, 5, 100)
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"build_model expects a TransformerConfig, got {type(config).__name__}.")
    if dtype is not None:
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(dtype)
        try:
            return build_model(config, name)
        finally:
            keras.config.set_dtype_policy(previous)
    source = keras.Input(shape=(None,), dtype="int32", name="source")
    target = keras.Input(shape=(None,), dtype="int32", name="target")
    source_padding = PaddingMask(config.pad_id, name="source_padding")(source)  # (B, S)
    # A decoder that starts from the pad id (bos_id == pad_id, as Marian's) attends to its first position.
    start_is_pad = {"keep_first": True} if config.bos_id == config.pad_id else {}
    target_padding = PaddingMask(config.pad_id, name="target_padding", **start_is_pad)(target)  # (B, T)

    scale = config.scale_embeddings
    if config.tie_embeddings in ("all", "embeddings"):
        source_embedding = target_embedding = TokenEmbedding(config.vocab_size, config.d_model, scale=scale,
                                                             name="shared_embedding")
    else:
        source_embedding = TokenEmbedding(config.src_vocab_size, config.d_model, scale=scale, name="source_embedding")
        target_embedding = TokenEmbedding(config.tgt_vocab_size, config.d_model, scale=scale, name="target_embedding")
    layout: dict[str, Any] = {"layout": config.sinusoid_layout} if config.sinusoid_layout != "interleaved" else {}
    if config.position_offset:
        layout["offset"] = config.position_offset

    def embedding_norm(side: str) -> Any:  # mBART's layernorm_embedding, or nothing
        return LayerNormalization(epsilon=config.layer_norm_epsilon, name=f"{side}_embedding_norm") \
            if config.embedding_norm else (lambda x: x)

    # Encoder: embed, add positions, (normalize,) dropout, N layers.
    x = source_embedding(source)  # (B, S, D)
    x = PositionalEncoding(config.max_length, config.position, name="source_position", **layout)(x)
    x = embedding_norm("source")(x)
    x = keras.layers.Dropout(config.dropout, name="source_dropout")(x)
    memory = TransformerEncoder(config.encoder_layers, name="encoder", **_stack_options(config))(
        x, padding_mask=source_padding)  # (B, S, D)

    # Decoder: embed the shifted target, add positions, (normalize,) dropout, N layers.
    y = target_embedding(target)  # (B, T, D)
    y = PositionalEncoding(config.max_length, config.position, name="target_position", **layout)(y)
    y = embedding_norm("target")(y)
    y = keras.layers.Dropout(config.dropout, name="target_dropout")(y)
    y = TransformerDecoder(config.decoder_layers, name="decoder", scale_output=config.scale_decoder_output,
                           **_stack_options(config))(
        y, memory, target_padding_mask=target_padding, memory_padding_mask=source_padding)  # (B, T, D)

    # Pre-softmax projection, tied to the target embedding or its own matrix.
    if config.tie_embeddings in ("all", "decoder"):
        logits = target_embedding(y, reverse=True)
    else:
        logits = keras.layers.Dense(config.tgt_vocab_size, use_bias=False, name="output_projection")(y)
    if config.output_bias:
        logits = OutputBias(config.tgt_vocab_size, name="output_bias")(logits)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)  # (B, T, V)
    return keras.Model({"source": source, "target": target}, logits, name=name)


def cast_model(model: keras.Model, config: TransformerConfig, dtype: Any) -> keras.Model:
    """`model` (a `build_model(config)` model) with its layers under the dtype policy `dtype` and its weights cast
    to that policy's variable dtype (round to nearest): `model` itself where it is already so.

    What a bfloat16 export serves (`keras-transformer export --precision bfloat16`): every weight stored in
    bfloat16 and every matrix product run in it, while the softmax, the layer-norm statistics, the logits and so
    the search's scores stay float32.

    Example:

    >>> config = TransformerConfig.preset("tiny", vocab_size=50)
    >>> half = cast_model(build_model(config), config, "bfloat16")
    >>> sorted({weight.dtype for weight in half.weights}), half.dtype_policy.name
    (['bfloat16'], 'bfloat16')
    """
    policy = keras.dtype_policies.get(dtype)
    if model.dtype_policy.name == policy.name and all(
            weight.dtype == policy.variable_dtype for weight in model.weights if "float" in str(weight.dtype)):
        return model
    cast = build_model(config, model.name, dtype=policy.name)
    if len(cast.weights) != len(model.weights):
        raise ValueError(f"cast_model: {model.name} has {len(model.weights)} weights where build_model(config) "
                         f"builds {len(cast.weights)}; give the config the model was built from.")
    for target, weight in zip(cast.weights, model.weights):
        if tuple(target.shape) != tuple(weight.shape):
            raise ValueError(f"cast_model: {weight.path} is {tuple(weight.shape)} where build_model(config) builds "
                             f"{tuple(target.shape)}; give the config the model was built from.")
        target.assign(keras.ops.cast(weight, target.dtype))
    return cast


@dataclasses.dataclass(frozen=True)
class TransformerParts:
    """The layers of a `build_model` model by role; see `parts`.

    Attributes:
        source_embedding, target_embedding: `TokenEmbedding` layers (the same
            layer when `tie` is "all" or "embeddings").
        source_position, target_position: `PositionalEncoding` layers (their
            `max_length` is the longest source / target the model accepts).
        source_dropout, target_dropout: the dropout on embedding + position.
        source_embedding_norm, target_embedding_norm: the LayerNorm on embedding + position before that
            dropout (`TransformerConfig.embedding_norm`), or None.
        encoder, decoder: `TransformerEncoder`, `TransformerDecoder`.
        output_projection: the pre-softmax `Dense`, or None when the target
            embedding is reused (tied) as the projection.
        output_bias: the `OutputBias` added to the logits, or None.
        tie: `TransformerConfig.tie_embeddings` as the layers show it: "all"
            (one shared embedding, also the projection), "embeddings" (one shared
            embedding, a projection of its own), "decoder" (target embedding =
            projection) or "none".

    Example:

    >>> p = parts(build_model(TransformerConfig.preset("tiny", vocab_size=50)))
    >>> p.shared_embedding, p.tied_output, p.decoder.name
    (True, True, 'decoder')
    """

    source_embedding: keras.layers.Layer
    target_embedding: keras.layers.Layer
    source_position: keras.layers.Layer
    target_position: keras.layers.Layer
    source_dropout: keras.layers.Layer
    target_dropout: keras.layers.Layer
    encoder: keras.layers.Layer
    decoder: keras.layers.Layer
    output_projection: keras.layers.Layer | None
    tie: str
    output_bias: keras.layers.Layer | None = None
    source_embedding_norm: keras.layers.Layer | None = None
    target_embedding_norm: keras.layers.Layer | None = None

    @property
    def shared_embedding(self) -> bool:
        """True when source and target share one embedding matrix (`tie` "all" or "embeddings")."""
        return self.tie in ("all", "embeddings")

    @property
    def tied_output(self) -> bool:
        """True when the target embedding is the pre-softmax projection (`tie` "all" or "decoder")."""
        return self.output_projection is None


def parts(model: keras.Model) -> "TransformerParts":
    """The layers of a `build_model` model by role, as a frozen `TransformerParts`.

    The one place that knows the layer names `build_model` gives; decoding,
    export and tools reach the model's parts through it.

    Args:
        model: a model from `build_model` (or one loaded from its config and weights).

    Returns:
        A `TransformerParts`.

    Example:

    >>> p = parts(build_model(TransformerConfig.preset("tiny", vocab_size=50)))
    >>> p.tie, p.output_projection is None, p.target_position.max_length
    ('all', True, 128)
    """
    layers = {layer.name: layer for layer in model.layers}
    missing = [name for name in ("source_position", "target_position", "source_dropout", "target_dropout",
                                 "encoder", "decoder") if name not in layers]
    if "shared_embedding" not in layers:
        missing += [name for name in ("source_embedding", "target_embedding") if name not in layers]
    if missing:
        raise ValueError(f"{model.name} is not a build_model Transformer: it has no layer named {', '.join(missing)}.")
    if "shared_embedding" in layers:
        source_embedding = target_embedding = layers["shared_embedding"]
    else:
        source_embedding, target_embedding = layers["source_embedding"], layers["target_embedding"]
    projection = layers.get("output_projection")
    if "shared_embedding" in layers:
        tie = "all" if projection is None else "embeddings"
    else:
        tie = "none" if projection is not None else "decoder"
    return TransformerParts(source_embedding=source_embedding, target_embedding=target_embedding,
                            source_position=layers["source_position"], target_position=layers["target_position"],
                            source_dropout=layers["source_dropout"], target_dropout=layers["target_dropout"],
                            encoder=layers["encoder"], decoder=layers["decoder"], output_projection=projection,
                            tie=tie, output_bias=layers.get("output_bias"),
                            source_embedding_norm=layers.get("source_embedding_norm"),
                            target_embedding_norm=layers.get("target_embedding_norm"))


def output_kernel(model: Any) -> Any:
    """The `(D, V)` pre-softmax matrix: the output projection's kernel, or the tied embedding transposed.

    Decoding computes it once per search and passes it to `decode`, so that
    no step transposes the `(V, D)` embedding again.

    Example:

    >>> tuple(output_kernel(build_model(TransformerConfig.preset("tiny", vocab_size=50))).shape)
    (64, 50)
    """
    p = parts(model)
    if p.output_projection is not None:
        return p.output_projection.kernel
    return keras.ops.transpose(p.target_embedding.embeddings)


def encode(model: Any, source: Any, pad_id: int = 0, training: bool | None = False,
           return_attention_scores: bool = False) -> Any:
    """Runs the encoder of a `build_model` model.

    Args:
        model: a model from `build_model`.
        source: int `(B, S)` token ids.
        pad_id: the padding id.
        training: run dropout.
        return_attention_scores: also return the per-layer self-attention weights.

    Returns:
        `(memory, source_padding)`: `(B, S, D)` and bool `(B, S)`; scores last if asked.

    Example:

    >>> import numpy as np
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> memory, mask = encode(model, np.array([[5, 6, 0]]))
    >>> tuple(memory.shape), keras.ops.convert_to_numpy(mask).tolist()
    ((1, 3, 64), [[True, True, False]])
    """
    p = parts(model)
    source_padding = padding_mask(source, pad_id)
    x = p.source_embedding(source)
    x = p.source_position(x)
    if p.source_embedding_norm is not None:
        x = p.source_embedding_norm(x)
    x = p.source_dropout(x, training=training)
    outputs = p.encoder(x, padding_mask=source_padding, training=training,
                        return_attention_scores=return_attention_scores)
    if return_attention_scores:
        return outputs[0], source_padding, outputs[1]
    return outputs, source_padding


def decode(model: Any, target: Any, memory: Any = None, source_padding: Any = None, target_padding: Any = None,
           self_attention_cache: Any = None, cache_index: Any = None, cross_attention_cache: Any = None,
           beam_size: int = 1, output_kernel: Any = None, training: bool | None = False,
           return_attention_scores: bool = False) -> Any:
    """Runs the decoder and output projection of a `build_model` model.

    Without caches this is the teacher-forced pass over the whole `target`.
    With `self_attention_cache` (from `parts(model).decoder.initial_cache`)
    `target` holds the tokens at `cache_index` onwards (usually one) and the
    updated cache is returned as well. With `cross_attention_cache` (from
    `parts(model).decoder.cross_attention_cache(memory)`) and `beam_size` K,
    `target` has K rows per source row (beam search) and `source_padding`
    one row per source. `output_kernel` (from `output_kernel(model)`) is the
    pre-softmax matrix computed once, outside a decoding loop.

    Returns:
        float32 logits `(B, T, V)`; with a cache `(logits, cache)`; scores last if asked.

    Example:

    >>> import numpy as np
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> memory, mask = encode(model, np.array([[5, 6, 7]]))
    >>> tuple(decode(model, np.array([[2, 9]]), memory, mask).shape)
    (1, 2, 50)
    """
    p = parts(model)
    start = 0 if cache_index is None else cache_index
    y = p.target_embedding(target)
    y = p.target_position(y, start_index=start)
    if p.target_embedding_norm is not None:
        y = p.target_embedding_norm(y)
    y = p.target_dropout(y, training=training)
    # A decoding step (one new position per row, its keys and values cached) runs the decoder on `(B, D)` rows:
    # every dense layer is then one 2-D matmul, with no shape arithmetic around it (Keras multiplies a 3-D input
    # through `tensordot`, which computes shapes at run time when the batch size is unknown).
    step = self_attention_cache is not None and y.shape[1] == 1
    if step:
        y = keras.ops.reshape(y, (-1, y.shape[-1]))
    outputs = p.decoder(
        y, memory, target_padding_mask=target_padding, memory_padding_mask=source_padding,
        self_attention_cache=self_attention_cache, cache_index=cache_index,
        cross_attention_cache=cross_attention_cache, beam_size=beam_size,
        return_attention_scores=return_attention_scores, training=training)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    hidden = outputs[0]
    if output_kernel is not None:
        logits = keras.ops.matmul(hidden, keras.ops.cast(output_kernel, hidden.dtype))
    elif p.output_projection is not None:
        logits = p.output_projection(hidden)
    else:
        logits = p.target_embedding(hidden, reverse=True)
    if p.output_bias is not None:
        logits = p.output_bias(logits)
    logits = keras.ops.cast(logits, "float32")
    if step:
        logits = keras.ops.expand_dims(logits, 1)  # (B, 1, V)
    result = (logits,) + outputs[1:]
    return result[0] if len(result) == 1 else result
