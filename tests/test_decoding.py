"""Greedy decoding and beam search: the cache, padding, beam 1, scores, XLA, limits."""

import ast
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import decoding

# Its module fixtures and traced translators are shared by its tests: `make test` (--dist loadgroup) runs the
# whole file on one worker, so they are built once.
pytestmark = pytest.mark.xdist_group("test_decoding")

# Options shared by most tests, so that each (search, model, options) graph is traced once.
BEAM = dict(beam_size=4, alpha=0.6, max_extra=5, num_return=4)
GREEDY = dict(max_extra=5)

# Sources of different lengths (tokens then eos 3), padded with 0.
SOURCES = [[5, 6, 7, 3], [8, 9, 10, 11, 12, 13, 14, 15, 3], [16, 17, 3], [20, 21, 22, 23, 24, 25, 3]]


_GRAPHS = {}


def run(search, model, source, **options):
    """`search(model, source, **options)` in one tf.function per (search, model, options) with dynamic shapes.

    Graph mode keeps these tests fast; eager and XLA execution are compared with it below.
    """
    key = (search.__name__, id(model), tuple(sorted(options.items())))
    if key not in _GRAPHS:
        _GRAPHS[key] = tf.function(lambda s: search(model, s, **options),
                                   input_signature=[tf.TensorSpec([None, None], tf.int32)])
    return _GRAPHS[key](tf.constant(source, tf.int32))


def padded(rows, width=None):
    width = width or max(len(r) for r in rows)
    return np.array([r + [0] * (width - len(r)) for r in rows], "int32")


@pytest.fixture(scope="module")
def random_model():
    """An untrained tiny model with pre-norm (dropout off): flat distributions, long outputs."""
    import keras

    keras.utils.set_random_seed(1)
    return kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=40, dropout=0.0, norm_first=True))


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_steps_equal_full_pass(norm_first):
    """Feeding the target one token at a time through the cache gives the full pass's logits."""
    import keras

    keras.utils.set_random_seed(2)
    model = kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=40, norm_first=norm_first))
    source = padded(SOURCES[:3])
    target = np.random.default_rng(0).integers(4, 40, size=(3, 9)).astype("int32")
    target[:, 0] = 2  # bos

    full = kt.model.decode(model, target, *kt.model.encode(model, source))  # (B, T, V)
    assert np.allclose(full, model({"source": source, "target": target}), atol=1e-5)

    memory, source_padding = kt.model.encode(model, source)
    decoder = model.get_layer("decoder")
    cross = decoder.cross_attention_cache(memory)
    cache = decoder.initial_cache(3, 12)  # longer than needed: unused slots must not matter
    steps = []
    for t in range(target.shape[1]):
        logits, cache = kt.model.decode(model, target[:, t:t + 1], None, source_padding,
                                        self_attention_cache=cache, cache_index=t, cross_attention_cache=cross)
        steps.append(logits[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5)


@pytest.mark.slow
def test_scores_are_the_model_log_probabilities(random_model):
    """Reported scores equal forced-decode scores of the returned tokens."""
    source = padded(SOURCES)
    tokens, scores = run(decoding.greedy_decode, random_model, source, **GREEDY)
    np.testing.assert_allclose(scores, decoding.score(random_model, source, tokens), atol=1e-4)

    tokens, scores = run(decoding.beam_search, random_model, source, **BEAM)
    flat_tokens = np.reshape(tokens, (-1, tokens.shape[-1]))
    forced = decoding.score(random_model, np.repeat(source, 4, axis=0), flat_tokens, alpha=0.6)
    np.testing.assert_allclose(np.reshape(scores, -1), forced, atol=1e-4)
    assert np.all(np.diff(scores, axis=1) <= 1e-6), "n-best must come best first"
    for hypotheses in tokens.numpy().tolist():  # the n-best hypotheses of a sentence differ
        assert len({tuple(h) for h in hypotheses}) == 4


@pytest.mark.slow  # two traced searches per model: 15.4 CPU s on a 2-core AVX2 machine, over the unmarked bound
@pytest.mark.parametrize("fixture", ["random_model", "trained_copy_model"])
def test_beam_size_one_is_greedy(fixture, random_model, trained_copy_model):
    """Slow: two full searches per model, on a random and a trained model (where ties and peaks differ)."""
    model = {"random_model": random_model, "trained_copy_model": trained_copy_model[0]}[fixture]
    source = padded(SOURCES)
    greedy_tokens, greedy_scores = run(decoding.greedy_decode, model, source, **GREEDY)
    beam_tokens, beam_scores = run(decoding.beam_search, model, source, beam_size=1, alpha=0.0, max_extra=5)
    np.testing.assert_array_equal(beam_tokens[:, 0], greedy_tokens)
    np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, atol=1e-5)


