"""Quality signals per sentence (`translate_detailed`, `translate_document(details=True)`) and documents cut by
the engines' own token counts, on the TensorFlow, CTranslate2 and packed engines."""

import pathlib

import numpy as np
import pytest
from factories import random_sentences, word_vocabulary

from keras_transformer import decoding
from keras_transformer.documents.cutting import cut
from keras_transformer.documents.document import estimate_tokens
from keras_transformer.engines.details import BLANK

# The module's translators (traced once) are shared by its tests: one xdist worker runs them all.
pytestmark = pytest.mark.xdist_group("test_details")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXTS = ["w5 w6 w7", "", "w8 w9 w10 w11 w12 w13 w14", "w16"] + random_sentences(8, seed=3)
ALPHA = 0.6


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """`(folder, tokenizer)`: a SentencePiece word vocabulary whose ids are the copy task's ("▁w{i}" is i)."""
    folder = tmp_path_factory.mktemp("details") / "vocab"
    return folder, word_vocabulary(folder, 32)


@pytest.fixture(scope="module")
def tf_translator(trained_copy_model, vocab):
    from keras_transformer.engines.tensorflow import Translator

    return Translator(trained_copy_model[0], vocab[1], vocab[1], beam_size=4, alpha=ALPHA, max_extra=5)


@pytest.fixture(scope="module")
def tf_details(tf_translator):
    """The TensorFlow engine's `translate_detailed(TEXTS)`: what the other engines are compared with."""
    return tf_translator.translate_detailed(TEXTS)


def forced_log_probs(translator, model, sources, targets):
    """Per pair, the sum of the target's token log-probabilities, eos included: `decoding.score` with alpha 0 over
    the ids of the texts, tokenized again."""
    import tensorflow as tf

    source = translator.encode_sources(tf.constant(sources))
    target = translator.encode_targets(tf.constant(targets))
    return np.asarray(decoding.score([model], source, target, alpha=0.0, pad_id=0, bos_id=2))


@pytest.mark.slow
def test_each_translation_carries_its_mean_log_prob_and_score_as_forced_decoding_gives_them(
        tf_translator, tf_details, trained_copy_model):
    """Traces the n-best and forced-decoding graphs besides the details graph (about 15 s)."""
    details = tf_details
    assert [d.text for d in details] == tf_translator.translate_lines(TEXTS)
    assert details[1] == BLANK
    kept = [i for i, text in enumerate(TEXTS) if text]
    sources, translations = [TEXTS[i] for i in kept], [details[i].text for i in kept]
    assert sum(bool(t) for t in translations) >= len(kept) - 1  # the copy model translates (words, not nothing)
    # score: as n_best_lines ranks the best, and as forced decoding scores the translation (alpha 0.6)
    np.testing.assert_allclose([details[i].score for i in kept],
                               [row[0][1] for row in tf_translator.n_best_lines(sources)], atol=1e-5)
    np.testing.assert_allclose([details[i].score for i in kept], tf_translator.score_lines(sources, translations),
                               atol=1e-4)
    # tokens: the translation's words and eos; mean_log_prob: the forced log-probability over them
    assert [details[i].tokens for i in kept] == [len(t.split()) + 1 for t in translations]
    log_probs = forced_log_probs(tf_translator, trained_copy_model[0], sources, translations)
    np.testing.assert_allclose([details[i].mean_log_prob for i in kept],
                               log_probs / [len(t.split()) + 1 for t in translations], atol=1e-4)
    # by hand: the score times the GNMT penalty, over the tokens
    for i in kept:
        n = details[i].tokens
        assert details[i].mean_log_prob == pytest.approx(details[i].score * ((5 + n) / 6) ** ALPHA / n, rel=1e-6)
    assert all(d.mean_log_prob < 0 for d in details if d.tokens)
    record = details[0].to_dict()
    assert set(record) == {"text", "score", "mean_log_prob", "log_prob", "tokens"}


