"""build_model: shapes, causality, padding, weight tying, parameter counts, round trips."""

import ast
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt

RNG = np.random.default_rng(1)
PACKAGE = pathlib.Path(kt.__file__).parent


def tiny(**overrides):
    values = dict(vocab_size=40, dropout=0.0)
    values.update(overrides)
    return kt.TransformerConfig.preset("tiny", **values)


def logits(model, source, target):
    return keras.ops.convert_to_numpy(model({"source": source, "target": target}, training=False))


def random_batch(batch=2, source_length=7, target_length=6, vocab=40):
    return (RNG.integers(4, vocab, size=(batch, source_length)).astype("int32"),
            RNG.integers(4, vocab, size=(batch, target_length)).astype("int32"))


def test_inputs_outputs_and_dtypes():
    model = kt.build_model(tiny())
    assert set(model.input) == {"source", "target"}
    source, target = random_batch()
    out = model({"source": source, "target": target})
    assert out.shape == (2, 6, 40)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


# T5's options (imports/t5.py): RMS norm, gated GELU, no biases, bucketed relative position biases (8 buckets: the
# exact ones end at distance 2 each way, so the tests' lengths reach the logarithmic ones), d_kv * h != d_model.
T5 = dict(position="relative_bias", relative_attention_num_buckets=8, relative_attention_max_distance=12,
          normalization="rms", gated_feed_forward=True, use_bias=False, norm_first=True, scale_attention_logits=False,
          scale_embeddings=False, key_dim=6, activation="gelu_tanh", tie_embeddings="embeddings",
          scale_decoder_output=True)


@pytest.mark.parametrize("options", [dict(), dict(norm_first=True), dict(position="learned", use_rezero=True)])
def test_causality_future_targets_never_change_earlier_logits(options):
    model = kt.build_model(tiny(**options))
    source, target = random_batch(batch=1, target_length=8)
    base = logits(model, source, target)
    for t in (0, 3, 7):
        changed = target.copy()
        changed[0, t] = (changed[0, t] + 1 - 4) % 36 + 4
        out = logits(model, source, changed)
        np.testing.assert_allclose(out[:, :t], base[:, :t], atol=1e-5)
        assert np.abs(out[:, t:] - base[:, t:]).max() > 1e-4  # position t and later do see the change


def test_appending_padding_changes_no_real_position():
    model = kt.build_model(tiny(norm_first=True))
    source, target = random_batch(batch=2, source_length=5, target_length=4)
    base = logits(model, source, target)
    padded_source = np.concatenate([source, np.zeros((2, 6), "int32")], axis=1)
    padded_target = np.concatenate([target, np.zeros((2, 3), "int32")], axis=1)
    np.testing.assert_allclose(logits(model, padded_source, target), base, atol=1e-5)
    np.testing.assert_allclose(logits(model, padded_source, padded_target)[:, :4], base, atol=1e-5)


@pytest.mark.parametrize("options", [dict(), dict(position="relative", max_relative_position=2)])
def test_padding_inside_a_batch_matches_the_sentence_alone(options):
    model = kt.build_model(tiny(**options))
    source, target = random_batch(batch=2, source_length=6, target_length=5)
    source[1, 3:] = 0
    target[1, 2:] = 0
    batch = logits(model, source, target)
    alone = logits(model, source[1:, :3], target[1:, :2])
    np.testing.assert_allclose(batch[1:, :2], alone, atol=1e-5)


@pytest.mark.parametrize("preset, paper", [("base", 65e6), ("big", 213e6)])
def test_parameter_counts_match_the_paper(preset, paper):
    model = kt.build_model(kt.TransformerConfig.preset(preset, vocab_size=37000))
    assert abs(model.count_params() / paper - 1) < 0.05, model.count_params()


def test_weight_tying_modes():
    config = tiny(vocab_size=50, d_model=16, num_heads=2, d_ff=32, num_layers=1)
    counts = {}
    for mode in ("all", "decoder", "none"):
        model = kt.build_model(config.replace(tie_embeddings=mode))
        names = {layer.name for layer in model.layers}
        counts[mode] = model.count_params()
        if mode == "all":
            assert "shared_embedding" in names and "output_projection" not in names
        elif mode == "decoder":
            assert {"source_embedding", "target_embedding"} <= names and "output_projection" not in names
        else:
            assert "output_projection" in names
    assert counts["decoder"] - counts["all"] == 50 * 16
    assert counts["none"] - counts["decoder"] == 50 * 16