@pytest.mark.slow  # each sentence searched alone, padded and in a batch (6-7 CPU s a strategy)
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_padding_and_batch_neighbours_change_nothing(search, trained_copy_model, random_model):
    """A sentence decoded alone gives the same output as inside a batch with longer sentences."""
    def decode_with(model, source):
        if search == "greedy":
            return run(decoding.greedy_decode, model, source, **GREEDY)
        return run(decoding.beam_search, model, source, **BEAM)

    for model in (trained_copy_model[0], random_model):
        batch_tokens, batch_scores = decode_with(model, padded(SOURCES))
        for i, sentence in enumerate(SOURCES):
            alone_tokens, alone_scores = decode_with(model, padded([sentence]))
            width = alone_tokens.shape[-1]
            np.testing.assert_array_equal(alone_tokens[0], batch_tokens[i][..., :width])
            assert np.all(batch_tokens[i][..., width:] == 0)
            np.testing.assert_allclose(alone_scores[0], batch_scores[i], atol=1e-4)


def test_beam_search_scores_at_least_greedy(trained_copy_model):
    """On a trained model, beam search's output scores at least as well as greedy's (and often better)."""
    from keras_transformer.data.synthetic import make_arrays, synthetic_pairs

    model, _ = trained_copy_model
    sources, _ = synthetic_pairs("copy", num_examples=48, vocab_size=32, min_length=3, max_length=10, seed=7)
    source = make_arrays(sources, sources)[0]["source"]
    for alpha in (0.0, 0.6):
        greedy_tokens, _ = run(decoding.greedy_decode, model, source, **GREEDY)
        beam_tokens, beam_scores = run(decoding.beam_search, model, source, **{**BEAM, "alpha": alpha})
        greedy_scores = decoding.score(model, source, greedy_tokens, alpha=alpha).numpy()
        beam_scores = beam_scores[:, 0].numpy()
        np.testing.assert_allclose(decoding.score(model, source, beam_tokens[:, 0], alpha=alpha), beam_scores,
                                   atol=1e-4)
        assert np.all(beam_scores >= greedy_scores - 1e-4), (beam_scores - greedy_scores).min()
        assert np.any(beam_scores > greedy_scores + 1e-3), "beam search never did better than greedy"


@pytest.mark.slow  # both searches run twice, cached and uncached (10 CPU s)
def test_uncached_search_gives_the_same_output(random_model):
    """Greedy and beam search without the key/value cache (every step recomputes the whole prefix) give the
    cached search's tokens and scores: the cache changes nothing but the cost."""
    source = padded(SOURCES)
    for search in (decoding.greedy_decode, decoding.beam_search):
        options = GREEDY if search is decoding.greedy_decode else BEAM
        cached_tokens, cached_scores = run(search, random_model, source, **options)
        plain_tokens, plain_scores = run(search, random_model, source, **options, use_cache=False)
        np.testing.assert_array_equal(cached_tokens, plain_tokens)
        np.testing.assert_allclose(cached_scores, plain_scores, atol=1e-4)


@pytest.mark.parametrize("mode", [pytest.param("graph", marks=pytest.mark.slow), "eager"])
def test_search_through_both_cache_stages_gives_the_same_output(random_model, mode):
    """With a first cache stage of 3 positions every search grows its caches and goes on in a second loop.

    The untrained model's outputs run to their length limits, well past the first stage. The
    outputs must equal the uncached search's, which keeps no cache at all: with unknown shapes
    (graph; the second stage's caches then have a length known only at run time) and eagerly.
    """
    source = padded(SOURCES)
    searches = ((decoding.greedy_decode, GREEDY), (decoding.beam_search, BEAM))
    expected = [run(search, random_model, source, **options, use_cache=False) for search, options in searches]
    assert decoding.cache_stages(14, 3) == [3, 14]
    with pytest.raises(ValueError, match="first_cache_stage"):
        decoding.beam_search(random_model, source, first_cache_stage=0)
    for (search, options), (plain_tokens, plain_scores) in zip(searches, expected):
        options = {**options, "first_cache_stage": 3}
        if mode == "eager":
            tokens, scores = search(random_model, source, **options)
        else:
            graph = tf.function(lambda s, search=search, options=options: search(random_model, s, **options),
                                input_signature=[tf.TensorSpec([None, None], tf.int32)])
            tokens, scores = graph(tf.constant(source))
        assert int(np.sum(np.asarray(plain_tokens) != 0, axis=-1).max()) > 3  # the second stage ran
        np.testing.assert_array_equal(tokens, plain_tokens)
        np.testing.assert_allclose(scores, plain_scores, atol=1e-4)