@pytest.mark.slow
def test_every_n_best_hypothesis_carries_its_signals_on_each_engine(tf_translator, trained_copy_model,
                                                                    ct2_translator, packed_translator):
    """Traces the TensorFlow engine's n-best details graph and runs the packed engine's search op by op (about
    20 s): each hypothesis of `n_best_detailed` is `n_best_lines`' (text and score), its mean log-probability the
    forced decoding's over its words and eos; CTranslate2 and the packed engine give the TensorFlow engine's."""
    detailed = tf_translator.n_best_detailed(TEXTS)
    assert [[(t.text, round(t.score, 4)) for t in row] for row in detailed] == [
        [(text, round(score, 4)) for text, score in row] for row in tf_translator.n_best_lines(TEXTS)]
    assert detailed[1] == [BLANK] * 4 and all(len(row) == 4 for row in detailed)
    pairs = [(TEXTS[i], t) for i, row in enumerate(detailed) if TEXTS[i] for t in row if t.text]
    assert len({t.text for _, t in pairs}) > len(TEXTS)  # the hypotheses differ
    log_probs = forced_log_probs(tf_translator, trained_copy_model[0], [s for s, _ in pairs],
                                 [t.text for _, t in pairs])
    assert [t.tokens for _, t in pairs] == [len(t.text.split()) + 1 for _, t in pairs]
    np.testing.assert_allclose([t.mean_log_prob for _, t in pairs],
                               log_probs / [t.tokens for _, t in pairs], atol=1e-4)
    for other in (ct2_translator, packed_translator):
        theirs = other.n_best_detailed(TEXTS[:4])
        assert [[t.text for t in row] for row in theirs] == [[t.text for t in row] for row in detailed[:4]]
        np.testing.assert_allclose([t.mean_log_prob for row in theirs for t in row],
                                   [t.mean_log_prob for row in detailed[:4] for t in row], atol=1e-4)


@pytest.mark.slow
def test_greedy_decoding_and_a_target_prefix_count_every_token_generated(tf_translator, trained_copy_model):
    """Traces a greedy translator's prefixed details graph and its forced decoding (about 6 s)."""
    greedy = tf_translator.with_options(tf_translator.options.replace(strategy="greedy"))
    details = greedy.translate_detailed(TEXTS[:4], target_prefix="w5")
    kept = [0, 2, 3]
    translations = [details[i].text for i in kept]
    assert all(t.startswith("w5") for t in translations)
    assert [details[i].tokens for i in kept] == [len(t.split()) + 1 for t in translations]  # the prefix counted
    log_probs = forced_log_probs(greedy, trained_copy_model[0], [TEXTS[i] for i in kept], translations)
    np.testing.assert_allclose([details[i].score for i in kept], log_probs, atol=1e-4)  # alpha 0: the sum itself
    np.testing.assert_allclose([details[i].mean_log_prob for i in kept],
                               log_probs / [details[i].tokens for i in kept], atol=1e-4)


@pytest.mark.slow
def test_a_document_gives_one_record_per_sentence_a_cut_one_summing_its_parts(tf_translator):
    """Traces the translator's search graph for a document's batches (about 8 s)."""
    import json

    text = "w5 w6 w7\n\n  - w8 w9 w10 w11 w12 w13 w14\n"
    result = tf_translator.translate_document(text, details=True, max_tokens=4)
    assert result["text"] == tf_translator.translate_document(text, max_tokens=4)
    json.dumps(result)  # JSON-ready as it is
    sources = [record["source"] for record in result["sentences"]]
    assert sources == ["w5 w6 w7", "w8 w9 w10 w11 w12 w13 w14"]
    first, long = result["sentences"]
    alone = tf_translator.translate_detailed(["w5 w6 w7"])[0]  # batched otherwise: equal up to float rounding
    assert (first["translation"], first["tokens"]) == (alone.text, alone.tokens)
    for key in ("score", "mean_log_prob", "log_prob"):
        assert first[key] == pytest.approx(getattr(alone, key), abs=1e-5)
    parts = tf_translator.translate_detailed(cut(long["source"], 4, tf_translator.count_source_tokens))
    assert len(parts) == 2 and long["translation"] == " ".join(p.text for p in parts)
    assert long["tokens"] == sum(p.tokens for p in parts)
    assert long["log_prob"] == pytest.approx(sum(p.log_prob for p in parts), rel=1e-6)
    assert long["mean_log_prob"] == pytest.approx(long["log_prob"] / long["tokens"], rel=1e-6)
    assert long["score"] == pytest.approx(long["log_prob"] / ((5 + long["tokens"]) / 6) ** ALPHA, rel=1e-6)


