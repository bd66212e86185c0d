"""Sampling: its random draws, the distribution it samples, its top-k and top-p cuts, and its reproducibility."""

import functools
import math

import numpy as np
import pytest
import tensorflow as tf
from factories import sampling_uniform, tiny_config

import keras_transformer as kt
from keras_transformer import decoding
from keras_transformer.decoding import sampling
from keras_transformer.model import decode, encode

# Its module fixtures and traced translators are shared by its tests: `make test` (--dist loadgroup) runs the
# whole file on one worker, so they are built once.
pytestmark = pytest.mark.xdist_group("test_sampling")

VOCAB = 16
# Sources of different lengths (tokens then eos 3), padded with 0.
SOURCES = [[5, 6, 7, 3], [8, 9, 10, 11, 12, 13, 3], [14, 3], [4, 15, 6, 7, 8, 3]]
# Every cut active, several samples per sentence: the settings most tests sample with.
OPTIONS = dict(top_k=8, top_p=0.9, temperature=1.3, seed=11, num_return=3, max_extra=4)


def padded(rows, width=None):
    width = width or max(len(r) for r in rows)
    return np.array([r + [0] * (width - len(r)) for r in rows], "int32")


@pytest.fixture(scope="module")
def model():
    """An untrained tiny model of one layer per side (dropout off) over 16 ids: its first-token distribution is
    far from uniform and its outputs run to their length limits, so samples differ from one another."""
    import keras

    keras.utils.set_random_seed(1)
    return kt.build_model(tiny_config(vocab_size=VOCAB, dropout=0.0, norm_first=True))


@pytest.fixture(scope="module")
def eager_samples(model):
    """`sample(model, SOURCES, **OPTIONS)` run eagerly: what the other execution modes must give."""
    tokens, scores = decoding.sample(model, padded(SOURCES), **OPTIONS)
    return tokens.numpy(), scores.numpy()


def next_token_log_probs(model, source, prefixes):
    """The model's log P(next token | source, prefix) after every prefix position, by one teacher-forced pass
    (not the cached search): `source (B, S)`, `prefixes (B, T)` starting with bos -> float64 `(B, T, V)`."""
    memory, source_padding = encode(model, source, 0)
    logits = np.asarray(decode(model, prefixes, memory, source_padding), "float64")
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def sampled_distribution(log_probs, top_k=0, top_p=1.0, temperature=1.0):
    """What sampling should draw from, in numpy: pad (0) and bos (2) removed, tempered, cut, renormalised."""
    logits = np.array(log_probs, "float64") / temperature
    logits[..., [0, 2]] = -np.inf
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, -1)
    before = np.cumsum(ranked, -1) - ranked
    keep = (before < top_p) | (np.arange(probs.shape[-1]) == 0)
    if top_k:
        keep &= np.arange(probs.shape[-1]) < top_k
    kept = np.zeros_like(probs)
    np.put_along_axis(kept, order, np.where(keep, ranked, 0.0), -1)
    return kept / kept.sum(-1, keepdims=True), before


def chi_square_p_value(statistic, dof):
    """P(chi2(dof) >= statistic): scipy's where installed, else the Wilson-Hilferty normal approximation."""
    try:
        from scipy.stats import chi2
        return float(chi2.sf(statistic, dof))
    except ImportError:
        z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
        return 0.5 * math.erfc(z / math.sqrt(2))


def test_draws_are_the_counter_hash_in_every_execution_mode():
    """The uniform numbers are numpy's copy of the hash bit for bit, eagerly and under XLA (JAX:
    test_jax_backend.py), for seeds and keys up to 2**31 - 1; and they are uniform over [0, 1)."""
    seed = np.array([0, 1, 2**31 - 1], "int32")[:, None, None, None]
    keys = np.array([0, 1, 2, 977, 2**31 - 1], "int32")[None, :, None, None]
    samples = np.arange(3, dtype="int32")[None, None, :, None]
    steps = np.arange(40, dtype="int32")[None, None, None, :]
    expected = sampling_uniform(seed, keys, samples, steps)
    eager = sampling.uniform(seed, keys, samples, steps).numpy()
    compiled = tf.function(sampling.uniform, jit_compile=True)(seed, keys, samples, steps).numpy()
    np.testing.assert_array_equal(eager, expected.astype("float32"))
    np.testing.assert_array_equal(compiled, eager)
    many = sampling_uniform(3, np.arange(4096)[:, None], 0, np.arange(16)).ravel()  # 65,536 draws, 16 bins
    counts = np.bincount((many * 16).astype(int), minlength=16)
    statistic = float(((counts - many.size / 16) ** 2 / (many.size / 16)).sum())
    assert chi_square_p_value(statistic, 15) > 1e-4, counts


