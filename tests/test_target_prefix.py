"""Target prefixes (forced first target tokens) in every strategy, checked against searches written out here."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.model import decode, encode

# Copy-task sources (tokens then eos 3) and a prefix per sentence (ragged; nothing forced for the third; the last
# one longer than its sentence's limit of 2 + MAX_EXTRA tokens, which then grows to the prefix and one more).
SOURCES = [[5, 6, 7, 8, 3], [9, 10, 11, 3], [12, 13, 14, 15, 16, 3], [17, 3]]
PREFIXES = [[20, 21], [9], [], [25, 26, 27, 28, 29, 30]]
MAX_EXTRA = 4


def run(search, model, source, prefix, **options):
    """`search(model, source, target_prefix=prefix, **options)` as numpy arrays, run eagerly (for one search,
    cheaper than tracing its graph; tests/test_decoding.py compares eager, graph and XLA searches)."""
    return [np.asarray(x) for x in search(model, source, target_prefix=prefix, **options)]


def padded(rows, width=None, pad=0):
    width = max((len(r) for r in rows), default=0) if width is None else width
    return np.array([list(r) + [pad] * (width - len(r)) for r in rows], "int32").reshape(len(rows), width)


def log_softmax(logits):
    logits = logits.astype("float64")
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def full_pass_greedy(model, source, prefix, max_extra, bos=2, eos=3, pad=0):
    """Greedy decoding written out: the prefix teacher-forced, then the most probable token (pad and bos left out),
    each step a full decoder pass over everything so far. Returns `(tokens, log P(tokens))`."""
    source = np.array([[t for t in source if t != pad]], "int32")
    limit = max(source.shape[1] + max_extra, len(prefix) + 1)
    memory, padding = encode(model, source)
    tokens, total = [], 0.0
    while len(tokens) < limit and (not tokens or tokens[-1] != eos):
        log_probs = log_softmax(np.asarray(decode(model, np.array([[bos] + tokens], "int32"), memory, padding))[0, -1])
        log_probs[[pad, bos]] = -np.inf
        token = prefix[len(tokens)] if len(tokens) < len(prefix) else int(np.argmax(log_probs))
        tokens.append(token)
        total += log_probs[token]
    return tokens, total


def stripped(row, pad=0):
    return [int(t) for t in row if t != pad]


@pytest.mark.slow  # the prefixed search against full passes step by step (5 CPU s)
def test_greedy_with_a_prefix_is_the_full_pass_continuing_from_it(trained_copy_model):
    """The prefix comes first; then each token is the argmax after the teacher-forced prefix, and the score is
    log P of the whole output (what `score` gives it)."""
    model = trained_copy_model[0]
    tokens, scores = run(decoding.greedy_decode, model, padded(SOURCES), padded(PREFIXES), max_extra=MAX_EXTRA)
    for row, (source, prefix) in enumerate(zip(SOURCES, PREFIXES)):
        expected, total = full_pass_greedy(model, source, prefix, MAX_EXTRA)
        assert stripped(tokens[row]) == expected
        assert stripped(tokens[row])[:len(prefix)] == prefix
        assert scores[row] == pytest.approx(total, abs=1e-4)
    assert len(stripped(tokens[3])) == len(PREFIXES[3]) + 1  # its limit grew to the prefix and one more token
    forced = np.asarray(decoding.score(model, padded(SOURCES), tokens))
    np.testing.assert_allclose(scores, forced, atol=1e-4)


@pytest.mark.slow  # the reference search written out, run from the prefix (4 CPU s)
def test_beam_with_a_prefix_is_the_written_out_search_started_from_it(trained_copy_model, reference_search):
    """Every beam starts with the prefix and the n-best are those of the written-out beam search that starts from
    the one hypothesis bos + prefix; scores count the prefix (log P / lp(length with the prefix))."""
    model = trained_copy_model[0]
    options = dict(beam_size=3, alpha=0.6, max_extra=MAX_EXTRA)
    tokens, scores = run(decoding.beam_search, model, padded(SOURCES), padded(PREFIXES), num_return=3, **options)
    for row, (source, prefix) in enumerate(zip(SOURCES, PREFIXES)):
        expected, _ = reference_search(model, source, num_return=3, prefix=prefix, **options)
        assert [stripped(t) for t in tokens[row]] == [list(t) for t, _ in expected]
        np.testing.assert_allclose(scores[row], [score for _, score in expected], atol=1e-4)
        assert all(stripped(t)[:len(prefix)] == prefix for t in tokens[row])


def test_nothing_forced_changes_nothing(trained_copy_model):
    """A prefix of width 0 gives exactly the search without a prefix (rows of padding: the tests above, whose
    third sentence has no prefix)."""
    model = trained_copy_model[0]
    source = padded(SOURCES)
    plain = decoding.beam_search(model, source, beam_size=3, num_return=3, max_extra=MAX_EXTRA)
    forced = run(decoding.beam_search, model, source, np.zeros((4, 0), "int32"), beam_size=3, num_return=3,
                 alpha=0.6, max_extra=MAX_EXTRA)
    np.testing.assert_array_equal(forced[0], plain[0])
    np.testing.assert_allclose(forced[1], plain[1], atol=1e-5)


def test_samples_start_with_the_prefix_and_score_it(trained_copy_model):
    """Every sample starts with its sentence's prefix and is scored log P(whole output); top_k=1 draws the greedy
    continuation of the prefix."""
    model = trained_copy_model[0]
    source, prefix = padded(SOURCES), padded(PREFIXES)
    tokens, scores = run(decoding.sample, model, source, prefix, seed=3, num_return=2, max_extra=MAX_EXTRA)
    for row, forced in enumerate(PREFIXES):
        for r in range(2):
            assert stripped(tokens[row, r])[:len(forced)] == forced
    rescored = np.asarray(decoding.score(model, np.repeat(source, 2, 0), tokens.reshape(8, -1))).reshape(4, 2)
    np.testing.assert_allclose(scores, rescored, atol=1e-4)
    first, _ = run(decoding.sample, model, source, prefix, top_k=1, seed=5, max_extra=MAX_EXTRA)
    greedy, _ = run(decoding.greedy_decode, model, source, prefix, max_extra=MAX_EXTRA)
    np.testing.assert_array_equal(first[:, 0], greedy)


def test_a_prefix_that_starts_the_decoder_is_its_first_input_and_not_an_output(trained_copy_model):
    """`start_from_prefix` (mBART-large-cc25's target language): each sentence's decoder starts from its prefix's
    first token (bos where nothing is forced), which is no output; the rest is forced, then each token is the
    argmax (pad and bos left out) of one teacher-forced pass from that start."""
    model = trained_copy_model[0]
    source, prefix = padded(SOURCES), padded(PREFIXES)
    tokens, _ = run(decoding.greedy_decode, model, source, prefix, max_extra=MAX_EXTRA, start_from_prefix=True)
    memory, padding = encode(model, source)
    for row, forced in enumerate(PREFIXES):
        output, rest = stripped(tokens[row]), forced[1:]
        assert output[:len(rest)] == rest and len(output) > len(rest)
        inputs = np.array([[forced[0] if forced else 2] + output[:-1]], "int32")
        logits = np.array(decode(model, inputs, memory[row:row + 1], padding[row:row + 1]))[0]
        logits[:, [0, 2]] = -np.inf
        assert output[len(rest):] == logits.argmax(-1).tolist()[len(rest):], row


@pytest.mark.parametrize("prefix, message", [
    ([[7, 3]], "holds eos (3)"),
    ([[2, 7]], "holds bos (2)"),
    ([[7, 99]], "must be in [0, 32)"),
    ([[0, 7]], "a token after padding"),
    ([[7], [8]], "1 source sentence(s) but 2 target prefix(s)"),
    ([[7] * 128], "has 128 tokens; the model produces at most 128"),
])
def test_bad_prefixes_are_refused_by_name(trained_copy_model, prefix, message):
    model = trained_copy_model[0]
    for search in (decoding.greedy_decode, decoding.beam_search, decoding.sample):
        with pytest.raises(ValueError) as error:
            search(model, padded([[5, 6, 3]]), target_prefix=prefix)
        assert message in str(error.value)


class Multilingual:
    """conftest's word tokenizer whose words "w30" and "w31" are language tokens (as a multilingual model's)."""

    languages = ("w30", "w31")

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.mark.slow  # prefixed searches chunk by chunk (4 CPU s)
def test_translator_forces_prefixes_chunk_by_chunk_and_language_tokens_first(trained_copy_model, word_tokenizer):
    """`Translator.translate_lines` with a prefix per line, decoded two lines a chunk (each chunk its own prefix
    width; a translator's first sentences are decoded eagerly, op by op as in its graph), gives the ids-level
    search's outputs; `target_lang` forces the language token before the prefix; an
    unknown language, and a prefix holding a word the vocabulary lacks (in Python and in the graph), are refused by
    name."""
    from keras_transformer.engines.tensorflow import Translator
    from keras_transformer.errors import ConfigError

    model = trained_copy_model[0]
    tokenizer = Multilingual(word_tokenizer)
    translator = Translator(model, tokenizer, tokenizer, strategy="greedy", max_extra=MAX_EXTRA, chunk_size=2)
    lines = [" ".join(f"w{i}" for i in source[:-1]) for source in SOURCES]
    texts = [" ".join(f"w{i}" for i in prefix) for prefix in PREFIXES]

    def words(rows):
        return [" ".join(f"w{i}" for i in stripped(row) if i != 3) for row in rows]

    expected, _ = run(decoding.greedy_decode, model, padded(SOURCES), padded(PREFIXES), max_extra=MAX_EXTRA)
    assert translator.translate_lines(lines, target_prefix=texts) == words(expected)
    languages = translator.translate_lines(lines[:2], target_lang="w31", target_prefix=["w20", ""])
    expected, _ = run(decoding.greedy_decode, model, padded(SOURCES[:2]), [[31, 20], [31, 0]], max_extra=MAX_EXTRA)
    assert languages == words(expected) and languages[0].startswith("w31 w20 ")
    with pytest.raises(ConfigError, match=r"unknown target language 'w29'; this model's target languages \(2\): w30"):
        translator.translate_lines(lines, target_lang="w29")
    with pytest.raises(ValueError, match="the target prefix 'w5 zz' holds text the target vocabulary does not have"):
        translator.translate_lines(lines[:1], target_prefix="w5 zz")
    # The graph's own check (what an exported signature runs; here its ops run eagerly, without a trace).
    with pytest.raises(tf.errors.InvalidArgumentError, match="target prefix: a prefix holds text the target vocab"):
        translator.translate_prefixed.python_function(tf.constant(lines[:1]), tf.constant(["w5 zz"]))