@pytest.mark.slow
def test_an_ensemble_s_signals_are_its_forced_decoding_s(trained_copy_model, vocab):
    """Two models decoded as one (the mean of their distributions): traces its search and scoring (about 10 s)."""
    import keras

    import keras_transformer as kt
    from keras_transformer.engines.tensorflow import Translator

    model, config = trained_copy_model
    other = kt.build_model(config)
    rng = np.random.default_rng(1)
    for mine, theirs in zip(other.weights, model.weights):  # the same model, its weights perturbed
        mine.assign(keras.ops.convert_to_numpy(theirs) + rng.normal(0, 0.05, tuple(theirs.shape)).astype("float32"))
    ensemble = Translator([model, other], vocab[1], vocab[1], beam_size=4, alpha=ALPHA, max_extra=5)
    texts = [text for text in TEXTS if text]
    details = ensemble.translate_detailed(texts)
    translations = [d.text for d in details]
    np.testing.assert_allclose([d.score for d in details], ensemble.score_lines(texts, translations), atol=1e-4)
    import tensorflow as tf

    log_probs = np.asarray(decoding.score([model, other], ensemble.encode_sources(tf.constant(texts)),
                                          ensemble.encode_targets(tf.constant(translations)), alpha=0.0, pad_id=0,
                                          bos_id=2))
    assert [d.tokens for d in details] == [len(t.split()) + 1 for t in translations]
    np.testing.assert_allclose([d.mean_log_prob for d in details], log_probs / [d.tokens for d in details],
                               atol=1e-4)


# Known words between unknown one-letter ones: seven tokens to every engine, an estimate of six (16 bytes / 3).
OVER = "a w5 b w6 c w7 d"
# Six words of three bytes: six tokens, an estimate of eight (23 bytes / 3).
UNDER = "w10 w11 w12 w13 w14 w15"


def sent_lines(translator, monkeypatch, text, max_tokens):
    """The lines `translate_document(text, max_tokens=...)` sends to the translator's `translate_lines`."""
    sent, original = [], type(translator).translate_lines

    def spy(self, lines, **options):
        sent.extend(lines)
        return original(self, lines, **options)

    monkeypatch.setattr(type(translator), "translate_lines", spy)
    translator.translate_document(text, max_tokens=max_tokens)
    return sent


def check_own_counts(translator, monkeypatch):
    assert (translator.count_source_tokens(OVER), estimate_tokens(OVER)) == (7, 6)
    assert (translator.count_source_tokens(UNDER), estimate_tokens(UNDER)) == (6, 8)
    over = sent_lines(translator, monkeypatch, OVER, max_tokens=6)
    assert len(over) == 2 and " ".join(over).split() == OVER.split()  # cut: its parts, in order, nothing lost
    assert all(translator.count_source_tokens(part) <= 6 for part in over)
    assert sent_lines(translator, monkeypatch, UNDER, max_tokens=6) == [UNDER]  # whole: not cut needlessly


def test_the_tensorflow_engine_cuts_by_its_own_token_count(tf_translator, monkeypatch):
    check_own_counts(tf_translator, monkeypatch)


@pytest.fixture(scope="module")
def ct2_translator(trained_copy_model, vocab, tmp_path_factory):
    pytest.importorskip("ctranslate2")
    from keras_transformer.engines.ctranslate2 import CTranslate2Translator
    from keras_transformer.exports import ctranslate2 as ce

    model, config = trained_copy_model
    folder = ce.export_ctranslate2(model, config, vocab[0], tmp_path_factory.mktemp("details_ct2") / "copy",
                                   beam_size=4, alpha=ALPHA, max_extra=5)
    return CTranslate2Translator(folder)


@pytest.mark.slow  # a CTranslate2 export of the copy model written and decoded
def test_ctranslate2_gives_the_signals_of_the_tensorflow_engine_and_of_its_own_forced_scores(ct2_translator,
                                                                                         tf_details):
    """CTranslate2's per-sentence signals (tokens, mean log-probability, score) equal the TensorFlow engine's
    and its own forced scores of the same translations (within 1e-4)."""
    details = ct2_translator.translate_detailed(TEXTS)
    assert [d.text for d in details] == [d.text for d in tf_details]
    assert [d.tokens for d in details] == [d.tokens for d in tf_details]
    np.testing.assert_allclose([d.mean_log_prob for d in details], [d.mean_log_prob for d in tf_details], atol=1e-4)
    np.testing.assert_allclose([d.score for d in details], [d.score for d in tf_details], atol=1e-4)
    kept = [i for i, text in enumerate(TEXTS) if text]
    forced = ct2_translator.translator.score_batch(  # CTranslate2's own log-probabilities, eos appended
        [ct2_translator.encode_source(TEXTS[i]) for i in kept],
        [[f"▁{word}" for word in details[i].text.split()] for i in kept])
    np.testing.assert_allclose([details[i].mean_log_prob for i in kept],
                               [np.mean(result.log_probs) for result in forced], atol=1e-4)