def test_relative_positions_search_scores_are_the_full_pass_and_padding_changes_nothing():
    """With relative positions a step's query sits at the cache index t and its keys at distances j - t. The
    untrained model's outputs run to their limits (up to 14 tokens, far beyond k = 2), through caches that start
    at 3 positions and grow (the second loop's cache length known only at run time): the scores the cached search
    reports are the teacher-forced full pass's log-probabilities of its outputs (`decoding.score`, no cache), and
    each sentence decodes the same alone as in the padded batch. (Beam search with relative positions:
    test_ctranslate2_export.py, against CTranslate2.)"""
    import keras

    keras.utils.set_random_seed(3)
    model = kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=40, dropout=0.0, num_layers=1,
                                                       position="relative", max_relative_position=2))
    source = padded(SOURCES)
    tokens, scores = run(decoding.greedy_decode, model, source, **GREEDY, first_cache_stage=3)
    assert int(np.sum(np.asarray(tokens) != 0, axis=-1).max()) > 5  # distances beyond k, the second stage ran
    np.testing.assert_allclose(scores, decoding.score(model, source, tokens), atol=1e-4)
    for i, sentence in enumerate(SOURCES):
        alone, _ = run(decoding.greedy_decode, model, padded([sentence]), **GREEDY, first_cache_stage=3)
        np.testing.assert_array_equal(alone[0], np.asarray(tokens[i])[:alone.shape[-1]])


@pytest.mark.parametrize("vocab, k, block", [(8000, 12, 32), (37, 6, 4), (40, 10, 4), (9, 4, 2), (30, 12, 32)])
def test_top_k_by_blocks_equals_a_full_top_k(vocab, k, block):
    """Same values and ids as `tf.math.top_k`, ties (many repeated values) resolved to the lower id alike."""
    rng = np.random.default_rng(vocab + k)
    values = np.concatenate([rng.normal(size=(6, vocab)),                       # distinct values
                             rng.integers(0, 5, size=(6, vocab)).astype(float),  # many ties
                             np.full((1, vocab), 2.0)], 0).astype("float32")     # all equal
    values[0, -1] = 100.0  # the best id in the last (padded) block
    expected_values, expected_ids = tf.math.top_k(values, k)
    top_values, ids = decoding.top_k_by_blocks(values, k, block=block)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(top_values, expected_values)


@pytest.mark.slow
def test_xla_compiled_search_matches_eager(trained_copy_model):
    """Slow: compiles greedy and beam search with XLA, seconds of compilation that no smaller search avoids."""
    model, _ = trained_copy_model
    source = padded(SOURCES)

    @tf.function(jit_compile=True)
    def compiled(source):
        return decoding.greedy_decode(model, source, **GREEDY), decoding.beam_search(model, source, **BEAM)

    (greedy_tokens, greedy_scores), (beam_tokens, beam_scores) = compiled(tf.constant(source))
    eager_greedy = decoding.greedy_decode(model, source, **GREEDY)
    eager_beam = decoding.beam_search(model, source, **BEAM)
    np.testing.assert_array_equal(greedy_tokens, eager_greedy[0])
    np.testing.assert_array_equal(beam_tokens, eager_beam[0])
    np.testing.assert_allclose(greedy_scores, eager_greedy[1], atol=1e-4)
    np.testing.assert_allclose(beam_scores, eager_beam[1], atol=1e-4)