def test_near_zero_temperature_and_top_k_one_are_greedy(model):
    """Both leave one token to draw, the most probable: every sample is greedy decoding's output, with its score
    (to float rounding: two rows per sentence multiply matrices of another shape)."""
    source = padded(SOURCES)
    greedy_tokens, greedy_scores = decoding.greedy_decode(model, source, max_extra=4)
    for settings in (dict(temperature=1e-4), dict(top_k=1, temperature=1.7)):
        tokens, scores = decoding.sample(model, source, num_return=2, max_extra=4, seed=5, **settings)
        for r in range(2):
            np.testing.assert_array_equal(tokens[:, r], greedy_tokens)
            np.testing.assert_allclose(scores[:, r], greedy_scores, rtol=0, atol=1e-5)


def test_seeded_samples_repeat_and_do_not_depend_on_the_batch(model, eager_samples):
    """A sentence sampled alone or in a reordered, wider-padded batch gets the samples it got in the first batch
    (its row key is a hash of its ids: `source_keys`); another seed other samples. Scores are forced-decoding
    scores, and a sentence's samples differ from one another."""
    tokens, scores = eager_samples  # sampled again by the registry's test below, and under XLA
    order = [2, 0, 3, 1]
    shuffled, shuffled_scores = decoding.sample(model, padded([SOURCES[i] for i in order], width=9), **OPTIONS)
    np.testing.assert_array_equal(shuffled[:, :, :tokens.shape[-1]], tokens[order])
    np.testing.assert_allclose(shuffled_scores, scores[order], atol=1e-5)
    alone, alone_scores = decoding.sample(model, padded([SOURCES[2]]), **OPTIONS)
    np.testing.assert_array_equal(alone[0], tokens[2, :, :alone.shape[-1]])
    assert np.all(tokens[2, :, alone.shape[-1]:] == 0)
    np.testing.assert_allclose(alone_scores[0], scores[2], atol=1e-5)

    other, _ = decoding.sample(model, padded(SOURCES), **{**OPTIONS, "seed": 12})
    assert not np.array_equal(other, tokens)
    for hypotheses in tokens.tolist():
        assert len({tuple(h) for h in hypotheses}) > 1, "a sentence's samples are independent draws"
    forced = decoding.score(model, np.repeat(padded(SOURCES), 3, axis=0), tokens.reshape(12, -1), alpha=0.0)
    np.testing.assert_allclose(scores.reshape(-1), forced, atol=1e-4)


@pytest.mark.slow  # an XLA compilation of the search: about 5 CPU seconds
def test_xla_with_the_settings_as_tensors_equals_eager_with_numbers(model, eager_samples):
    """The export's case: one compiled search takes top_k, top_p, temperature and seed as run-time scalars and
    gives what eager sampling with those numbers gives, for two sets of values (none baked in at tracing)."""
    scalars = [tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32),
               tf.TensorSpec([], tf.int32)]

    @tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None, None], tf.int32), *scalars])
    def compiled(source, top_k, top_p, temperature, seed):
        return decoding.sample(model, source, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed,
                               num_return=3, max_extra=4)

    settings = {name: OPTIONS[name] for name in ("top_k", "top_p", "temperature", "seed")}
    tokens, scores = compiled(tf.constant(padded(SOURCES)), *settings.values())
    np.testing.assert_array_equal(tokens, eager_samples[0])
    np.testing.assert_allclose(scores, eager_samples[1], atol=1e-5)

    plain = dict(top_k=0, top_p=1.0, temperature=1.0, seed=2**31 - 1)
    tokens, scores = compiled(tf.constant(padded(SOURCES)), *plain.values())
    expected_tokens, expected_scores = decoding.sample(model, padded(SOURCES), num_return=3, max_extra=4, **plain)
    np.testing.assert_array_equal(tokens, expected_tokens)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)


