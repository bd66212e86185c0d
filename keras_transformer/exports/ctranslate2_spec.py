"""The CTranslate2 `TransformerSpec` of a `build_model` model: its weights mapped, and what it cannot hold.

`exports.ctranslate2.export_ctranslate2` fills the spec here (`build_spec`), then saves it with the
vocabularies. Keras and numpy; ``ctranslate2`` is imported by `build_spec`, which needs its spec classes.

How the package's model maps onto CTranslate2's ``TransformerSpec``:

* Embeddings are scaled by sqrt(d_model) on both sides (``scale_embeddings``); a
  tied pre-softmax projection is the target embedding matrix itself.
* Positions: the package's sinusoids interleave sin and cos
  (PE(pos, 2i) = sin, PE(pos, 2i + 1) = cos) while CTranslate2's built-in table
  puts all sines before all cosines, so the table is written explicitly (as is a
  learned one). Its length, ``TransformerConfig.max_length``, bounds sources and
  translations exactly as in Keras. Relative positions (``position: relative``,
  Shaw et al. 2018) become CTranslate2's ``relative_position`` spec, as OpenNMT-tf's
  ``TransformerBaseRelative`` converts: no position table, and each self-attention
  gets its ``relative_position_keys`` / ``relative_position_values``, the Keras
  layer's tables of the same names and layout (``(2k + 1, d_k)``, row
  clip(j - i, -k, k) + k, shared by all heads); CTranslate2 reads k from their length.
* Attention: the Keras layers project Q, K, V with one fused matrix laid out per
  head (``[q_h | k_h | v_h]`` for each head h); CTranslate2 wants
  ``[Q; K; V]`` (all heads' queries, then keys, then values), and ``[K; V]``
  for the cross-attention's key/value projection. The columns are reordered.
  Unscaled logits (``scale_attention_logits=False``) become ``queries_scale=1``.
* ReZero's learned scalar multiplies a sub-layer's output before the residual
  add; it is folded into that sub-layer's output projection (weight and bias).
* Post-norm (the paper) or pre-norm with its final LayerNorm; a LayerNorm on the
  embeddings (``embedding_norm``) is ``layernorm_embedding``; the LayerNorm
  epsilon travels in the model config.
* Special tokens: id 0 (pad) is CTranslate2's ``<blank>``; ids 1-3 keep their
  SentencePiece pieces ``<unk>``, ``<s>`` (the decoder's start token) and
  ``</s>``, which CTranslate2 appends to every source (``add_source_eos``).

What CTranslate2 cannot hold is refused by name (`check_ctranslate2_support`):
restricted (windowed) self-attention, a value size d_v different from the key
size d_k (and, in `exports.ctranslate2`, WordPiece vocabularies).

T5's options map as CTranslate2's own T5 converter maps a ``T5ForConditionalGeneration``:
RMS normalization (``rms_norm``: gammas only), the gated feed-forward network (``ffn_glu``:
``linear_0`` under the activation, ``linear_0_noact`` linear), projections without biases,
bucketed relative position biases (``relative_attention_bias``: the stack's one table,
``(num_buckets, H)``, given to each of its self-attention layers with the maximum distance),
and the decoder's d_model ** -0.5 rescaling (``scale_outputs``).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_transformer.config import TransformerConfig
from keras_transformer.model import parts

# TransformerConfig.activation -> CTranslate2's common_spec.Activation
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_tanh": "GELUTanh", "swish": "SWISH"}


# ---------------------------------------------------------------------- support checks


def check_ctranslate2_support(config: TransformerConfig) -> None:
    """Raises `ValueError` naming the first feature of `config` that CTranslate2 cannot run.

    Supported: post- and pre-norm, LayerNorm or RMS norm, any tying mode, separate vocabularies,
    sinusoidal, learned or relative positions, T5's relative position biases, ReZero (folded into the
    weights), unscaled attention logits, a per-head size d_k other than d_model / h (with d_v = d_k),
    plain or gated feed-forward networks, with or without biases.

    Args:
        config: a `TransformerConfig`.

    Raises:
        ValueError: ``attention_window`` is set (CTranslate2 has no restricted
            self-attention), or ``value_dim`` differs from the key size
            (CTranslate2 has one head size for queries, keys and values).

    Example:

    >>> from keras_transformer import TransformerConfig
    >>> check_ctranslate2_support(TransformerConfig.preset("tiny", vocab_size=100))
    >>> check_ctranslate2_support(TransformerConfig.preset("tiny", vocab_size=100, attention_window=3))
    Traceback (most recent call last):
    ValueError: CTranslate2 export: TransformerConfig.attention_window=3 (restricted self-attention) is not ...
    """
    if config.attention_window is not None:
        raise ValueError(f"CTranslate2 export: TransformerConfig.attention_window={config.attention_window} "
                         "(restricted self-attention) is not supported by CTranslate2; export this model as a "
                         "SavedModel instead.")
    if config.head_value_dim != config.head_dim:
        raise ValueError(f"CTranslate2 export: TransformerConfig.value_dim={config.head_value_dim} differs from the "
                         f"key size d_k={config.head_dim}; CTranslate2 has one head size for queries, keys and "
                         "values. Export this model as a SavedModel instead.")


# ---------------------------------------------------------------------- weights


def _numpy(value: Any) -> np.ndarray:
    """A Keras variable (or numpy array) as a float32 numpy array."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value, dtype=np.float32)