def test_tied_projection_uses_the_embedding_matrix():
    model = kt.build_model(tiny())
    source, target = random_batch(batch=1)
    table = keras.ops.convert_to_numpy(model.get_layer("shared_embedding").embeddings)
    memory, mask = kt.encode(model, source)
    hidden_logits = keras.ops.convert_to_numpy(kt.decode(model, target, memory, mask))
    np.testing.assert_allclose(hidden_logits, logits(model, source, target), atol=1e-5)
    # Changing the embedding matrix changes the logits through the projection, too.
    model.get_layer("shared_embedding").embeddings.assign(table * 2)
    assert np.abs(logits(model, source, target) - hidden_logits).max() > 1e-3


def test_separate_vocabularies_give_target_sized_logits():
    config = tiny(source_vocab_size=30, target_vocab_size=45, tie_embeddings="none")
    model = kt.build_model(config)
    out = model({"source": np.ones((1, 3), "int32"), "target": np.ones((1, 2), "int32")})
    assert out.shape == (1, 2, 45)


@pytest.mark.parametrize("options", [dict(), dict(tie_embeddings="none", norm_first=True, position="learned",
                                          embedding_norm=True),
                                     dict(position="relative", max_relative_position=3),
                                     dict(activation="gelu_tanh", output_bias=True, sinusoid_layout="concatenated",
                                          scale_embeddings=False, tie_embeddings="none"), T5])
def test_model_config_and_keras_file_round_trips(options, tmp_path):
    model = kt.build_model(tiny(**options))
    source, target = random_batch()
    expected = logits(model, source, target)
    clone = keras.Model.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(logits(clone, source, target), expected, atol=1e-6)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(logits(restored, source, target), expected, atol=1e-6)


