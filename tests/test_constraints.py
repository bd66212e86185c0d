"""Lexical constraints and glossaries: phrases every output contains, phrases none contains, glossary files."""

import itertools
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import decoding
from keras_transformer.decoding.constraints import Phrases, constraints_met, frames_with_history, pad_constraints
from keras_transformer.decoding.glossary import Glossary, term_ids
from keras_transformer.errors import ConfigError

pytestmark = pytest.mark.xdist_group("test_constraints")

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEAM = dict(beam_size=4, alpha=0.6, max_extra=6, num_return=2)

# Copy-task sources (the trained model copies them), and constraints per sentence: one token, two tokens, two
# constraints, tokens the copy model never produces for that source, a phrase given twice.
SOURCES = [[5, 6, 7, 8, 3], [9, 10, 11, 3], [12, 13, 14, 15, 16, 3], [17, 18, 3], [20, 21, 22, 3]]
CONSTRAINTS = [[[30]], [[25, 26]], [[7, 8], [28]], [[29, 31]], [[24], [24]]]


def padded(rows, width=None):
    width = width or max(len(r) for r in rows)
    return np.array([r + [0] * (width - len(r)) for r in rows], "int32")


_GRAPHS = {}


def run(search, model, source, constraints=None, **options):
    """`search(model, source, constraints=..., **options)` in one tf.function per (search, model, options), with
    dynamic shapes (the batch, the source length and every constraints axis)."""
    key = (search.__name__, id(model), constraints is None, tuple(sorted(options.items())))
    if key not in _GRAPHS:
        if constraints is None:
            _GRAPHS[key] = tf.function(lambda s: search(model, s, **options),
                                       input_signature=[tf.TensorSpec([None, None], tf.int32)])
        else:
            _GRAPHS[key] = tf.function(lambda s, c: search(model, s, constraints=c, **options),
                                       input_signature=[tf.TensorSpec([None, None], tf.int32),
                                                        tf.TensorSpec([None, None, None, None], tf.int32)])
    if constraints is None:
        return _GRAPHS[key](tf.constant(source, tf.int32))
    return _GRAPHS[key](tf.constant(source, tf.int32), tf.constant(pad_constraints(constraints, forms=True)))


def occurrences(tokens, phrase):
    """How often `phrase` occurs in the list `tokens` (overlapping occurrences counted)."""
    return sum(tokens[i:i + len(phrase)] == list(phrase) for i in range(len(tokens) - len(phrase) + 1))


def output(row):
    """A hypothesis's tokens up to and with eos, as a list."""
    row = [int(t) for t in row if t != 0]
    return row[:row.index(3) + 1] if 3 in row else row


@pytest.fixture(scope="module")
def random_model():
    """An untrained tiny model (dropout off): flat distributions, outputs that run to their limits."""
    import keras

    keras.utils.set_random_seed(1)
    return kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=40, dropout=0.0, norm_first=True))


@pytest.fixture(scope="module")
def constrained(trained_copy_model):
    """The trained copy model's beam search of `SOURCES` with `CONSTRAINTS` and without, in one batch."""
    model, _ = trained_copy_model
    tokens, scores = run(decoding.beam_search, model, padded(SOURCES), CONSTRAINTS, **BEAM)
    free, free_scores = run(decoding.beam_search, model, padded(SOURCES), **BEAM)
    return np.asarray(tokens), np.asarray(scores), np.asarray(free), np.asarray(free_scores)


def test_every_constraint_appears_and_scores_are_the_model_s(trained_copy_model, constrained):
    model, _ = trained_copy_model
    tokens, scores, free, _ = constrained
    for row, (source, wanted) in enumerate(zip(SOURCES, CONSTRAINTS)):
        best = output(tokens[row, 0])
        assert best[-1] == 3, best  # ended by eos, not cut
        for phrase in wanted:
            assert occurrences(best, phrase) >= wanted.count(phrase), (best, wanted)
        assert not all(occurrences(output(free[row, 0]), phrase) for phrase in wanted)  # the model lacks them
    assert np.asarray(constraints_met(tokens, CONSTRAINTS)).all()
    # The scores are log P / lp of the returned tokens, as forced decoding gives them.
    forced = decoding.score(model, np.repeat(padded(SOURCES), 2, axis=0), tokens.reshape(10, -1), alpha=0.6)
    np.testing.assert_allclose(scores.reshape(-1), forced, atol=1e-4)