def test_ctranslate2_cuts_by_its_own_token_count(ct2_translator, monkeypatch):
    check_own_counts(ct2_translator, monkeypatch)
    assert ct2_translator.source_language is None  # a model of our own: no language in its metadata


@pytest.fixture(scope="module")
def packed_translator(trained_copy_model, vocab):
    from keras_transformer.engines.packed import PackedTranslator, sentencepiece_processors

    model, config = trained_copy_model
    return PackedTranslator(model, sentencepiece_processors(vocab[0]), config, beam_size=4, alpha=ALPHA, max_extra=5)


@pytest.mark.slow
def test_the_packed_engine_gives_the_signals_of_the_tensorflow_engine(packed_translator, tf_details, monkeypatch):
    """The packed engine's Keras search runs op by op on this backend (about 7 s)."""
    details = packed_translator.translate_detailed(TEXTS)
    assert [d.text for d in details] == [d.text for d in tf_details]
    assert [d.tokens for d in details] == [d.tokens for d in tf_details]
    np.testing.assert_allclose([d.mean_log_prob for d in details], [d.mean_log_prob for d in tf_details], atol=1e-4)
    np.testing.assert_allclose([d.score for d in details], [d.score for d in tf_details], atol=1e-4)
    check_own_counts(packed_translator, monkeypatch)


@pytest.mark.slow
def test_the_shipped_savedmodel_gives_signals_its_forced_decoding_confirms():
    """Loads the shipped export and traces its search and forced decoding (20-50 s)."""
    import keras_transformer as kt

    translator = kt.load_translator(REPO_ROOT / "saved_models" / "multi30k_en_de")
    sources = ["A man rides a bike.", "Two dogs play in the snow near a red fence."]
    details = translator.translate_detailed(sources)
    translations = [d.text for d in details]
    assert translations == translator.translate_lines(sources)
    np.testing.assert_allclose([d.score for d in details], translator.score_lines(sources, translations), atol=1e-3)
    plain = translator.with_options(translator.options.replace(alpha=0.0))  # forced log-probabilities themselves
    lengths = [len(ids) + 1 for ids in translator.target_tokenizer.tokenize(translations).to_list()]
    assert [d.tokens for d in details] == lengths
    np.testing.assert_allclose([d.mean_log_prob for d in details],
                               np.array(plain.score_lines(sources, translations)) / lengths, atol=1e-3)
    assert all(-3 < d.mean_log_prob < 0 for d in details)
    assert translator.count_source_tokens("A man rides a bike.") == len(
        translator.source_tokenizer.tokenize(["A man rides a bike."]).to_list()[0])


def test_a_markup_document_has_a_record_per_sentence_and_translated_attribute():
    """Any engine with `details_batch`: the records follow the engine's own translations, attributes included."""
    import json

    from keras_transformer.decoding.options import DecodeOptions
    from keras_transformer.engines.details import Translation
    from keras_transformer.engines.interface import TranslatorInterface

    class Upper(TranslatorInterface):
        n_best_batch = score_batch = None
        strategies, options = ("beam",), DecodeOptions(alpha=ALPHA)

        def translate_batch(self, texts, prefixes=None):
            return [text.upper() for text in texts]

        def details_batch(self, texts, prefixes=None):  # -0.5 a word, -0.25 for </s>
            return [Translation.from_score(text.upper(), (-0.5 * len(text.split()) - 0.25) /
                                           ((5 + len(text.split()) + 1) / 6) ** ALPHA, len(text.split()) + 1, ALPHA)
                    for text in texts]

    page = '<p title="A cat.">A <b>black</b> dog. It runs.</p>'
    report = Upper().translate_document(page, format="html", details=True)
    assert report["text"] == Upper().translate_document(page, format="html") == (
        '<p title="A CAT.">A <b>BLACK</b> DOG. IT RUNS.</p>')
    assert [(r["source"], r["translation"], r["tokens"]) for r in report["sentences"]] == [
        ("A cat.", "A CAT.", 3), ("A black dog.", "A BLACK DOG.", 4), ("It runs.", "IT RUNS.", 3)]
    assert [r["log_prob"] for r in report["sentences"]] == pytest.approx([-1.25, -1.75, -1.25])
    assert [r["mean_log_prob"] for r in report["sentences"]] == pytest.approx([-1.25 / 3, -1.75 / 4, -1.25 / 3])
    assert json.loads(json.dumps(report)) == report
