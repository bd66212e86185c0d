"""Layers against numpy references, and their config / JSON / .keras round trips."""

import json
import math

import keras
import numpy as np
import pytest

import keras_transformer as kt

RNG = np.random.default_rng(0)


def _call(layer, inputs, kwargs):
    return keras.ops.convert_to_numpy(layer(*inputs, **kwargs))


def check_round_trips(layer, inputs, tmp_path, call_kwargs=None):
    """Config, JSON and `.keras` round trips all rebuild a layer with identical outputs."""
    call_kwargs = call_kwargs or {}
    expected = _call(layer, inputs, call_kwargs)

    clone = type(layer).from_config(layer.get_config())
    _call(clone, inputs, call_kwargs)  # build
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(_call(clone, inputs, call_kwargs), expected, atol=1e-6)
    assert clone.get_config() == layer.get_config()

    payload = json.dumps(keras.saving.serialize_keras_object(layer))
    from_json = keras.saving.deserialize_keras_object(json.loads(payload))
    assert type(from_json) is type(layer) and from_json.get_config() == layer.get_config()

    symbolic = [keras.Input(shape=x.shape[1:], dtype=str(x.dtype)) for x in inputs]
    model = keras.Model(symbolic, layer(*symbolic, **call_kwargs))
    path = str(tmp_path / f"{layer.name}.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(restored(inputs)), expected, atol=1e-6)
    return expected


def numpy_attention(q, k, v, mask, scale=True):
    """float64 reference of softmax(QK^T/sqrt(dk))V for (B,T,H,D) inputs and a (B,T,S) mask."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = np.einsum("bthd,bshd->bhts", q, k)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask[:, None], scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", weights, v), weights


# ------------------------------------------------------------------- position
@pytest.mark.parametrize("d_model", [6, 16, 7])
def test_sinusoidal_encoding_matches_formula(d_model):
    table = kt.sinusoidal_position_encoding(50, d_model)
    expected = np.zeros((50, d_model))
    for pos in range(50):
        for j in range(d_model):
            i = j // 2
            angle = pos / 10000 ** (2 * i / d_model)
            expected[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    np.testing.assert_allclose(table, expected, atol=1e-6)


def test_positional_encoding_layer_adds_table_and_offsets(tmp_path):
    layer = kt.PositionalEncoding(max_length=20, name="pos")
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    out = check_round_trips(layer, [x], tmp_path)
    np.testing.assert_allclose(out, x + kt.sinusoidal_position_encoding(5, 8)[None], atol=1e-6)
    shifted = keras.ops.convert_to_numpy(layer(x[:, :1], start_index=3))
    np.testing.assert_allclose(shifted[0, 0], x[0, 0] + kt.sinusoidal_position_encoding(20, 8)[3], atol=1e-6)
    with pytest.raises(ValueError, match="exceeds max_length=20"):
        layer(np.zeros((1, 21, 8), "float32"))


def test_learned_positions_are_trainable_and_round_trip(tmp_path):
    layer = kt.PositionalEncoding(max_length=10, kind="learned", name="learned")
    check_round_trips(layer, [RNG.normal(size=(1, 4, 8)).astype("float32")], tmp_path)
    assert [w.shape for w in layer.trainable_weights] == [(10, 8)]
    with pytest.raises(ValueError, match="kind must be"):
        kt.PositionalEncoding(10, kind="rotary")


def test_relative_kind_adds_no_position_but_still_bounds_lengths(tmp_path):
    """With relative positions the embeddings carry no absolute position: self-attention carries the distances."""
    layer = kt.PositionalEncoding(max_length=10, kind="relative", name="relative")
    x = RNG.normal(size=(2, 4, 8)).astype("float32")
    np.testing.assert_array_equal(check_round_trips(layer, [x], tmp_path), x)
    assert layer.weights == [] and layer.table is None
    with pytest.raises(ValueError, match="exceeds max_length=10"):
        layer(np.zeros((1, 11, 8), "float32"))


def test_relative_position_index_clips_the_distance_and_follows_the_query_offset():
    from keras_transformer.layers.position import relative_position_index

    index = keras.ops.convert_to_numpy(relative_position_index(4, 7, max_relative_position=2))
    expected = [[min(max(j - i, -2), 2) + 2 for j in range(7)] for i in range(4)]
    assert index.tolist() == expected and index.dtype == np.int32
    # A decoding step at position t (offset t) gets row t of the full matrix.
    step = relative_position_index(1, 7, 2, offset=keras.ops.convert_to_tensor(3, "int64"))
    assert keras.ops.convert_to_numpy(step).tolist() == [expected[3]]


# ------------------------------------------------------------------ embedding
def test_token_embedding_scales_and_reverses(tmp_path):
    layer = kt.TokenEmbedding(vocab_size=11, d_model=4, name="emb")
    ids = np.array([[1, 2, 0]], dtype="int32")
    out = check_round_trips(layer, [ids], tmp_path)
    table = keras.ops.convert_to_numpy(layer.embeddings)
    np.testing.assert_allclose(out[0], table[[1, 2, 0]] * 2.0, atol=1e-6)  # sqrt(4) = 2
    hidden = RNG.normal(size=(1, 3, 4)).astype("float32")
    logits = keras.ops.convert_to_numpy(layer(hidden, reverse=True))
    np.testing.assert_allclose(logits, hidden @ table.T, atol=1e-5)
    assert logits.dtype == np.float32


# ------------------------------------------------------------------ attention
def test_scaled_dot_product_attention_matches_numpy_with_mask():
    q = RNG.normal(size=(2, 3, 2, 4)).astype("float32")
    k = RNG.normal(size=(2, 5, 2, 4)).astype("float32")
    v = RNG.normal(size=(2, 5, 2, 6)).astype("float32")
    mask = RNG.random((2, 3, 5)) > 0.4
    mask[:, :, 0] = True
    out, weights = kt.scaled_dot_product_attention(q, k, v, mask)
    ref_out, ref_weights = numpy_attention(q, k, v, mask)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), ref_weights, atol=1e-6)
    assert np.all(keras.ops.convert_to_numpy(weights)[np.broadcast_to(~mask[:, None], weights.shape)] == 0.0)


def test_unscaled_logits_option():
    q = RNG.normal(size=(1, 2, 1, 16)).astype("float32")
    k = RNG.normal(size=(1, 3, 1, 16)).astype("float32")
    v = RNG.normal(size=(1, 3, 1, 16)).astype("float32")
    out, _ = kt.scaled_dot_product_attention(q, k, v, scale=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), numpy_attention(q, k, v, None, scale=False)[0],
                               atol=1e-4)


def _dense(layer):
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in layer.weights)
    return lambda x: x.astype(np.float64) @ kernel + bias


def test_multi_head_cross_attention_matches_numpy(tmp_path):
    layer = kt.MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5, name="mha")
    query = RNG.normal(size=(2, 4, 8)).astype("float32")
    value = RNG.normal(size=(2, 6, 10)).astype("float32")
    mask = np.ones((2, 4, 6), bool)
    mask[1, :, 4:] = False  # padded keys in the second sentence
    out, weights = layer(query, value, attention_mask=mask, return_attention_scores=True)
    q = _dense(layer.query_dense)(query).reshape(2, 4, 2, 3)
    kv = _dense(layer.key_value_dense)(value).reshape(2, 6, 2, 8)
    ref, ref_weights = numpy_attention(q, kv[..., :3], kv[..., 3:], mask)
    ref = _dense(layer.output_dense)(ref.reshape(2, 4, 10))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), ref, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), ref_weights, atol=1e-6)
    assert out.shape == (2, 4, 8)  # output width defaults to the query width
    check_round_trips(layer, [query, value], tmp_path)
    # 3 projections: query 8*6+6, key_value 10*16+16, output 10*8+8.
    assert layer.count_params() == (8 * 6 + 6) + (10 * 16 + 16) + (10 * 8 + 8)


def test_fused_self_attention_matches_numpy_causal_and_padded(tmp_path):
    layer = kt.MultiHeadSelfAttention(num_heads=2, key_dim=4, causal=True, name="self_attention")
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    padding = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    out, weights = layer(x, attention_mask=padding[:, None, :], return_attention_scores=True)
    qkv = _dense(layer.qkv_dense)(x).reshape(2, 5, 2, 12)
    mask = np.tril(np.ones((5, 5), bool))[None] & padding[:, None, :]
    ref, ref_weights = numpy_attention(qkv[..., :4], qkv[..., 4:8], qkv[..., 8:], mask)
    ref = _dense(layer.output_dense)(ref.reshape(2, 5, 8))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), ref, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), ref_weights, atol=1e-6)
    assert len(layer.trainable_weights) == 4  # one fused QKV kernel + bias, one output kernel + bias
    check_round_trips(layer, [x], tmp_path)


def numpy_relative_self_attention(layer, x, mask):
    """Shaw et al. (2018) written out, one (i, j) pair at a time, in float64: returns `(output, weights)`.

    e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z), alpha = softmax_j(e_ij) over the keys `mask` allows,
    z_i = sum_j alpha_ij (x_j W^V + a^V_ij), then the output projection; a^K_ij, a^V_ij are rows
    clip(j - i, -k, k) + k of the layer's two tables.
    """
    batch, length, _ = x.shape
    heads, dk, dv, k = layer.num_heads, layer.key_dim, layer.value_dim, layer.max_relative_position
    qkv = _dense(layer.qkv_dense)(x).reshape(batch, length, heads, 2 * dk + dv)
    q, keys, values = qkv[..., :dk], qkv[..., dk:2 * dk], qkv[..., 2 * dk:]
    table_k, table_v = (keras.ops.convert_to_numpy(t).astype(np.float64)
                        for t in (layer.relative_position_keys, layer.relative_position_values))
    weights = np.zeros((batch, heads, length, length))
    z = np.zeros((batch, length, heads, dv))
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                allowed = [j for j in range(length) if mask[b, i, j]]
                rows = [min(max(j - i, -k), k) + k for j in allowed]
                e = np.array([q[b, i, h] @ (keys[b, j, h] + table_k[r]) for j, r in zip(allowed, rows)])
                alpha = np.exp(e / math.sqrt(dk) - (e / math.sqrt(dk)).max())
                alpha /= alpha.sum()
                weights[b, h, i, allowed] = alpha
                z[b, i, h] = sum(a * (values[b, j, h] + table_v[r]) for a, j, r in zip(alpha, allowed, rows))
    return _dense(layer.output_dense)(z.reshape(batch, length, heads * dv)), weights


@pytest.mark.parametrize("causal", [False, True])
def test_relative_self_attention_matches_shaw_et_al_written_out(causal, tmp_path):
    """Keys and values both get their relative embeddings, clipped beyond k = 2 (9 positions: distances up to 8),
    shared by the heads; padded keys get zero weight; the decoder's causal mask combines with them."""
    layer = kt.MultiHeadSelfAttention(num_heads=2, key_dim=4, value_dim=3, causal=causal, max_relative_position=2,
                                      name="relative_attention")
    x = RNG.normal(size=(2, 9, 8)).astype("float32")
    padding = np.ones((2, 9), bool)
    padding[1, 6:] = False
    layer(x)  # build, then make the tables matter as much as the projections
    assert [tuple(t.shape) for t in (layer.relative_position_keys, layer.relative_position_values)] == [(5, 4), (5, 3)]
    for table in (layer.relative_position_keys, layer.relative_position_values):
        table.assign(RNG.normal(size=table.shape).astype("float32"))
    out, weights = layer(x, attention_mask=padding[:, None, :], return_attention_scores=True)
    mask = np.broadcast_to(padding[:, None, :], (2, 9, 9)) & (np.tril(np.ones((9, 9), bool)) if causal else True)
    ref, ref_weights = numpy_relative_self_attention(layer, x, mask)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), ref, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), ref_weights, atol=1e-6)
    # Without the tables it is another function: the reference is not blind to them.
    plain = kt.MultiHeadSelfAttention(num_heads=2, key_dim=4, value_dim=3, causal=causal)
    plain(x)
    for part in ("qkv_dense", "output_dense"):
        getattr(plain, part).set_weights(getattr(layer, part).get_weights())
    assert np.abs(keras.ops.convert_to_numpy(plain(x, attention_mask=padding[:, None, :])) - ref).max() > 0.1
    # Two tables on top of the fused QKV and output projections; both learn (they get a gradient).
    assert {w.name for w in layer.trainable_weights} - {w.name for w in plain.trainable_weights} == {
        "relative_position_keys", "relative_position_values"}
    assert layer.count_params() == plain.count_params() + 5 * 4 + 5 * 3
    import tensorflow as tf
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(layer(x, attention_mask=padding[:, None, :]) ** 2)
    for gradient in tape.gradient(total, [layer.relative_position_keys, layer.relative_position_values]):
        assert np.abs(tf.convert_to_tensor(gradient).numpy()).min(axis=-1).max() > 0
    check_round_trips(layer, [x], tmp_path)
    with pytest.raises(ValueError, match="max_relative_position must be positive"):
        kt.MultiHeadSelfAttention(num_heads=2, key_dim=4, max_relative_position=0)