def test_every_registered_class_is_known_to_keras_before_its_module_is_imported():
    """`keras_transformer.runtime.registration.SERIALIZABLE` lists each class of the source decorated with
    `register_keras_serializable`, so that a `.keras` file naming one loads after `import keras_transformer`."""
    from keras_transformer.runtime.registration import SERIALIZABLE

    decorated = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("keras_transformer", *path.relative_to(PACKAGE).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any("register_keras_serializable" in ast.unparse(d)
                                                      for d in node.decorator_list):
                decorated.add((module.removesuffix(".__init__"), node.name))
    listed = {tuple(SERIALIZABLE.path(name).split(":")) for name in SERIALIZABLE}
    assert decorated and listed == decorated, (sorted(decorated - listed), sorted(listed - decorated))


RELOAD_AND_CONTINUE = """
import sys
import keras_transformer
assert "keras" not in sys.modules and "tensorflow" not in sys.modules, "import keras_transformer imported Keras"
import keras
import numpy as np
model = keras.models.load_model(sys.argv[1])
optimizer = model.optimizer
state = dict(iterations=int(optimizer.iterations),
             schedule=optimizer.get_config()["learning_rate"]["class_name"],
             loss=type(model.loss).__name__)
batch = np.load(sys.argv[2])
history = model.fit({"source": batch["source"], "target": batch["target"]}, batch["labels"], verbose=0)
state["metrics"] = sorted(history.history)
state["after"] = int(optimizer.iterations)
np.savez(sys.argv[3], *model.get_weights())
print(state)
"""


@pytest.mark.slow
def test_a_keras_file_reloads_in_a_fresh_process_and_fit_continues_from_its_update_count(tmp_path):
    """Optimizer (Adam's moments, its update count), schedule, loss and metrics come back from `model.keras`:
    one more `fit` step in a new process gives the weights the same step gives in this one. That process prints
    none of TensorFlow's C++ log lines."""
    from keras_transformer.experiment import TrainingSection
    from keras_transformer.runtime.tensorflow_logs import CPP_LOG_LINE

    config = tiny(num_layers=1)
    settings = TrainingSection(warmup_steps=10)
    model = kt.build_model(config)
    model.compile(optimizer=kt.make_optimizer(config, settings),
                  loss=kt.LabelSmoothedCrossEntropy(settings.label_smoothing, pad_id=config.pad_id),
                  metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
    rng = np.random.default_rng(3)
    source, target = (rng.integers(4, 40, size=(8, 6)).astype("int32") for _ in range(2))
    labels = np.roll(target, -1, axis=1)
    inputs = {"source": source, "target": target}
    model.fit(inputs, labels, epochs=3, verbose=0)
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "batch.npz", source=source, target=target, labels=labels)
    saved = model.get_weights()
    model.fit(inputs, labels, verbose=0)  # the step the fresh process takes
    env = {key: value for key, value in os.environ.items()
           if key not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_TRANSFORMER_TF_LOGS")}
    env.update(PYTHONPATH=str(PACKAGE.parent), CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, "-c", RELOAD_AND_CONTINUE, str(tmp_path / "model.keras"),
                          str(tmp_path / "batch.npz"), str(tmp_path / "after.npz")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # TensorFlow, imported by Keras, printed none of its C++ log lines (keras_transformer.runtime.tensorflow_logs).
    assert not [line for line in run.stderr.splitlines() if CPP_LOG_LINE.match(line)], run.stderr[-3000:]
    state = eval(run.stdout.strip().splitlines()[-1])
    assert state == dict(iterations=3, schedule="NoamSchedule", loss="LabelSmoothedCrossEntropy", after=4,
                         metrics=["loss", "masked_accuracy"])
    after = np.load(tmp_path / "after.npz")
    here = np.concatenate([(w - s).ravel() for w, s in zip(model.get_weights(), saved)])
    there = np.concatenate([(after[f"arr_{i}"] - s).ravel() for i, s in enumerate(saved)])
    # The same step, up to float rounding that Adam's division by sqrt(v) magnifies for tiny gradients (1e-4 of
    # the step measured); lost moments or a restarted schedule would change the step itself.
    assert np.linalg.norm(there - here) < 0.01 * np.linalg.norm(here)


@pytest.mark.parametrize("options", [dict(), dict(position="relative", max_relative_position=2),
                                     dict(embedding_norm=True, norm_first=True, position="learned"), T5])
def test_cached_decoding_equals_full_pass(options):
    """With relative positions the 7 steps reach distances beyond k = 2 (the clipped rows); with an embedding
    norm (mBART's) each step normalizes its embedding as the full pass does; with T5's buckets, each step's bias
    (its query at the cache index against the whole cache) is the full pass's row."""
    model = kt.build_model(tiny(num_layers=3, **options))
    source, target = random_batch(batch=2, target_length=7)
    source[0, 5:] = 0
    full = logits(model, source, target)
    np.testing.assert_allclose(step_by_step(model, source, target), full, atol=1e-5)


def step_by_step(model, source, target, pad_id=0):
    """The logits of `target` decoded one cached step at a time (`encode`, then `decode` per position)."""
    memory, mask = kt.encode(model, source, pad_id=pad_id)
    decoder = model.get_layer("decoder")
    batch, length = target.shape
    cache, cross = decoder.initial_cache(batch, length), decoder.cross_attention_cache(memory)
    steps = []
    for t in range(length):
        step, cache = kt.decode(model, target[:, t:t + 1], None, mask, self_attention_cache=cache, cache_index=t,
                                cross_attention_cache=cross)
        steps.append(keras.ops.convert_to_numpy(step))
    return np.concatenate(steps, axis=1)


def test_a_decoder_that_starts_from_the_pad_id_attends_to_it_in_the_full_pass_as_step_by_step():
    """Marian's layout (eos 0, unk 1, pad = bos = V - 1): the start token is the pad id, yet never padding."""
    config = tiny(num_layers=2, pad_id=39, bos_id=39, eos_id=0, unk_id=1, activation="swish", output_bias=True,
                  sinusoid_layout="concatenated")
    model = kt.build_model(config)
    model.get_layer("output_bias").bias.assign(RNG.normal(size=40).astype("float32"))
    source = RNG.integers(2, 39, size=(2, 6)).astype("int32")
    source[0, 4:] = 39
    target = np.concatenate([np.full((2, 1), 39), RNG.integers(2, 39, size=(2, 4))], axis=1).astype("int32")
    full = logits(model, source, target)
    np.testing.assert_allclose(step_by_step(model, source, target, pad_id=39), full, atol=1e-5)
    # the bias is added to every position's logits
    memory, mask = kt.encode(model, source, pad_id=39)
    without = keras.ops.convert_to_numpy(kt.decode(model, target, memory, mask)) - \
        keras.ops.convert_to_numpy(model.get_layer("output_bias").bias)
    model.get_layer("output_bias").bias.assign(np.zeros(40, "float32"))
    np.testing.assert_allclose(logits(model, source, target), without, atol=1e-5)


def test_concatenated_sinusoids_put_every_sine_before_every_cosine():
    from keras_transformer.layers.position import sinusoidal_position_encoding
    table = sinusoidal_position_encoding(7, 6, "concatenated")
    for pos in range(7):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[pos, i] == pytest.approx(np.sin(angle), abs=1e-6)
            assert table[pos, 3 + i] == pytest.approx(np.cos(angle), abs=1e-6)
    interleaved = sinusoidal_position_encoding(7, 6)
    np.testing.assert_array_equal(interleaved[:, 0::2], table[:, :3])


@pytest.mark.parametrize("name, function", [
    ("relu", lambda x: np.maximum(x, 0)),
    ("gelu", lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2)))),
    ("gelu_tanh", lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    ("swish", lambda x: x / (1 + np.exp(-x)))])
def test_each_feed_forward_activation_is_the_function_it_names(name, function):
    layer = kt.PositionWiseFeedForward(d_model=4, d_ff=8, activation=name)
    x = RNG.normal(size=(1, 3, 4)).astype("float32")
    layer(x)
    inner = x @ keras.ops.convert_to_numpy(layer.inner.kernel) + keras.ops.convert_to_numpy(layer.inner.bias)
    expected = function(inner) @ keras.ops.convert_to_numpy(layer.outer.kernel) + \
        keras.ops.convert_to_numpy(layer.outer.bias)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), expected, atol=1e-5)
    assert kt.PositionWiseFeedForward.from_config(layer.get_config()).activation == name