@pytest.mark.slow  # the search traced with unknown shapes and run eagerly (4 CPU s)
def test_graph_with_dynamic_shapes_matches_eager(random_model):
    """One traced graph with unknown batch and length serves every batch (the SavedModel case)."""
    for rows in (SOURCES, SOURCES[:1]):
        graph_tokens, graph_scores = run(decoding.beam_search, random_model, padded(rows), **BEAM)
        eager_tokens, eager_scores = decoding.beam_search(random_model, padded(rows), **BEAM)
        np.testing.assert_array_equal(graph_tokens, eager_tokens)
        np.testing.assert_allclose(graph_scores, eager_scores, atol=1e-4)


@pytest.mark.slow  # searches at several length limits (5 CPU s)
def test_output_length_limits(random_model):
    """At most source length + max_extra tokens per sentence, capped by max_length and the model."""
    source = padded(SOURCES)
    lengths = np.array([len(s) for s in SOURCES])
    for search, options in ((decoding.greedy_decode, GREEDY), (decoding.beam_search, BEAM)):
        tokens, _ = run(search, random_model, source, **options)
        produced = (np.reshape(tokens, (len(SOURCES), -1, tokens.shape[-1])) != 0).sum(-1)
        assert tokens.shape[-1] == source.shape[1] + 5
        assert np.all(produced <= (lengths + 5)[:, None])
        if search is decoding.greedy_decode:  # the untrained model rarely emits eos: most run to their limit
            assert np.sum(produced[:, 0] == lengths + 5) >= 2
        tokens, _ = search(random_model, source[:1], max_extra=50, max_length=3)
        assert tokens.shape[-1] == 3


def test_bad_arguments_are_named(random_model):
    with pytest.raises(ValueError, match="beam_size"):
        decoding.beam_search(random_model, padded(SOURCES), beam_size=0)
    with pytest.raises(ValueError, match="num_return"):
        decoding.beam_search(random_model, padded(SOURCES), beam_size=2, num_return=3)
    with pytest.raises(ValueError, match="max_length"):
        decoding.greedy_decode(random_model, np.ones((1, 200), "int32"))


@pytest.mark.parametrize("search", [decoding.greedy_decode, decoding.beam_search])
def test_negative_max_extra_is_refused(random_model, search):
    """-5 was taken as "5 fewer than the source": one token out, the CLI's `--max-extra` refusing it all along."""
    with pytest.raises(ValueError, match=rf"{search.__name__}: max_extra .* must be >= 0, got -5"):
        search(random_model, padded(SOURCES), max_extra=-5)
    with pytest.raises(ValueError, match="output_limits: max_extra"):
        decoding.output_limits(random_model, padded(SOURCES), max_extra=-1)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -0.5, np.float32("nan")])
def test_alpha_that_is_not_a_finite_non_negative_number_is_refused(random_model, alpha):
    """A NaN alpha made every finished score NaN: the output was empty (`translate --alpha=nan`)."""
    with pytest.raises(ValueError, match=r"beam_search: alpha \(the length-penalty exponent\) must be a finite"):
        decoding.beam_search(random_model, padded(SOURCES), alpha=alpha, max_extra=2)
    with pytest.raises(ValueError, match="score: alpha"):
        decoding.score(random_model, padded(SOURCES), padded(SOURCES), alpha=alpha)


@pytest.mark.parametrize("sources, targets", [(2, 1), (1, 2), (3, 2)])
def test_score_refuses_a_target_batch_of_another_size(random_model, sources, targets):
    """2 sources and 1 target were broadcast into 2 scores (1 and 2 too); 3 and 2 failed inside a matmul."""
    source, target = padded(SOURCES[:3])[:sources], padded(SOURCES[:3])[:targets]
    with pytest.raises(ValueError, match=rf"score: {sources} source sentence\(s\) but {targets} target\(s\)"):
        decoding.score(random_model, source, target)
    with pytest.raises(ValueError, match=rf"score: {sources} source sentence\(s\) but {targets} target\(s\)"):
        decoding.score([random_model, random_model], source, target)