def test_a_phrase_given_twice_appears_twice(constrained):
    tokens = constrained[0]
    assert occurrences(output(tokens[4, 0]), [24]) == 2
    met = np.asarray(constraints_met(np.array([[24, 5, 3]]), [[[24], [24]]]))
    assert met.tolist() == [[True, False]]  # one occurrence meets one of the two


@pytest.mark.slow  # each sentence searched alone and in the batch, two models (5 CPU s)
@pytest.mark.parametrize("fixture", ["trained_copy_model", "random_model"])
def test_batch_mates_and_their_constraints_change_nothing(fixture, trained_copy_model, random_model, constrained):
    """Each sentence decoded alone, with only its own constraints (other shapes: fewer slots, shorter phrases),
    gives what it gave in the batch: on the trained model and on an untrained one (whose outputs run to the
    limit and end unmet as often as not)."""
    if fixture == "trained_copy_model":
        model, (tokens, scores) = trained_copy_model[0], constrained[:2]
    else:
        model = random_model
        tokens, scores = run(decoding.beam_search, model, padded(SOURCES), CONSTRAINTS, **BEAM)
    tokens, scores = np.asarray(tokens), np.asarray(scores)
    for row in (0, 2, 4):
        alone, alone_scores = run(decoding.beam_search, model, padded([SOURCES[row]]), [CONSTRAINTS[row]], **BEAM)
        width = alone.shape[-1]
        np.testing.assert_array_equal(alone[0], tokens[row][..., :width])
        np.testing.assert_allclose(alone_scores[0], scores[row], atol=1e-4)


def test_a_sentence_without_constraints_gets_the_unconstrained_search(trained_copy_model, random_model,
                                                                       constrained):
    """Beside constrained batch-mates, a sentence with no constraint (a row of padding) comes out exactly as
    the search without any constraints gives it."""
    tokens, scores, free, free_scores = constrained
    model, _ = trained_copy_model
    mixed = [CONSTRAINTS[0], [], CONSTRAINTS[2], [], []]
    got, got_scores = run(decoding.beam_search, model, padded(SOURCES), mixed, **BEAM)
    for row in (1, 3, 4):
        np.testing.assert_array_equal(got[row], free[row])
        np.testing.assert_allclose(got_scores[row], free_scores[row], atol=1e-5)
    np.testing.assert_array_equal(got[0], tokens[0])
    free, _ = run(decoding.beam_search, random_model, padded(SOURCES), **BEAM)
    got, _ = run(decoding.beam_search, random_model, padded(SOURCES), [[]] * len(SOURCES), **BEAM)
    np.testing.assert_array_equal(got, free)


@pytest.mark.slow  # the constrained search three ways (7 CPU s)
def test_cache_stages_and_the_uncached_search_give_the_same_constrained_output(random_model):
    """The untrained model's outputs run past a first cache stage of 3 positions: the caches grow mid-search and
    the constrained search reorders them by its own choice of parents; the output equals the uncached search's,
    which keeps no cache at all."""
    source = padded(SOURCES)  # eagerly: each search runs once (a trace costs more than its few steps)
    plain, plain_scores = decoding.beam_search(random_model, source, **BEAM, constraints=CONSTRAINTS, use_cache=False)
    staged, staged_scores = decoding.beam_search(random_model, source, **BEAM, constraints=CONSTRAINTS,
                                                 first_cache_stage=3)
    assert int(np.sum(np.asarray(plain) != 0, axis=-1).max()) > 3
    np.testing.assert_array_equal(staged, plain)
    np.testing.assert_allclose(staged_scores, plain_scores, atol=1e-4)