def reference_draw(log_probs, u, top_k, top_p, temperature):
    """What `choose_tokens` draws, in float64 numpy with a sort: the ids ranked (values descending, ties by the
    lower id), the cuts, then the first rank whose cumulative kept mass exceeds u * the kept mass. Also returns
    how far each row's draw and nucleus lie from a boundary, relative to the mass (where float32 rounding may
    choose the neighbour)."""
    values = np.asarray(log_probs, "float64") / max(temperature, 1e-6)
    tokens, margins = [], []
    for row, draw in zip(values, u):
        order = np.lexsort((np.arange(row.size), -row))
        probs = np.exp(row[order] - row[order[0]])
        before = np.cumsum(probs) - probs
        keep = (np.arange(row.size) < top_k) | (top_k <= 0)
        keep &= (before < top_p * probs.sum()) | (top_p >= 1.0)
        keep[0] = True
        kept = np.where(keep, probs, 0.0)
        cumulative = np.cumsum(kept)
        target = draw * cumulative[-1]
        tokens.append(order[min(int(np.sum(cumulative <= target)), int(np.flatnonzero(kept > 0)[-1]))])
        margin = np.min(np.abs(cumulative - target)) / cumulative[-1]
        if 0.0 < top_p < 1.0:
            margin = min(margin, np.min(np.abs(before - top_p * probs.sum())) / probs.sum())
        margins.append(margin)
    return np.array(tokens), np.array(margins)


@pytest.mark.slow  # every cut of a 3,000-id draw against a float64 sort (6 CPU s)
@pytest.mark.parametrize("sort", [False, True], ids=["bisection", "sort"])
@pytest.mark.parametrize("vocab", [16, 3000])
def test_the_draw_is_the_inverse_cdf_over_the_sorted_tokens(vocab, sort):
    """`choose_tokens`, by bisection over the values' order (`sample`'s way where it is traced) and by sort (its
    way run eagerly on TensorFlow), draws what a float64 sort draws, for every cut, with ties and excluded ids,
    with Python settings eagerly and traced and with tensor settings compiled: every row whose draw lies clear of
    a boundary (more than 1e-5 of the mass away) gets the reference's token."""
    rng = np.random.default_rng(vocab)
    rows = 64
    logits = (rng.standard_normal((rows, vocab)) * rng.choice([0.5, 3.0], (rows, 1))).astype("float32")
    logits[::4] = np.round(logits[::4])  # many exact ties
    logits[:, rng.integers(0, vocab, 3)] += 6.0  # a few probable ids, as after training
    log_probs = tf.nn.log_softmax(logits).numpy()
    log_probs[:, [0, 2]] = -np.inf
    u = rng.random(rows).astype("float32")
    compiled = tf.function(functools.partial(sampling.choose_tokens, sort=sort), jit_compile=True)
    cases = [(0, 1.0, 1.0), (5, 1.0, 0.7), (0, 0.8, 1.3), (3, 0.5, 1.0), (1, 1.0, 1.0), (0, 0.0, 1.0),
             (vocab + 5, 0.95, 2.0), (-1, 1.0, 0.0)]
    checked = 0
    for top_k, top_p, temperature in cases:
        expected, margins = reference_draw(log_probs, u, top_k, top_p, temperature)
        clear = margins > 1e-5
        eager = np.asarray(sampling.choose_tokens(log_probs, u, top_k, top_p, temperature, sort=sort))
        tensors = compiled(log_probs, u, tf.constant(top_k), tf.constant(top_p, tf.float32),
                           tf.constant(temperature, tf.float32)).numpy()
        traced = tf.function(lambda values, draws: sampling.choose_tokens(values, draws, top_k, top_p, temperature,
                                                                          sort=sort))
        for name, tokens in (("eager", eager), ("compiled", tensors), ("traced", traced(log_probs, u).numpy())):
            wrong = np.flatnonzero(clear & (tokens != expected))
            assert wrong.size == 0, (name, top_k, top_p, temperature, wrong[:5], tokens[wrong[:5]], expected[wrong[:5]])
        assert np.all(np.isin(eager, np.flatnonzero(np.isfinite(log_probs[0]))))  # never an excluded id
        checked += int(clear.sum())
    assert checked > 0.9 * rows * len(cases)


@pytest.mark.parametrize("settings", [dict(), dict(temperature=0.6, top_k=6), dict(top_p=0.7)],
                         ids=["temperature 1", "temperature 0.6, top_k 6", "top_p 0.7"])