@pytest.mark.parametrize("source, error, message", [
    (np.array([5, 6, 3]), ValueError, r"source must be token ids of shape \(batch, length\), got shape \(3,\)"),
    (tf.zeros((1, 2, 3), tf.int32), ValueError, r"shape \(batch, length\), got shape \(1, 2, 3\)"),
    (np.array([[5.5, 6.0, 3.0]]), TypeError, "integer token ids, got dtype float64"),  # was silently cut to 5
    (np.array([[5, 40, 3]]), ValueError,
     r"ids must be in \[0, 40\) \(the model's vocabulary\), got values from 3 to 40"),
    (np.array([[5, -2, 3]]), ValueError, "got values from -2 to 5"),  # was decoded without a word
])
def test_source_ids_that_are_not_a_batch_of_vocabulary_ids_are_named(random_model, source, error, message):
    for search in (decoding.greedy_decode, decoding.beam_search):
        with pytest.raises(error, match=message):
            search(random_model, source, max_extra=2)
    with pytest.raises(error, match=message):
        decoding.score(random_model, source, np.array([[7, 3, 0]]))
    with pytest.raises(ValueError, match="score: target ids must be in"):
        decoding.score(random_model, np.array([[7, 3]]), np.array([[7, 99, 3]]))


@pytest.fixture(scope="module")
def other_model():
    """A second untrained model over the same 40 tokens, of another shape (post-norm, 1 layer, d_model 32)."""
    import keras

    keras.utils.set_random_seed(7)
    return kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=40, dropout=0.0, norm_first=False,
                                                      num_layers=1, d_model=32, d_ff=64))


def _softmax(logits):
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def test_ensemble_scores_the_mean_of_the_members_distributions(random_model, other_model):
    """An ensemble's forced-decode score is sum_t log(mean_i p_i(y_t)), computed here from each model's own pass."""
    source = padded(SOURCES)
    target = np.random.default_rng(4).integers(4, 40, size=(4, 6)).astype("int32")
    target[:, -1] = 3  # eos
    decoder_input = np.concatenate([np.full((4, 1), 2, "int32"), target[:, :-1]], axis=1)
    mean = np.mean([_softmax(np.asarray(model({"source": source, "target": decoder_input}), "float64"))
                    for model in (random_model, other_model)], axis=0)  # (B, T, V)
    expected = np.log(np.take_along_axis(mean, target[..., None], axis=-1)[..., 0]).sum(axis=1)
    np.testing.assert_allclose(decoding.score([random_model, other_model], source, target), expected, rtol=1e-4)
    alone = decoding.score(random_model, source, target)
    assert np.abs(np.asarray(alone) - expected).max() > 0.1  # the second member does change the scores


@pytest.mark.slow
def test_ensemble_search_scores_are_its_forced_scores(random_model, other_model):
    """Slow: an ensemble's beam, greedy and uncached searches, each scored again by forced decoding."""
    members = [random_model, other_model]
    source = padded(SOURCES)
    tokens, scores = run(decoding.beam_search, members, source, **BEAM)
    flat_tokens = np.reshape(tokens, (-1, tokens.shape[-1]))
    forced = decoding.score(members, np.repeat(source, 4, axis=0), flat_tokens, alpha=0.6)
    np.testing.assert_allclose(np.reshape(scores, -1), forced, atol=1e-4)
    tokens, scores = run(decoding.greedy_decode, members, source, **GREEDY)
    np.testing.assert_allclose(scores, decoding.score(members, source, tokens), atol=1e-4)
    uncached, uncached_scores = decoding.greedy_decode(members, source, use_cache=False, **GREEDY)
    np.testing.assert_array_equal(uncached, tokens)


@pytest.mark.slow  # beam search over one model and over it twice (5 CPU s)
def test_ensemble_of_one_model_twice_is_that_model(trained_copy_model):
    """An ensemble of one model twice decodes as that model: the same tokens, scores within 1e-5."""
    model = trained_copy_model[0] if isinstance(trained_copy_model, tuple) else trained_copy_model
    source = padded(SOURCES)
    tokens, scores = run(decoding.beam_search, model, source, **BEAM)
    twice, twice_scores = run(decoding.beam_search, [model, model], source, **BEAM)
    np.testing.assert_array_equal(twice, tokens)
    np.testing.assert_allclose(twice_scores, scores, atol=1e-5)


def test_ensemble_members_must_agree_on_vocabulary_and_lengths(random_model):
    with pytest.raises(ValueError, match="output vocabulary of 41 but member 0 has 40"):
        decoding.ensemble_members([random_model, kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=41))])
    shorter = kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=40, max_length=64))
    with pytest.raises(ValueError, match="max_length of 64 but member 0 has 128"):
        decoding.beam_search([random_model, shorter], padded(SOURCES))
    with pytest.raises(ValueError, match="at least one model"):
        decoding.greedy_decode([], padded(SOURCES))