def test_decoder_caches_are_heads_first_key_value_pairs_per_layer():
    model = kt.build_model(tiny(num_layers=3))
    source, target = random_batch(batch=2, target_length=7)
    memory, mask = kt.encode(model, source)
    decoder = kt.model.parts(model).decoder
    cache, cross = decoder.initial_cache(2, 7), decoder.cross_attention_cache(memory)
    d_k = 64 // decoder.num_heads
    assert [[tuple(t.shape) for t in pair] for pair in cache] == [[(2, decoder.num_heads, 7, d_k)] * 2] * 3
    assert ([[tuple(t.shape) for t in pair] for pair in cross]
            == [[(2, decoder.num_heads, source.shape[1], d_k)] * 2] * 3)
    # the cross-attention pair is the fused key/value projection of the memory, split per head
    fused = keras.ops.convert_to_numpy(decoder.decoder_layers[0].cross_attention.key_value_dense(memory))
    fused = fused.reshape(2, source.shape[1], decoder.num_heads, 2 * d_k)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(cross[0][0]), fused[..., :d_k].transpose(0, 2, 1, 3),
                               atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(cross[0][1]), fused[..., d_k:].transpose(0, 2, 1, 3),
                               atol=1e-6)
    # the step writes position 0 of every layer's keys and values and nothing else
    _, updated = kt.decode(model, target[:, :1], None, mask, self_attention_cache=cache, cache_index=0,
                           cross_attention_cache=cross)
    assert isinstance(updated, tuple) and len(updated) == 3
    for pair in updated:
        for tensor in pair:
            tensor = keras.ops.convert_to_numpy(tensor)
            assert np.abs(tensor[:, :, 0]).sum() > 0 and not tensor[:, :, 1:].any()
    stacked = keras.ops.stack([k for k, _ in cache], axis=1)  # one tensor for all layers is refused by name
    with pytest.raises(ValueError, match=r"self_attention_cache must be a tuple of one \(keys, values\) pair"):
        kt.decode(model, target[:, :1], None, mask, self_attention_cache=stacked, cache_index=0,
                  cross_attention_cache=cross)
    with pytest.raises(ValueError, match=r"cross_attention_cache .* got 2 entries"):
        kt.decode(model, target[:, :1], None, mask, self_attention_cache=cache, cache_index=0,
                  cross_attention_cache=cross[:2])