def test_a_partial_match_that_diverges_falls_back_to_the_prefix_that_re_occurs(trained_copy_model):
    """The copy of 5 5 5 6 holds 5 5 6 only after a partial match (5 5) meets another 5: the search must see
    the constraint met there and force nothing else; with early exit as well."""
    model, _ = trained_copy_model
    source = padded([[5, 5, 5, 6, 3], [9, 10, 11, 3]])
    free, _ = run(decoding.beam_search, model, source, **BEAM)
    best = output(np.asarray(free)[0, 0])
    assert best[:3] == [5, 5, 5] and occurrences(best, [5, 5, 6]), best  # 5 5 6 comes after 5 5 5
    constraints = [[[5, 5, 6]], [[10, 11, 9]]]
    for tokens in (run(decoding.beam_search, model, source, constraints, **BEAM)[0],
                   decoding.beam_search(model, source, **BEAM, constraints=constraints, early_exit=True)[0]):
        tokens = np.asarray(tokens)
        np.testing.assert_array_equal(tokens[0, 0], np.asarray(free)[0, 0])
        assert occurrences(output(tokens[1, 0]), [10, 11, 9]), tokens[1, 0]


def test_a_constraint_that_cannot_fit_is_left_out_and_reported(trained_copy_model, constrained):
    """A 10-token constraint for a sentence that may produce 9 tokens: the unconstrained translation, reported as
    unmet; a constraint that fits beside it is still met (the shortest are kept first)."""
    model, _ = trained_copy_model
    source = padded([SOURCES[3]])  # 3 tokens + max_extra 6: at most 9 output tokens
    too_long = [list(range(4, 14))]
    free, free_scores = run(decoding.beam_search, model, source, **BEAM)
    tokens, scores = run(decoding.beam_search, model, source, [too_long], **BEAM)
    np.testing.assert_array_equal(tokens, free)
    np.testing.assert_allclose(scores, free_scores, atol=1e-5)
    assert np.asarray(constraints_met(tokens, [too_long])).tolist() == [[[False], [False]]]
    tokens, _ = run(decoding.beam_search, model, source, [too_long + [[30]]], **BEAM)
    assert np.asarray(constraints_met(tokens, [too_long + [[30]]]))[0, 0].tolist() == [False, True]
    assert 30 in output(tokens[0, 0])


@pytest.mark.slow  # many random constrained searches (7 CPU s)
def test_constraints_that_fit_are_always_met_even_by_a_model_that_never_would(random_model):
    """The untrained model's outputs are noise, so nothing but the search puts the phrases in: random constraints
    (1 to 4 phrases of 1 to 3 tokens, repeated tokens and repeated phrases included) filling up to the whole
    length limit are all met by each sentence's best hypothesis."""
    rng = np.random.default_rng(0)
    sources = SOURCES * 3
    constraints = []
    for source in sources:
        room = len(source) + BEAM["max_extra"]
        phrases = []
        for _ in range(rng.integers(1, 5)):
            phrase = rng.integers(4, 12, size=rng.integers(1, 4)).tolist()  # few ids: repeats and overlaps
            if sum(map(len, phrases)) + len(phrase) <= room:
                phrases.append(phrase)
        constraints.append(phrases)
    constraints[0] = [[5, 5], [5, 5], [5]]  # the same phrase twice, and a phrase inside it
    tokens, _ = run(decoding.beam_search, random_model, padded(sources), constraints, **BEAM)
    met = np.asarray(constraints_met(tokens, constraints))
    assert met[:, 0].all(), [(c, output(t)) for c, t, m in zip(constraints, np.asarray(tokens)[:, 0], met[:, 0])
                             if not m.all()]
    assert occurrences(output(np.asarray(tokens)[0, 0]), [5, 5]) >= 2