def test_length_penalty_formula():
    np.testing.assert_allclose(decoding.length_penalty(np.array([1, 7, 20]), 0.6),
                               ((5 + np.array([1, 7, 20])) / 6) ** 0.6, rtol=1e-6)


def test_decoding_imports_no_tensorflow():
    for path in pathlib.Path(decoding.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert "tensorflow" not in imported, path.name



@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_early_exit_search_is_the_written_out_search(trained_copy_model, reference_search, alpha):
    """With and without `early_exit`, a batch of sentences of different lengths comes back as the written-out
    search (`reference_beam_search`, one sentence at a time over the uncached decoder) gives, n-best and
    scores. (That the rule changes some outputs is shown on the shipped model: tests/test_shipped_models.py.)"""
    model, _ = trained_copy_model
    sources = [[5, 6, 7, 8, 9, 3], [9, 8, 7, 6, 5, 4, 3], [4, 4, 4, 4, 4, 4, 4, 4, 3], [12, 5, 12, 5, 3]]
    steps = {}
    for early_exit in (False, True):
        options = dict(beam_size=3, alpha=alpha, max_extra=4, num_return=3, early_exit=early_exit)
        tokens, scores, batch_steps = run(decoding.beam_search, model, padded(sources), return_steps=True, **options)
        tokens, scores = np.asarray(tokens), np.asarray(scores)
        for row, source in enumerate(sources):
            expected, expected_steps = reference_search(model, source, **options)
            got = [(t[t != 0].tolist(), s) for t, s in zip(tokens[row], scores[row]) if np.isfinite(s)]
            assert [t for t, _ in got] == [t for t, _ in expected], (early_exit, source)
            np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-4)
            # Decoded alone, a sentence runs the written-out search's steps; in the batch, the longest one's.
            *_, alone = run(decoding.beam_search, model, padded([source]), return_steps=True, **options)
            assert int(alone) == expected_steps, (early_exit, source)
            steps[early_exit, row] = expected_steps
        assert int(batch_steps) == max(steps[early_exit, row] for row in range(len(sources)))
    # The early exit never stops a sentence later (this confident model stops as soon either way; the steps
    # it saves on the shipped model: bench/stopping_rules.py).
    assert all(steps[True, row] <= steps[False, row] for row in range(len(sources)))
    # With one beam it is greedy decoding either way.
    greedy, _ = run(decoding.greedy_decode, model, padded(sources), max_extra=4)
    early, _ = run(decoding.beam_search, model, padded(sources), beam_size=1, alpha=0.0, max_extra=4, early_exit=True)
    np.testing.assert_array_equal(np.asarray(early)[:, 0], greedy)


@pytest.mark.slow  # a strategy registered and run through every entry point (4 CPU s)
def test_a_strategy_is_one_class_and_one_registry_line(random_model):
    """A strategy of one's own: a `Strategy` subclass (its settings' checks, n-best default, description and
    search) and one `STRATEGIES.register` line; `DecodeOptions` and `decoding.strategy` (what every engine calls)
    then take it by name, and drop it when it is unregistered."""
    from keras import ops

    from keras_transformer.decoding.registry import STRATEGIES
    from keras_transformer.decoding.strategies import Strategy
    from keras_transformer.errors import ConfigError

    def twice_greedy(models, source, options, pad_id, bos_id, eos_id, first_cache_stage=None, row_keys=None,
                     target_prefix=None):
        tokens, scores = decoding.greedy_decode(models, source, max_extra=options.max_extra, pad_id=pad_id,
                                                bos_id=bos_id, eos_id=eos_id, target_prefix=target_prefix)
        rows = options.returned()
        return ops.repeat(ops.expand_dims(tokens, 1), rows, axis=1), ops.repeat(ops.expand_dims(scores, 1), rows, 1)

    class TwiceGreedy(Strategy):
        name = "twice"
        search = twice_greedy

        @classmethod
        def default_n_best(cls, options):
            return 2

        @classmethod
        def check(cls, options):
            if options.max_extra > 10:
                raise ConfigError(f"decoding.max_extra must be at most 10 with strategy 'twice', got "
                                  f"{options.max_extra}.")

    STRATEGIES.register("twice", TwiceGreedy)
    try:
        options = decoding.DecodeOptions(strategy="sample", top_k=5).replace(strategy="twice", max_extra=5)
        assert (options.top_k, options.returned(), options.sampling) == (0, 2, False)  # sample's setting reset
        assert options.describe() == "twice: max_extra 5"
        with pytest.raises(ConfigError, match="^max_extra must be at most 10 with strategy 'twice'"):
            options.replace(max_extra=11)  # named as the keyword given
        with pytest.raises(ConfigError, match="decoding.top_k applies to strategy 'sample' only"):
            decoding.DecodeOptions(strategy="twice", top_k=5, max_extra=5)
        source = padded(SOURCES)
        tokens, scores = decoding.strategy("twice")([random_model], source, options, pad_id=0, bos_id=2, eos_id=3)
        greedy, greedy_scores = decoding.strategy("greedy")([random_model], source, options.replace(
            strategy="greedy"), pad_id=0, bos_id=2, eos_id=3)
        assert tuple(tokens.shape)[:2] == (len(SOURCES), 2)
        for row in range(2):
            np.testing.assert_array_equal(tokens[:, row], greedy[:, 0])
            np.testing.assert_allclose(scores[:, row], greedy_scores[:, 0])
    finally:
        STRATEGIES.unregister("twice")
    with pytest.raises(ConfigError, match="decoding.strategy must be one of beam, greedy, sample, got 'twice'"):
        decoding.DecodeOptions(strategy="twice")