@pytest.mark.parametrize("max_relative_position", [None, 2])
def test_self_attention_cache_equals_full_pass(max_relative_position):
    """Step t's query attends keys 0..t at distances j - t: the cached step equals the full pass (6 > 2k + 1)."""
    layer = kt.MultiHeadSelfAttention(num_heads=2, key_dim=4, causal=True, max_relative_position=max_relative_position)
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    full = keras.ops.convert_to_numpy(layer(x))
    cache = (keras.ops.zeros((2, 2, 6, 4)), keras.ops.zeros((2, 2, 6, 4)))  # keys, values: (B, H, T_max, d)
    steps = []
    for t in range(6):
        out, cache = layer(x[:, t:t + 1], cache=cache, cache_index=t)
        steps.append(keras.ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_restricted_self_attention_window_gives_zero_weight_outside():
    layer = kt.MultiHeadSelfAttention(num_heads=2, key_dim=4, window=2)
    _, weights = layer(RNG.normal(size=(1, 9, 8)).astype("float32"), return_attention_scores=True)
    weights = keras.ops.convert_to_numpy(weights)
    distance = np.abs(np.arange(9)[:, None] - np.arange(9)[None])
    assert np.all(weights[..., distance > 2] == 0.0)
    assert np.all(weights[..., distance <= 2] > 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


# ------------------------------------------------------ feed-forward, residual
def test_feed_forward_matches_numpy(tmp_path):
    layer = kt.PositionWiseFeedForward(d_model=8, d_ff=32, name="ffn")
    x = RNG.normal(size=(2, 3, 8)).astype("float32")
    out = check_round_trips(layer, [x], tmp_path)
    ref = _dense(layer.outer)(np.maximum(_dense(layer.inner)(x), 0.0))
    np.testing.assert_allclose(out, ref, atol=1e-5)
    assert layer.count_params() == 8 * 32 + 32 + 32 * 8 + 8


def test_gated_feed_forward_without_biases_matches_numpy(tmp_path):
    """(gelu_tanh(x W1) * x V) W2, no biases (T5 v1.1's gated GELU)."""
    from keras_transformer.layers.feed_forward import gelu_tanh
    layer = kt.PositionWiseFeedForward(d_model=8, d_ff=12, activation="gelu_tanh", gated=True, use_bias=False,
                                       name="ffn")
    x = RNG.normal(size=(2, 3, 8)).astype("float32")
    out = check_round_trips(layer, [x], tmp_path)
    inner = keras.ops.convert_to_numpy(gelu_tanh(x @ layer.inner.kernel.numpy()))
    np.testing.assert_allclose(out, (inner * (x @ layer.inner_linear.kernel.numpy())) @ layer.outer.kernel.numpy(),
                               atol=1e-5)
    assert layer.count_params() == 2 * 8 * 12 + 12 * 8


def test_rms_normalization_matches_numpy_and_round_trips(tmp_path):
    """x / sqrt(mean(x^2) + eps) * gamma: no mean subtracted, no bias (T5LayerNorm)."""
    from keras_transformer.layers.normalization import RMSNormalization
    layer = RMSNormalization(epsilon=1e-6, name="rms")
    x = RNG.normal(1.0, 2.0, size=(2, 3, 8)).astype("float32")
    layer.build(x.shape)
    layer.gamma.assign(RNG.normal(size=8).astype("float32"))
    out = check_round_trips(layer, [x], tmp_path)
    np.testing.assert_allclose(out, x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + 1e-6) * layer.gamma.numpy(),
                               atol=1e-5)
    assert [w.name for w in layer.weights] == ["gamma"]


def test_sublayer_connection_post_norm_pre_norm_and_rezero():
    x = RNG.normal(size=(2, 3, 8)).astype("float32")
    y = RNG.normal(size=(2, 3, 8)).astype("float32")

    def layer_norm(z):
        return (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-6)

    post = kt.SublayerConnection(norm_first=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(post(x, y)), layer_norm(x + y), atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(post.normalize(x)), x)
    pre = kt.SublayerConnection(norm_first=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(pre(x, y)), x + y, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(pre.normalize(x)), layer_norm(x), atol=1e-5)
    rezero = kt.SublayerConnection(norm_first=True, use_rezero=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(rezero(x, y)), x, atol=1e-6)  # alpha starts at 0
    assert [w.name for w in rezero.trainable_weights if w.shape == ()] == ["rezero_alpha"]
    dropped = kt.SublayerConnection(norm_first=True, dropout=0.999)
    out = keras.ops.convert_to_numpy(dropped(x, y * 0 + 1, training=True))
    assert np.mean(np.isclose(out, x)) > 0.95  # dropout near 1 removes the sub-layer output


# ------------------------------------------------------- encoder and decoder
@pytest.mark.parametrize("options", [dict(), dict(norm_first=True), dict(use_rezero=True),
                                     dict(scale_attention_logits=False, attention_window=2),
                                     dict(max_relative_position=3)])
def test_encoder_and_decoder_layers_round_trip(options, tmp_path):
    x = RNG.normal(size=(2, 4, 8)).astype("float32")
    memory = RNG.normal(size=(2, 6, 8)).astype("float32")
    encoder = kt.EncoderLayer(d_model=8, num_heads=2, d_ff=16, name="enc", **options)
    check_round_trips(encoder, [x], tmp_path)
    decoder = kt.DecoderLayer(d_model=8, num_heads=2, d_ff=16, name="dec", **options)
    check_round_trips(decoder, [x, memory], tmp_path)
    # Pinned weight counts: attention 4*(8*8+8), FFN 8*16+16+16*8+8, LayerNorms 2*8 each.
    attention, ffn, norm = 4 * (8 * 8 + 8), 8 * 16 + 16 + 16 * 8 + 8, 2 * 8
    rezero = 1 if options.get("use_rezero") else 0
    # Relative positions: a (2k + 1, d_k) and a (2k + 1, d_v) table in self-attention only, not in cross-attention.
    relative = 2 * (2 * options["max_relative_position"] + 1) * 4 if "max_relative_position" in options else 0
    assert encoder.count_params() == attention + ffn + 2 * (norm + rezero) + relative
    assert decoder.count_params() == 2 * attention + ffn + 3 * (norm + rezero) + relative
    assert decoder.cross_attention.get_config().get("max_relative_position") is None


@pytest.mark.slow  # three stacks saved and loaded back (5 CPU s)
def test_stacks_round_trip_and_prenorm_adds_final_norm(tmp_path):
    """Encoder and decoder stacks, post- and pre-norm, round-trip through `keras.saving` with the same
    outputs; pre-norm adds the final norm's parameters."""
    x = RNG.normal(size=(2, 4, 8)).astype("float32")
    memory = RNG.normal(size=(2, 6, 8)).astype("float32")
    post = kt.TransformerEncoder(num_layers=2, d_model=8, num_heads=2, d_ff=16, name="encoder_post")
    pre = kt.TransformerEncoder(num_layers=2, d_model=8, num_heads=2, d_ff=16, norm_first=True, name="encoder_pre")
    check_round_trips(post, [x], tmp_path)
    check_round_trips(pre, [x], tmp_path)
    assert pre.count_params() == post.count_params() + 16
    decoder = kt.TransformerDecoder(num_layers=2, d_model=8, num_heads=2, d_ff=16, norm_first=True, name="decoder")
    check_round_trips(decoder, [x, memory], tmp_path)


def test_layer_errors_name_the_problem():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=3"):
        kt.EncoderLayer(d_model=10, num_heads=3, d_ff=16)
    with pytest.raises(ValueError, match="input width 6 does not match d_model=8"):
        kt.EncoderLayer(d_model=8, num_heads=2, d_ff=16)(np.zeros((1, 3, 6), "float32"))
    with pytest.raises(ValueError, match="num_heads must be positive"):
        kt.MultiHeadAttention(num_heads=0, key_dim=4)


def test_padding_mask_layer_round_trips(tmp_path):
    layer = kt.PaddingMask(pad_id=0, name="mask")
    out = keras.ops.convert_to_numpy(layer(np.array([[4, 0, 5]], "int32")))
    assert out.tolist() == [[True, False, True]]
    assert kt.PaddingMask.from_config(layer.get_config()).pad_id == 0


@pytest.mark.parametrize("options", [dict(), dict(max_relative_position=2),
                                     dict(normalization="rms", gated_feed_forward=True, use_bias=False,
                                          relative_attention_num_buckets=8)])
def test_mixed_precision_layers_compute_in_bfloat16(options):
    layer = kt.EncoderLayer(d_model=8, num_heads=2, d_ff=16, dtype="mixed_bfloat16", **options)
    out = layer(RNG.normal(size=(1, 3, 8)).astype("float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in layer.weights)


def test_layer_normalization_gradient_matches_keras_autodiff():
    """Our LayerNormalization writes its gradient by hand; Keras' layer, differentiated by TensorFlow, agrees."""
    import tensorflow as tf

    from keras_transformer.layers.normalization import LayerNormalization
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(4, 5, 16)).astype("float32") * 2 + 1)
    upstream = tf.constant(rng.normal(size=(4, 5, 16)).astype("float32"))
    weights = [rng.normal(size=16).astype("float32"), rng.normal(size=16).astype("float32")]
    results = []
    for layer in (LayerNormalization(epsilon=1e-6), keras.layers.LayerNormalization(epsilon=1e-6)):
        layer.build(x.shape)
        layer.set_weights(weights)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            total = tf.reduce_sum(y * upstream)
        results.append([y, *tape.gradient(total, [x, *layer.trainable_variables])])
    for ours, theirs, name in zip(*results, ["outputs", "d inputs", "d gamma", "d beta"]):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5, err_msg=name)


@pytest.mark.parametrize("max_relative_position", [None, 1])
def test_self_attention_cache_takes_a_prefix_then_single_steps(max_relative_position):
    """A prompt of 3 positions written at once, then one position per step: the full pass's outputs."""
    layer = kt.MultiHeadSelfAttention(num_heads=2, key_dim=4, causal=True, max_relative_position=max_relative_position)
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    full = keras.ops.convert_to_numpy(layer(x))
    cache = (keras.ops.zeros((2, 2, 6, 4)), keras.ops.zeros((2, 2, 6, 4)))
    out, cache = layer(x[:, :3], cache=cache, cache_index=0)
    steps = [keras.ops.convert_to_numpy(out)]
    for t in range(3, 6):
        out, cache = layer(x[:, t:t + 1], cache=cache, cache_index=t)
        steps.append(keras.ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    assert keras.ops.convert_to_numpy(cache[0]).shape == (2, 2, 6, 4)