def test_an_output_cut_by_the_limit_before_meeting_its_constraints_is_still_returned(random_model):
    """The untrained model never ends by itself: with a limit of 4 tokens and constraints of 4 tokens in all,
    every hypothesis meets them exactly at the limit or is returned after those that do, never empty."""
    source = padded([[5, 6, 3]])
    constraints = [[[11, 12], [13, 14]]]
    tokens, scores = decoding.beam_search(random_model, source, beam_size=3, num_return=3, max_extra=1,
                                          constraints=constraints)
    tokens, met = np.asarray(tokens), np.asarray(constraints_met(tokens, constraints))
    assert met[0, 0].all()  # the best meets both
    assert np.all(np.isfinite(scores)) and np.all((tokens != 0).sum(-1) == 4)
    order = [bool(row.all()) for row in met[0]]
    assert order == sorted(order, reverse=True)  # those that meet all come first


def test_alternative_forms_any_one_satisfies(trained_copy_model):
    """A constraint of two forms: one the model produces anyway is enough; otherwise one of them is put in."""
    model, _ = trained_copy_model
    either = [[[[6], [30]]], [[[31], [29, 30]]]]
    tokens, _ = decoding.beam_search(model, padded(SOURCES[:2]), constraints=pad_constraints(either, forms=True),
                                     **BEAM)
    free, _ = decoding.beam_search(model, padded(SOURCES[:2]), **BEAM)
    np.testing.assert_array_equal(tokens[0, 0], free[0, 0])  # "6" is in the copy already: nothing forced
    second = output(np.asarray(tokens)[1, 0])
    assert occurrences(second, [31]) or occurrences(second, [29, 30]), second


@pytest.mark.slow  # greedy and beam searches with constraints compared (3 CPU s)
def test_greedy_with_constraints_is_beam_one_and_sampling_refuses(trained_copy_model):
    """Greedy decoding with constraints is beam search of width 1 with them, its scores the forced scores, every
    constraint met; sampling refuses constraints in one line."""
    model, _ = trained_copy_model
    source = padded(SOURCES)
    tokens, scores = decoding.greedy_decode(model, source, max_extra=6, constraints=CONSTRAINTS)
    beam, beam_scores = decoding.beam_search(model, source, beam_size=1, alpha=0.0, max_extra=6,
                                             constraints=CONSTRAINTS)
    np.testing.assert_array_equal(tokens, np.asarray(beam)[:, 0])
    np.testing.assert_allclose(scores, decoding.score(model, source, tokens), atol=1e-4)
    assert np.asarray(constraints_met(tokens, CONSTRAINTS)).all()
    with pytest.raises(ConfigError, match=r"sample: constraints \(phrases every output must contain\) need "
                                          "strategy 'beam' or 'greedy'"):
        decoding.sample(model, source, constraints=CONSTRAINTS)


BANNED = [[[6, 7], [8]], [[10]], [[13, 14], [16]], [], [[20, 21]]]