def test_cached_beam_rows_share_one_cross_attention_cache_per_sentence():
    """beam_size K: K target rows per source row give the logits of the source repeated K times."""
    model = kt.build_model(tiny(num_layers=2))
    source, target = random_batch(batch=2, target_length=5)
    source[1, 4:] = 0
    memory, mask = kt.encode(model, source)
    decoder = kt.model.parts(model).decoder
    beams = 3
    target = np.repeat(target, beams, axis=0)  # (2*K, T)
    expected = logits(model, np.repeat(source, beams, axis=0), target)
    cache, cross = decoder.initial_cache(2 * beams, 5), decoder.cross_attention_cache(memory)
    steps = []
    for t in range(5):
        step, cache = kt.decode(model, target[:, t:t + 1], None, mask, self_attention_cache=cache, cache_index=t,
                                cross_attention_cache=cross, beam_size=beams)
        steps.append(keras.ops.convert_to_numpy(step))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"give 3 targets \(beams\) per source"):
        kt.decode(model, target[:5, :1], None, mask, self_attention_cache=decoder.initial_cache(5, 5),
                  cache_index=0, cross_attention_cache=cross, beam_size=beams)


@pytest.mark.parametrize("tie", ["all", "decoder", "none"])
def test_parts_names_every_layer_and_the_tying(tie):
    config = tiny(source_vocab_size=30, target_vocab_size=45, tie_embeddings=tie) if tie != "all" else tiny()
    model = kt.build_model(config)
    p = kt.model.parts(model)
    by_name = {layer.name: layer for layer in model.layers}
    assert p.tie == tie and p.shared_embedding == (tie == "all") and p.tied_output == (tie != "none")
    assert (p.source_embedding is p.target_embedding) == (tie == "all")
    assert p.output_projection is by_name.get("output_projection")
    for role in ("source_position", "target_position", "source_dropout", "target_dropout", "encoder", "decoder"):
        assert getattr(p, role) is by_name[role]
    with pytest.raises(AttributeError):
        p.tie = "none"  # frozen
    # the precomputed output matrix gives the model's own logits
    source, target = random_batch(batch=2, target_length=4, vocab=30)
    memory, mask = kt.encode(model, source)
    direct = keras.ops.convert_to_numpy(kt.decode(model, target, memory, mask))
    via_kernel = kt.decode(model, target, memory, mask, output_kernel=kt.model.output_kernel(model))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(via_kernel), direct, atol=1e-5)


@pytest.mark.parametrize("sources, targets", [(2, 1), (1, 2), (3, 2)])
def test_source_and_target_batches_of_different_sizes_are_refused(sources, targets):
    """(2, S) sources with (1, T) targets gave (2, T, V) logits (attention broadcast the batch of one)."""
    model = kt.build_model(tiny())
    source, target = random_batch(batch=max(sources, targets))
    message = rf"target batch of {targets} sequence\(s\) but a source batch of {sources}"
    with pytest.raises(ValueError, match=message):
        model({"source": source[:sources], "target": target[:targets]})
    memory, mask = kt.encode(model, source[:sources])
    with pytest.raises(ValueError, match=message):
        kt.decode(model, target[:targets], memory, mask)
    decoder = model.get_layer("decoder")
    with pytest.raises(ValueError, match=message):  # the cached step: no memory, only its projections
        kt.decode(model, target[:targets, :1], None, mask, self_attention_cache=decoder.initial_cache(targets, 4),
                  cache_index=0, cross_attention_cache=decoder.cross_attention_cache(memory))