def test_first_token_frequencies_match_the_model_distribution(settings, model):
    """4,000 samples of one sentence's first token (row keys 0..3999, one search) against the model's softmax
    from a teacher-forced pass, tempered and cut in numpy, pad and bos removed: no token outside the cut is
    ever drawn, and the counts pass a chi-square test (bins of expected count < 5 merged) at p > 1e-4."""
    draws = 4000
    source = padded([SOURCES[0]])
    tokens, _ = decoding.sample(model, np.repeat(source, draws, axis=0), seed=3, max_length=1,
                                row_keys=np.arange(draws), **settings)  # one sentence, `draws` streams
    counts = np.bincount(np.asarray(tokens).ravel(), minlength=VOCAB)
    log_probs = next_token_log_probs(model, source, np.array([[2]], "int32"))[0, 0]
    expected, before = sampled_distribution(log_probs, **settings)
    if "top_p" in settings:  # the cut is clear of a boundary, so float rounding cannot move it
        assert np.min(np.abs(np.sort(before) - settings["top_p"])) > 1e-3
    outside = np.flatnonzero((expected == 0) & (counts > 0))
    assert outside.size == 0, f"drew tokens {outside.tolist()} outside the cut {np.flatnonzero(expected).tolist()}"
    expected = expected * draws
    support = np.flatnonzero(expected > 0)
    big = support[expected[support] >= 5]
    small = support[expected[support] < 5]
    observed_bins = [*counts[big], counts[small].sum()] if small.size else list(counts[big])
    expected_bins = [*expected[big], expected[small].sum()] if small.size else list(expected[big])
    observed_bins, expected_bins = np.array(observed_bins, "float64"), np.array(expected_bins)
    statistic = float(((observed_bins - expected_bins) ** 2 / expected_bins).sum())
    p_value = chi_square_p_value(statistic, len(expected_bins) - 1)
    assert p_value > 1e-4, (statistic, p_value, observed_bins.tolist(), np.round(expected_bins, 1).tolist())


@pytest.mark.parametrize("settings", [dict(top_p=0.5), dict(top_k=3)])
def test_every_sampled_token_lies_inside_the_cut_of_its_step(settings, model):
    """Not only the first token: each token of 64 samples is inside the nucleus (or the top k) of the model's
    distribution after its own prefix, computed by a teacher-forced pass and numpy."""
    source = np.repeat(padded([SOURCES[1]]), 16, axis=0)
    tokens, _ = decoding.sample(model, source, seed=9, num_return=4, max_extra=2, **settings)
    tokens = np.asarray(tokens).reshape(64, -1)
    prefixes = np.concatenate([np.full((64, 1), 2, "int32"), tokens[:, :-1]], axis=1)
    log_probs = next_token_log_probs(model, np.repeat(source, 4, axis=0), prefixes)  # (64, T, V)
    real = tokens != 0
    if "top_p" in settings:  # the nucleus with a little slack for float32 rounding at its boundary
        allowed = sampled_distribution(log_probs, top_p=settings["top_p"] + 1e-5)[0] > 0
    else:
        allowed = sampled_distribution(log_probs, **settings)[0] > 0
    inside = np.take_along_axis(allowed, tokens[..., None], -1)[..., 0]
    assert real.sum() > 200 and np.all(inside | ~real), np.argwhere(~inside & real)[:5].tolist()
    assert len(set(tokens[:, 0].tolist())) > 1, "the cut left more than one token to draw from"


def test_ensemble_samples_score_as_the_ensemble(model):
    """An ensemble samples from the members' mean distribution: its scores are the ensemble's forced scores."""
    import keras

    keras.utils.set_random_seed(2)
    other = kt.build_model(tiny_config(vocab_size=VOCAB, dropout=0.0))
    tokens, scores = decoding.sample([model, other], padded(SOURCES), seed=4, max_extra=3)
    forced = decoding.score([model, other], padded(SOURCES), tokens[:, 0], alpha=0.0)
    np.testing.assert_allclose(scores[:, 0], forced, atol=1e-4)


@pytest.mark.parametrize("name, value", [("top_k", -1), ("top_k", 2.5), ("top_p", 0.0), ("top_p", 1.5),
                                         ("temperature", 0.0), ("temperature", float("inf")), ("seed", -1),
                                         ("seed", 2**31), ("num_return", 0)])
def test_bad_settings_are_refused_by_name(name, value, model):
    with pytest.raises(ValueError, match=f"sample: {name} "):
        decoding.sample(model, padded(SOURCES), **{name: value})


def test_sample_is_the_registered_strategy(model, eager_samples):
    """`DecodeOptions(strategy="sample")` reaches `sample` through the registry with its settings and n_best."""
    options = decoding.DecodeOptions(strategy="sample", top_k=8, top_p=0.9, temperature=1.3, seed=11,
                                        n_best=3, max_extra=4)
    tokens, scores = decoding.strategy("sample")([model], padded(SOURCES), options, pad_id=0, bos_id=2, eos_id=3)
    np.testing.assert_array_equal(tokens, eager_samples[0])
    np.testing.assert_array_equal(scores, eager_samples[1])