@pytest.mark.parametrize("strategy", ["beam", "greedy", "sample"])
def test_banned_phrases_never_appear(trained_copy_model, strategy):
    """The copy model would produce every banned phrase; with the bans none appears (a one-token phrase
    nowhere, a longer one never whole), and the scores stay the model's log-probabilities."""
    model, _ = trained_copy_model
    source = padded(SOURCES)
    search = {"beam": lambda **kw: decoding.beam_search(model, source, **BEAM, **kw),
              "greedy": lambda **kw: decoding.greedy_decode(model, source, max_extra=6, **kw),
              "sample": lambda **kw: decoding.sample(model, source, num_return=2, seed=3, max_extra=6, **kw)}
    free, _ = search[strategy]()
    tokens, scores = search[strategy](banned=BANNED)
    free, tokens = np.asarray(free), np.asarray(tokens)
    free, tokens = free.reshape(len(SOURCES), -1, free.shape[-1]), tokens.reshape(len(SOURCES), -1, tokens.shape[-1])
    for row, phrases in enumerate(BANNED):
        if strategy != "sample":  # the bans bite
            assert all(occurrences(output(free[row, 0]), phrase) for phrase in phrases), (free[row, 0], phrases)
        for hypothesis in tokens[row]:
            for phrase in phrases:
                assert not occurrences(output(hypothesis), phrase), (hypothesis, phrase)
    np.testing.assert_array_equal(tokens[3], free[3])  # no ban: as before
    if strategy != "beam":
        flat = tokens.reshape(-1, tokens.shape[-1])
        np.testing.assert_allclose(np.reshape(scores, -1), decoding.score(model, np.repeat(
            source, flat.shape[0] // len(SOURCES), axis=0), flat), atol=1e-4)


def test_banned_and_positive_constraints_together(trained_copy_model):
    model, _ = trained_copy_model
    tokens, _ = decoding.beam_search(model, padded(SOURCES[:1]), **BEAM, constraints=[[[30]]], banned=[[[7]]])
    best = output(np.asarray(tokens)[0, 0])
    assert 30 in best and 7 not in best


def test_constraints_with_a_target_prefix(trained_copy_model):
    """The forced prefix comes first and counts toward a constraint it contains."""
    model, _ = trained_copy_model
    tokens, _ = decoding.beam_search(model, padded([SOURCES[0], SOURCES[1]]), **BEAM, target_prefix=[[30, 31], [9, 0]],
                                     constraints=[[[31, 5]], [[27]]])
    first, second = output(np.asarray(tokens)[0, 0]), output(np.asarray(tokens)[1, 0])
    assert first[:2] == [30, 31] and occurrences(first, [31, 5]), first
    assert second[0] == 9 and 27 in second, second


def _brute_force(frame, phrase):
    """(completed, progress): whether `frame` ends with `phrase`, and the longest proper prefix of it that
    `frame` ends with (the automaton of the papers, written out)."""
    frame = [t for t in frame if t >= 0]
    completed = len(frame) >= len(phrase) and frame[len(frame) - len(phrase):] == phrase
    progress = max([j for j in range(len(phrase)) if j <= len(frame) and frame[len(frame) - j:] == phrase[:j]]
                   + [0])
    return completed, progress


def test_progress_falls_back_as_the_automaton_does():
    """Every frame of 4 tokens over {5, 6, 7} (so prefixes re-occur, as in 5 5 6 after 5 5 5) against phrases
    of 1 to 4 tokens: completion and the longest proper prefix matched equal the written-out automaton's."""
    phrases = [[5], [5, 6], [5, 5, 6], [5, 6, 5, 6], [6, 6, 6, 7], [7, 5]]
    padded_phrases = np.array([p + [0] * (4 - len(p)) for p in phrases], "int32")[None]  # (1, P, 4)
    frames = np.array([list(f) for f in itertools.product([5, 6, 7], repeat=4)], "int32")
    frames = np.concatenate([frames, frames.copy()], 0)
    frames[len(frames) // 2:, :2] = -1  # frames with only two tokens so far
    matcher = Phrases(tf.constant(padded_phrases), 0)
    matches = matcher.suffix_matches(tf.constant(frames[None]))
    completed, progress = np.asarray(matcher.completed(matches))[0], np.asarray(matcher.progress(matches))[0]
    for i, frame in enumerate(frames.tolist()):
        for p, phrase in enumerate(phrases):
            assert (bool(completed[i, p]), int(progress[i, p])) == _brute_force(frame, phrase), (frame, phrase)
    history = np.array([[[5, 5, 5]]], "int32")  # the history frame puts a sentinel first
    assert np.asarray(frames_with_history(tf.constant(history))).tolist() == [[[-1, 5, 5, 5]]]


@pytest.mark.parametrize("value, error, message", [
    ([[[5, 3]]] * 5, ValueError, r"beam_search: constraints hold eos \(3\)"),
    ([[[5, 40]]] * 5, ValueError, r"constraints ids must be in \[0, 32\)"),
    ([[[5]]] * 4, ValueError, r"5 source sentence\(s\) but 4 rows of constraints"),
    (np.array([[[0, 5]]] * 5), ValueError, r"a phrase of constraints has a token after padding \(0\)"),
    (np.zeros((5, 2), "int32"), ValueError, r"constraints must have rank 3 or 4, got shape \(5, 2\)"),
    (np.full((5, 1, 2), 5.5), TypeError, "integer token ids"),
])
def test_bad_constraints_are_named(trained_copy_model, value, error, message):
    model, _ = trained_copy_model
    with pytest.raises(error, match=message):
        decoding.beam_search(model, padded(SOURCES), constraints=value)


def test_bad_banned_phrases_are_named(trained_copy_model):
    model, _ = trained_copy_model
    with pytest.raises(ValueError, match=r"greedy_decode: banned hold bos \(2\)"):
        decoding.greedy_decode(model, padded(SOURCES), banned=np.array([[2, 5]]))


@pytest.mark.slow
def test_xla_compiled_constrained_search_equals_eager(trained_copy_model, constrained):
    """Slow: compiles the constrained beam search and greedy decoding with bans under XLA (seconds each)."""
    model, _ = trained_copy_model
    source, constraints = padded(SOURCES), pad_constraints(CONSTRAINTS, forms=True)

    @tf.function(jit_compile=True)
    def compiled(source, constraints):
        return (decoding.beam_search(model, source, constraints=constraints, **BEAM),
                decoding.greedy_decode(model, source, max_extra=6, banned=tf.constant(pad_constraints(BANNED))))

    (tokens, scores), (greedy, _) = compiled(tf.constant(source), tf.constant(constraints))
    eager, eager_scores = decoding.beam_search(model, source, constraints=constraints, **BEAM)
    np.testing.assert_array_equal(tokens, eager)
    np.testing.assert_array_equal(tokens, constrained[0])  # and the graph with dynamic shapes
    np.testing.assert_allclose(scores, eager_scores, atol=1e-4)
    np.testing.assert_array_equal(greedy, decoding.greedy_decode(model, source, max_extra=6, banned=BANNED)[0])


@pytest.mark.slow
def test_constrained_search_under_jax_equals_tensorflow(trained_copy_model, tmp_path, constrained):
    """Slow: a fresh interpreter with Keras on JAX (TensorFlow hidden) runs the constrained beam search, bans
    and greedy decoding with constraints on the same weights: the same tokens as TensorFlow's."""
    model, config = trained_copy_model
    weights = tmp_path / "copy.weights.h5"
    model.save_weights(str(weights))
    script = f"""
import json, sys
class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text"):
            raise ImportError(name)
sys.meta_path.insert(0, _NoTensorFlow())
import numpy as np
import keras_transformer as kt
from keras_transformer import decoding
model = kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size={config.vocab_size}, dropout=0.0))
model.load_weights({str(weights)!r})
source = np.array({padded(SOURCES).tolist()}, "int32")
constraints = decoding.pad_constraints({CONSTRAINTS!r}, forms=True)
tokens, _ = decoding.beam_search(model, source, constraints=constraints, **{BEAM!r})
greedy, _ = decoding.greedy_decode(model, source, max_extra=6, constraints=constraints, banned={BANNED!r})
print(json.dumps([np.asarray(tokens).tolist(), np.asarray(greedy).tolist()]))
"""
    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    tokens, greedy = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_array_equal(tokens, constrained[0])
    expected, _ = decoding.greedy_decode(model, padded(SOURCES), max_extra=6, constraints=CONSTRAINTS,
                                         banned=BANNED)
    np.testing.assert_array_equal(greedy, expected)


@pytest.mark.slow
def test_shipped_en_de_model_puts_every_term_in():
    """Slow: loads the shipped EN-DE SavedModel's Keras model (tens of seconds) and decodes with glossary terms
    tokenized by its own target tokenizer: one word, two words, non-ASCII, a word the model would not use."""
    translator = kt.load_translator(str(ROOT / "saved_models" / "multi30k_en_de"))
    lines = ["A man rides a bike.", "Two dogs play in the snow near a big house."]
    glossary = Glossary.parse("bike\tVelo\nsnow\tweißen Schnee\nhouse\tGebäude\n")
    tokenizer = translator.target_tokenizer
    special = (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)

    def tokenize(text):
        return np.asarray(tokenizer.tokenize([text]).to_list()[0]).tolist()

    constraints = [[term_ids(forms[0], tokenize, unk_id=tokenizer.unk_id, drop=special)
                    for forms in glossary.constraints(line)] for line in lines]
    source = translator.encode_sources(lines)
    tokens, _ = decoding.beam_search(translator.model, source, beam_size=4, alpha=0.6, constraints=constraints)
    texts = [t.decode("utf-8") if isinstance(t, bytes) else t
             for t in np.asarray(tokenizer.detokenize(np.asarray(tokens)[:, 0])).tolist()]
    assert np.asarray(constraints_met(tokens, constraints))[:, 0].all(), texts
    assert "Velo" in texts[0] and "weißen Schnee" in texts[1] and "Gebäude" in texts[1], texts


# ------------------------------------------------------------------------------------------------------ glossaries

GLOSSARY = """# terms of the contract
agreement\tVertrag
the agreement\tdas Abkommen
Apple\tApple
New York\tNew York
bike\tFahrrad\tRad

café\tCafé
"""


def test_glossary_matches_whole_words_by_its_case_rule_longest_first():
    glossary = Glossary.parse(GLOSSARY, "terms.tsv")
    assert [entry.line for entry in glossary.entries] == [2, 3, 4, 5, 6, 8]
    assert glossary.constraints("The agreement about an apple, not Apple, in new york and New York.") == [
        ("das Abkommen",), ("Apple",), ("New York",)]  # "the agreement" is longer than "agreement"
    assert glossary.constraints("An agreement, a bike and a bikes.") == [("Vertrag",), ("Fahrrad", "Rad")]
    assert glossary.constraints("Bikers at the Café.") == [("Café",)]  # not inside "Bikers"; case as written
    assert glossary.constraints("Agreement! Agreement?") == [("Vertrag",), ("Vertrag",)]  # each occurrence
    assert glossary.constraints("Nothing here.") == []


def test_glossary_longest_match_wins_over_an_earlier_overlapping_one():
    glossary = Glossary.parse("red\trot\nred wine glass\tRotweinglas\nwine\tWein\n")
    assert glossary.constraints("A red wine glass and red wine.") == [("Rotweinglas",), ("rot",), ("Wein",)]


@pytest.mark.parametrize("text, message", [
    ("agreement Vertrag\n", "terms.tsv line 1: expected 'source term<TAB>target term"),
    ("# c\n\nbike\tRad\n\t\tFahrrad\n", "terms.tsv line 4: the source term is empty"),
    ("bike\tRad\nagreement\t \n", "terms.tsv line 2: the source term 'agreement' has no target term"),
])
def test_malformed_glossary_lines_are_named(text, message, tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message.replace("terms.tsv", ".*terms.tsv")):
        Glossary.read(path)
    with pytest.raises(ConfigError, match="Cannot read the glossary .*missing.tsv"):
        Glossary.read(tmp_path / "missing.tsv")


def test_term_ids_refuses_empty_and_unknown_only_terms(word_tokenizer):
    def tokenize(text):
        return np.asarray(word_tokenizer.tokenize([text]).to_list()[0]).tolist()

    assert term_ids("w7 w8", tokenize, unk_id=1) == [7, 8]
    assert term_ids("w7 zz", tokenize, unk_id=1) == [7, 1]  # an unknown word beside known ones is kept
    with pytest.raises(ConfigError, match="A constraint is empty"):
        term_ids("  ", tokenize, unk_id=1)
    with pytest.raises(ConfigError, match="The constraint 'Straße' has only unknown tokens"):
        term_ids("Straße", tokenize, unk_id=1)