def test_relative_positions_replace_the_absolute_ones():
    """`position: relative`: no position table anywhere, only distances. So padding put BEFORE a source (which
    moves every token's absolute position) changes none of its encoder outputs; with sinusoids it does. Each
    self-attention layer holds its own (2k + 1, d_k) key and value tables; cross-attention holds none."""
    config = tiny(position="relative", max_relative_position=3)
    model = kt.build_model(config)
    p = kt.model.parts(model)
    assert p.source_position.weights == p.target_position.weights == [] and p.target_position.max_length == 128
    tables = [w for w in model.weights if "relative_position" in w.path]
    assert len(tables) == 2 * (config.encoder_layers + config.decoder_layers)
    assert all(w.shape == (7, config.head_dim) and "self_attention" in w.path for w in tables)
    assert model.count_params() == kt.build_model(tiny()).count_params() + sum(7 * config.head_dim for _ in tables)
    source, _ = random_batch(batch=1, source_length=6)
    left_padded = np.concatenate([np.zeros((1, 3), "int32"), source], axis=1)
    for position, moved in (("relative", False), ("sinusoidal", True)):
        model = kt.build_model(tiny(position=position, max_relative_position=3))
        memory = keras.ops.convert_to_numpy(kt.encode(model, source)[0])
        shifted = keras.ops.convert_to_numpy(kt.encode(model, left_padded)[0])[:, 3:]
        assert (np.abs(shifted - memory).max() > 1e-3) == moved, position


@pytest.mark.parametrize("policy", ["mixed_float16"])  # mixed_bfloat16: test_layers.py, at the layer
def test_relative_positions_under_mixed_precision(policy):
    """Under a mixed policy the relative tables stay float32 variables, the attention computes in the policy's
    dtype, and the cached steps give the full pass's logits (as float32 does, within the dtype's precision)."""
    config = tiny(num_layers=1, position="relative", max_relative_position=2)
    reference = kt.build_model(config)
    keras.config.set_dtype_policy(policy)
    try:
        model = kt.build_model(config)
    finally:
        keras.config.set_dtype_policy("float32")
    model.set_weights(reference.get_weights())
    assert {keras.backend.standardize_dtype(w.dtype) for w in model.weights if "relative" in w.path} == {"float32"}
    source, target = random_batch(batch=2, target_length=6)
    full = logits(model, source, target)
    tolerance = 0.05 if policy == "mixed_float16" else 0.3
    np.testing.assert_allclose(full, logits(reference, source, target), atol=tolerance)
    memory, mask = kt.encode(model, source)
    decoder = model.get_layer("decoder")
    cache, cross = decoder.initial_cache(2, 6), decoder.cross_attention_cache(memory)
    assert keras.backend.standardize_dtype(cache[0][0].dtype) == policy.split("_")[1]
    steps = []
    for t in range(6):
        step, cache = kt.decode(model, target[:, t:t + 1], None, mask, self_attention_cache=cache, cache_index=t,
                                cross_attention_cache=cross)
        steps.append(keras.ops.convert_to_numpy(step))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=tolerance)


def test_build_model_rejects_a_non_config():
    with pytest.raises(TypeError, match="TransformerConfig"):
        kt.build_model({"vocab_size": 10})


MODEL_MODULES = ["config.py", "model.py", "trainer/losses.py", "trainer/metrics.py", "trainer/schedules.py",
                 "trainer/optimizers.py", "trainer/distillation.py", "data/synthetic.py",
                 *[f"{folder}/{p.name}" for folder in ("decoding", "layers") for p in (PACKAGE / folder).glob("*.py")]]


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_model_modules_import_only_keras_numpy_and_the_standard_library(module):
    path = PACKAGE / module
    if not path.exists():
        pytest.skip(f"{module} not present")
    allowed_third_party = {"keras", "numpy", "yaml"}
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            assert top not in {"tensorflow", "tensorflow_text", "tf_keras", "torch", "jax"}, f"{module} imports {name}"
            assert top in allowed_third_party | {"keras_transformer"} or top in __import__("sys").stdlib_module_names, (
                f"{module} imports {name}")