@pytest.mark.parametrize("default", ["greedy", "beam", "sample"])
def test_decode_options_a_strategys_own_setting_chooses_it(default):
    """Given settings (a flag, a request's field, a Python keyword: all go through `DecodeOptions.replace`) choose
    the strategy that reads them, whatever the model's default; the shared ones (n_best, max_extra) choose none."""
    model = decoding.DecodeOptions(strategy=default)
    beam = model.replace(beam_size=3, alpha=0.0)
    assert (beam.strategy, beam.beam_size, beam.alpha, beam.returned()) == ("beam", 3, 0.0, 3)
    assert model.replace(early_exit=True).strategy == "beam"
    assert model.replace(n_best=3, beam_size=3).returned() == 3  # beam search's 3 hypotheses
    sampled = model.replace(top_p=0.5)
    assert (sampled.strategy, sampled.top_p) == ("sample", 0.5)
    assert model.replace(seed=3).strategy == "sample"
    assert model.replace(max_extra=7).strategy == default and model.replace(n_best=1).strategy == default
    assert model.replace(strategy="greedy").strategy == "greedy"


@pytest.mark.parametrize("given, message", [
    (dict(strategy="greedy", beam_size=4), "beam_size belongs to strategy 'beam' and strategy is 'greedy': give one"),
    (dict(strategy="sample", alpha=0.0), "alpha belongs to strategy 'beam' and strategy is 'sample'"),
    (dict(strategy="beam", top_k=5), "top_k belongs to strategy 'sample' and strategy is 'beam'"),
    (dict(early_exit=True, temperature=0.5), "early_exit belongs to strategy 'beam' and temperature to strategy "
                                            "'sample': give one strategy's settings."),
    (dict(n_best=4), "n_best must be 1 with strategy 'greedy' (one hypothesis), got 4: beam search returns several "
                     "(strategy 'beam', beam_size >= 4)."),
    (dict(beam_size=2, n_best=3), "n_best=3 is more than beam_size=2"),
    (dict(beam_size=0), "beam_size must be an integer >= 1, got 0."),
])
def test_decode_options_refusals_name_the_settings_as_they_were_given(given, message):
    """A refusal names the fields as the caller gave them: Python keywords and JSON fields as such, the command
    line's flags by `named` (never the config's `decoding.` keys), and never points to sampling for n-best."""
    from keras_transformer.cli.arguments import DECODING_FLAGS
    from keras_transformer.decoding.options import DecodeSettingsError
    with pytest.raises(DecodeSettingsError) as error:
        decoding.DecodeOptions(strategy="greedy").replace(**given)
    assert message in str(error.value) and "decoding." not in str(error.value)
    flagged = error.value.named(DECODING_FLAGS)
    assert all(DECODING_FLAGS[field] in flagged for field in given) and "decoding." not in flagged
    if set(given) == {"n_best"}:  # several hypotheses: beam search is what fits
        assert "--beam-size >= 4" in flagged and "sampl" not in flagged