def _linear(spec: Any, dense: Any, transpose: bool = True, scale: float = 1.0) -> None:
    """Sets a CTranslate2 `LinearSpec` from a Keras `Dense` (kernel `(in, out)` -> weight `(out, in)`)."""
    kernel = _numpy(dense.kernel)
    spec.weight = np.ascontiguousarray((kernel.T if transpose else kernel) * scale)
    if dense.bias is not None:
        spec.bias = _numpy(dense.bias) * scale


def _per_head_to_blocks(kernel: np.ndarray, bias: np.ndarray | None, num_heads: int,
                        sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """Reorders a fused projection laid out per head into one block per part.

    `kernel (D, H * sum(sizes))` has, for each head h, the columns
    `[part_0 of h | part_1 of h | ...]` (the Keras layers' layout). Returns the
    CTranslate2 weight `(H * sum(sizes), D)` with rows `[part_0 of all heads; part_1 of all heads; ...]`,
    and the bias reordered the same way (or None).
    """
    width = kernel.shape[0]
    per_head = kernel.reshape(width, num_heads, sum(sizes))  # (D, H, sum(sizes))
    parts = np.split(per_head, np.cumsum(sizes)[:-1], axis=-1)  # each (D, H, size)
    weight = np.concatenate([part.reshape(width, -1).T for part in parts], axis=0)  # (H * sum(sizes), D)
    if bias is None:
        return np.ascontiguousarray(weight), None
    bias_parts = np.split(bias.reshape(num_heads, sum(sizes)), np.cumsum(sizes)[:-1], axis=-1)
    return np.ascontiguousarray(weight), np.concatenate([part.reshape(-1) for part in bias_parts])


def _fused(spec: Any, dense: Any, num_heads: int, sizes: Sequence[int]) -> None:
    weight, bias = _per_head_to_blocks(_numpy(dense.kernel), None if dense.bias is None else _numpy(dense.bias),
                                       num_heads, sizes)
    spec.weight = weight
    if bias is not None:
        spec.bias = bias


def _layer_norm(spec: Any, norm: Any) -> None:
    spec.gamma = _numpy(norm.gamma)
    if getattr(norm, "beta", None) is not None:  # an RMS normalization has none
        spec.beta = _numpy(norm.beta)


def _rezero(block: Any) -> float:
    """The ReZero scalar of a `SublayerConnection` (1.0 without ReZero), folded into the sub-layer's output."""
    return float(_numpy(block.rezero_alpha)) if block.use_rezero else 1.0


def _self_attention(spec: Any, attention: Any, block: Any, scale_logits: bool, bias: Any = None) -> None:
    dk, dv = attention.key_dim, attention.value_dim
    _fused(spec.linear[0], attention.qkv_dense, attention.num_heads, (dk, dk, dv))  # [Q; K; V]
    if attention.max_relative_position is not None:  # (2k + 1, d) each, the same layout in both
        spec.relative_position_keys = _numpy(attention.relative_position_keys)
        spec.relative_position_values = _numpy(attention.relative_position_values)
    if bias is not None:  # T5's: the stack's one table, in each of its layers
        spec.relative_attention_bias = _numpy(bias.embeddings)  # (num_buckets, H), as CTranslate2 wants
        spec.relative_attention_max_distance = np.dtype("int32").type(bias.max_distance)
    _linear(spec.linear[1], attention.output_dense, scale=_rezero(block))
    _layer_norm(spec.layer_norm, block.norm)
    if not scale_logits:
        spec.queries_scale = np.float32(1.0)


def _cross_attention(spec: Any, attention: Any, block: Any, scale_logits: bool) -> None:
    dk, dv = attention.key_dim, attention.value_dim
    _linear(spec.linear[0], attention.query_dense)
    _fused(spec.linear[1], attention.key_value_dense, attention.num_heads, (dk, dv))  # [K; V]
    _linear(spec.linear[2], attention.output_dense, scale=_rezero(block))
    _layer_norm(spec.layer_norm, block.norm)
    if not scale_logits:
        spec.queries_scale = np.float32(1.0)


def _feed_forward(spec: Any, feed_forward: Any, block: Any) -> None:
    _linear(spec.linear_0, feed_forward.inner)
    if feed_forward.inner_linear is not None:  # gated: act(x W1) * x V
        _linear(spec.linear_0_noact, feed_forward.inner_linear)
    _linear(spec.linear_1, feed_forward.outer, scale=_rezero(block))
    _layer_norm(spec.layer_norm, block.norm)


def position_table(model: Any, side: str = "source") -> np.ndarray:
    """The `(max_length, d_model)` position table a `build_model` model adds on one side, as numpy.

    Sinusoidal tables are the package's interleaved sin/cos values
    (`keras_transformer.layers.position.sinusoidal_position_encoding`); learned
    tables are the trained weights. This is what the export writes as
    CTranslate2's ``position_encodings``. A model with relative positions has
    no table (it adds none): asking for it raises `ValueError`.

    Args:
        model: a `build_model` model.
        side: "source" or "target".

    Returns:
        float32 array `(max_length, d_model)`.

    Example:

    >>> from keras_transformer import TransformerConfig, build_model
    >>> table = position_table(build_model(TransformerConfig.preset("tiny", vocab_size=50)))
    >>> table.shape, float(table[0, 1])
    ((128, 64), 1.0)
    """
    if side not in ("source", "target"):
        raise ValueError(f"position_table: side must be 'source' or 'target', got {side!r}.")
    model_parts = parts(model)
    layer = model_parts.source_position if side == "source" else model_parts.target_position
    if layer.table is None:
        raise ValueError(f"position_table: {layer.name} adds no position table (kind {layer.kind!r}).")
    return _numpy(layer.table)


def build_spec(model: Any, config: TransformerConfig, source_tokens: Sequence[str],
               target_tokens: Sequence[str], language_last: bool = False) -> Any:
    """The CTranslate2 `TransformerSpec` holding `model`'s weights (not yet validated or saved).

    Args:
        model: a `build_model(config)` model with its trained weights.
        config: its `TransformerConfig`.
        source_tokens, target_tokens: the vocabularies (`vocabulary_tokens`), one token per id.
        language_last: mBART-large-cc25's tokenizers (`MappedTokenizer.language_last`): sources come with their
            ``</s> [src_lang]`` (not added), and the decoder starts from each target prefix's first token
            (``decoder_start_token`` None, as CTranslate2's own MBart converter has it).

    Returns:
        A ``ctranslate2.specs.TransformerSpec``.

    Raises:
        ValueError: a feature CTranslate2 cannot run (`check_ctranslate2_support`),
            or a vocabulary whose size is not the model's.

    Example:

    >>> spec = build_spec(model, config, tokens, tokens)  # doctest: +SKIP
    >>> spec.encoder.position_encodings.encodings.shape  # doctest: +SKIP
    (128, 512)
    """
    from ctranslate2.specs import common_spec, transformer_spec

    check_ctranslate2_support(config)
    model_parts = parts(model)
    source_embedding, target_embedding = model_parts.source_embedding, model_parts.target_embedding
    for side, tokens, embedding in (("source", source_tokens, source_embedding),
                                    ("target", target_tokens, target_embedding)):
        if len(tokens) != embedding.vocab_size:
            raise ValueError(f"CTranslate2 export: the {side} vocabulary has {len(tokens)} tokens but the model's "
                             f"{embedding.name} has {embedding.vocab_size} rows; use the vocabulary the model was "
                             "trained with.")
    head_dim = config.head_dim
    custom_head = head_dim * config.num_heads != config.d_model
    relative = config.position == "relative"
    buckets = config.position == "relative_bias"
    activation = getattr(common_spec.Activation, _ACTIVATIONS[config.activation])
    options = dict(pre_norm=config.norm_first, head_dim=head_dim if custom_head else None,
                   relative_position=relative, relative_attention_bias=buckets, ffn_glu=config.gated_feed_forward,
                   rms_norm=config.normalization == "rms", activation=activation,
                   layernorm_embedding=config.embedding_norm)
    encoder_spec = transformer_spec.TransformerEncoderSpec(config.encoder_layers, config.num_heads, **options)
    decoder_spec = transformer_spec.TransformerDecoderSpec(config.decoder_layers, config.num_heads, **options)
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)

    scale = config.scale_attention_logits
    encoder, decoder = model_parts.encoder, model_parts.decoder
    spec.encoder.embeddings[0].weight = _numpy(source_embedding.embeddings)
    spec.encoder.scale_embeddings = config.scale_embeddings  # x sqrt(d_model), as TokenEmbedding does
    if not relative and not buckets:  # relative positions live in the self-attention specs instead (_self_attention)
        spec.encoder.position_encodings.encodings = position_table(model, "source")
    if model_parts.source_embedding_norm is not None:
        _layer_norm(spec.encoder.layernorm_embedding, model_parts.source_embedding_norm)
    for layer_spec, layer in zip(spec.encoder.layer, encoder.encoder_layers):
        _self_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_block, scale,
                        encoder.relative_position_bias)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_block)
    if config.norm_first:
        _layer_norm(spec.encoder.layer_norm, encoder.final_norm)

    spec.decoder.embeddings.weight = _numpy(target_embedding.embeddings)
    spec.decoder.scale_embeddings = config.scale_embeddings
    if not relative and not buckets:
        spec.decoder.position_encodings.encodings = position_table(model, "target")
    if model_parts.target_embedding_norm is not None:
        _layer_norm(spec.decoder.layernorm_embedding, model_parts.target_embedding_norm)
    for layer_spec, layer in zip(spec.decoder.layer, decoder.decoder_layers):
        _self_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_block, scale,
                        decoder.relative_position_bias)
        _cross_attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_block, scale)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_block)
    if config.norm_first:
        _layer_norm(spec.decoder.layer_norm, decoder.final_norm)
    if config.tie_embeddings in ("all", "decoder"):
        spec.decoder.projection.weight = _numpy(target_embedding.embeddings)  # (V, D), as CTranslate2 wants
    else:
        assert model_parts.output_projection is not None  # untied: build_model gave the model one
        spec.decoder.projection.weight = np.ascontiguousarray(
            _numpy(model_parts.output_projection.kernel).T)
    if model_parts.output_bias is not None:
        spec.decoder.projection.bias = _numpy(model_parts.output_bias.bias)
    if config.scale_decoder_output:
        spec.decoder.scale_outputs = np.float32(config.d_model ** -0.5)

    spec.config.layer_norm_epsilon = float(config.layer_norm_epsilon)
    spec.config.unk_token = target_tokens[config.unk_id]
    spec.config.bos_token = target_tokens[config.bos_id]
    spec.config.eos_token = target_tokens[config.eos_id]
    spec.config.decoder_start_token = None if language_last else target_tokens[config.bos_id]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = not language_last  # the package's sources are tokens then eos
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    return spec


__all__ = ["build_spec", "check_ctranslate2_support", "position_table"]
