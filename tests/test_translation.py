"""Translator: strings in, strings out, consistent with the id-level search; truncation; XLA; export."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.engines.tensorflow import EAGER_SENTENCES, TRAINED_CHUNK_SIZE, Translator
from keras_transformer.engines.tensorflow_graph import bucket_sizes, bucket_table

# Its module fixtures and traced translators are shared by its tests: `make test` (--dist loadgroup) runs the
# whole file on one worker, so they are built once.
pytestmark = pytest.mark.xdist_group("test_translation")

SENTENCES = ["w5 w6 w7", "w8 w9 w10 w11 w12 w13 w14", "w16", "w20 w21 w22 w23 w24 w25"]


@pytest.fixture(scope="module")
def translator(trained_copy_model, word_tokenizer):
    """One search (and one forced pass) per batch: what the chunked translators below must equal."""
    model, _ = trained_copy_model
    return Translator(model, word_tokenizer, word_tokenizer, beam_size=4, alpha=0.6, max_extra=5, chunk_size=0)


@pytest.mark.slow  # the string graph against the search on ids (6 CPU s)
def test_translate_equals_search_on_ids(translator, trained_copy_model, word_tokenizer):
    """Tokenize + beam search + detokenize, with nothing lost or added on the way."""
    model, _ = trained_copy_model
    result = translator.translate(tf.constant(SENTENCES))
    source = translator.encode_sources(tf.constant(SENTENCES))
    expected_source = [[int(w[1:]) for w in s.split()] + [3] for s in SENTENCES]
    width = max(len(s) for s in expected_source)
    assert source.numpy().tolist() == [s + [0] * (width - len(s)) for s in expected_source]

    tokens, scores = decoding.beam_search(model, source, beam_size=4, alpha=0.6, max_extra=5)
    expected = [" ".join(f"w{i}" for i in row if i > 3) for row in tokens[:, 0].numpy().tolist()]
    assert [t.decode() for t in result["translation"].numpy()] == expected
    np.testing.assert_allclose(result["score"], scores[:, 0], atol=1e-4)
    assert translator(SENTENCES) == expected
    assert translator(SENTENCES[0]) == expected[0]
    # The model copies, imperfectly after a short training; most words come back.
    recovered = [len(set(e.split()) & set(s.split())) / len(s.split()) for e, s in zip(expected, SENTENCES)]
    assert np.mean(recovered) > 0.5


@pytest.mark.slow  # the score graph traced besides the search (6 CPU s)
def test_score_of_own_translation_equals_its_search_score(translator):
    """Forced decoding of the translator's own translations gives the scores its search gave (within 1e-4)."""
    result = translator.translate(tf.constant(SENTENCES))
    forced = translator.score(tf.constant(SENTENCES), result["translation"])
    np.testing.assert_allclose(forced, result["score"], atol=1e-4)


@pytest.mark.slow  # the n-best graph traced besides the best one (5 CPU s)
def test_n_best_is_sorted_and_starts_with_the_translation(translator):
    """`n_best` gives 4 hypotheses per sentence, scores in descending order, the first the one `translate`
    gives."""
    best = translator.translate(tf.constant(SENTENCES))
    n_best = translator.n_best(tf.constant(SENTENCES))
    assert n_best["translations"].shape == (len(SENTENCES), 4)
    assert np.all(np.diff(n_best["scores"].numpy(), axis=1) <= 1e-6)
    assert n_best["translations"][:, 0].numpy().tolist() == best["translation"].numpy().tolist()


def test_with_options_decodes_the_same_models_with_other_options(translator, trained_copy_model):
    """What `keras-transformer serve` asks per request: the search of the new options, over the shared weights."""
    model, _ = trained_copy_model
    narrow = translator.with_options(translator.options.replace(beam_size=2, alpha=0.0))
    assert narrow.models[0] is model and narrow.chunk_size == translator.chunk_size
    assert translator.with_options(translator.options) is translator and translator.options.beam_size == 4
    tokens, _ = decoding.beam_search(model, translator.encode_sources(tf.constant(SENTENCES)), beam_size=2,
                                     alpha=0.0, max_extra=5)
    assert narrow(SENTENCES) == [" ".join(f"w{i}" for i in row if i > 3) for row in tokens[:, 0].numpy().tolist()]


def test_translate_lines_keeps_order(translator):
    lines = SENTENCES[::-1] + SENTENCES
    assert translator.translate_lines(lines, batch_size=3) == translator(SENTENCES[::-1]) + translator(SENTENCES)


def test_over_long_empty_and_unknown_inputs(translator):
    """Over-long input is truncated to the model's max_length (its eos kept); odd inputs still translate."""
    long_sentence = " ".join(f"w{4 + i % 28}" for i in range(3000))
    source = translator.encode_sources(tf.constant([long_sentence, "w5"]))
    assert source.shape == (2, translator.max_source_length)
    assert source[0, -1] == 3 and source[1].numpy().tolist()[:2] == [5, 3]
    batch = [long_sentence, "", "   ", "w5 zebra w6", "w7"]
    outputs = translator(batch)
    assert len(outputs) == len(batch) and all(isinstance(o, str) for o in outputs)
    assert outputs[-1] == translator("w7")  # neighbours (even a 3000-word one) change nothing


def test_undecodable_input_bytes_become_replacement_characters(translator):
    """Bad bytes translate as U+FFFD however they arrive: bytes, or str as Python reads them from stdin/argv."""
    raw = b"w5 \xff w6 \xc3"
    as_python_reads_stdin = raw.decode("utf-8", "surrogateescape")  # lone surrogates, which tf.constant refuses
    expected = translator(raw.decode("utf-8", "replace"))  # "w5 \ufffd w6 \ufffd", replaced by Python instead
    assert translator([raw, as_python_reads_stdin]) == [expected, expected]
    assert translator.translate_lines([as_python_reads_stdin, "w7", raw], batch_size=2) == [
        expected, translator("w7"), expected]
    other_surrogate = "w5 \ud800 w6 \ufffd"  # not from surrogateescape: still replaced, not an error
    assert translator(other_surrogate) == expected
    with pytest.raises(TypeError, match="sentences must be str .* got NoneType"):
        translator.translate_lines(["w5", None])


@pytest.mark.parametrize("line", ["w5 w6 w7", b"w5 w6 w7"])
def test_translate_lines_refuses_one_sentence_instead_of_a_list(translator, line):
    """A str was translated character by character (one output per character)."""
    from keras_transformer import inference

    with pytest.raises(TypeError, match=r"translate_lines takes an iterable of lines .* translator\(sentence\)"):
        translator.translate_lines(line)
    with pytest.raises(TypeError, match=r"translate takes a list of sentences, got one (str|bytes)"):
        inference.translate(translator, line)
    assert translator.translate_lines([line]) == [translator(line)]


@pytest.mark.parametrize("sources, targets", [(2, 1), (1, 2), (3, 2)])
def test_score_refuses_a_different_number_of_targets(translator, sources, targets):
    """2 sources and 1 target gave 2 scores (the target broadcast); 3 and 2 failed inside a matmul."""
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"Translator.score: got\] \[{sources}\] \[source\(s\) but\] \[{targets}\]"):
        translator.score(tf.constant(SENTENCES[:sources]), tf.constant(SENTENCES[:targets]))


@pytest.mark.parametrize("options, message", [
    (dict(max_extra=-5), "^max_extra must be an integer >= 0, got -5"),  # named as the keyword given
    (dict(alpha=float("nan")), r"^alpha .* must be a finite number >= 0 .* got nan"),
    (dict(alpha=float("inf")), "got inf"),
    (dict(alpha=-0.5), "got -0.5"),
])
def test_decoding_settings_out_of_range_are_refused(trained_copy_model, word_tokenizer, options, message):
    model, _ = trained_copy_model
    with pytest.raises(ValueError, match=message):
        Translator(model, word_tokenizer, **options)
    assert Translator(model, word_tokenizer, alpha=0, max_extra=0).alpha == 0.0  # 0 stays valid for both


def test_a_vocabulary_of_another_size_than_the_model_is_refused(word_tokenizer, tmp_path):
    """Larger ended in an InvalidArgumentError from the embedding gather; smaller translated into nonsense."""
    import keras_transformer as kt

    for size in (40, 20):
        with pytest.raises(ValueError, match=rf"source tokenizer has a vocabulary of 32 ids but the model has {size} "
                                             r"\(shared_embedding, TransformerConfig.vocab_size\)"):
            Translator(kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=size)), word_tokenizer)
    separate = kt.TransformerConfig.preset("tiny", vocab_size=40, source_vocab_size=32, target_vocab_size=40,
                                           tie_embeddings="none", num_layers=1)
    with pytest.raises(ValueError, match=r"target tokenizer has a vocabulary of 32 ids but the model has 40 "
                                         r"\(target_embedding, TransformerConfig.target_vocab_size\)"):
        Translator(kt.build_model(separate), word_tokenizer, word_tokenizer)
    config = kt.TransformerConfig.preset("tiny", vocab_size=40, num_layers=1)
    with pytest.raises(ValueError, match="32 ids but the model has 40"):
        Translator.from_models([kt.build_model(config)], (word_tokenizer, word_tokenizer))


@pytest.mark.slow  # the eager path and the traced graph compared (6 CPU s)
def test_first_few_sentences_are_decoded_without_tracing_and_as_the_graph_decodes(trained_copy_model,
                                                                                  word_tokenizer, translator):
    """A command line translating two sentences spent most of its time tracing the search into a graph: a
    translator's first EAGER_SENTENCES sentences are decoded eagerly, giving what the graph gives (`translator`'s,
    traced); past them, it traces once."""
    model, _ = trained_copy_model
    fresh = Translator(model, word_tokenizer, beam_size=4, alpha=0.6, max_extra=5)
    assert EAGER_SENTENCES >= 4
    translations, n_best = fresh(SENTENCES[:2]), fresh.n_best_lines(SENTENCES[2:4])
    assert fresh.translate.experimental_get_tracing_count() == fresh.n_best.experimental_get_tracing_count() == 0
    assert translations == [t.decode() for t in translator.translate(tf.constant(SENTENCES[:2]))["translation"].numpy()]
    graph = translator.n_best(tf.constant(SENTENCES[2:4]))
    assert [[text for text, _ in row] for row in n_best] == [[t.decode() for t in row]
                                                             for row in graph["translations"].numpy()]
    np.testing.assert_allclose([[score for _, score in row] for row in n_best], graph["scores"], atol=1e-5)
    assert fresh.translate_lines(SENTENCES * 3) == translator.translate_lines(SENTENCES * 3)
    assert fresh.translate.experimental_get_tracing_count() == 1  # past EAGER_SENTENCES: the graph, traced once
    assert fresh(SENTENCES[:1]) == translations[:1] and fresh.translate.experimental_get_tracing_count() == 1


@pytest.mark.slow
def test_xla_translator_matches(trained_copy_model, word_tokenizer, translator):
    """Slow: compiles the translator's search with XLA, seconds of compilation for one comparison."""
    model, _ = trained_copy_model
    compiled = Translator(model, word_tokenizer, beam_size=4, alpha=0.6, max_extra=5, jit_compile=True)
    assert compiled(SENTENCES) == translator(SENTENCES)


@pytest.mark.slow
def test_xla_chunks_are_padded_to_a_few_shapes(trained_copy_model, word_tokenizer):
    """With XLA, chunks are padded to bucketed shapes (one compilation each) and give the one search's results."""
    model, _ = trained_copy_model
    lines = SENTENCES + SENTENCES[::-1][:3]  # 7 sentences: chunks of 4 and 3, widths 2 to 8
    compiled = Translator(model, word_tokenizer, beam_size=4, alpha=0.6, max_extra=5, jit_compile=True, chunk_size=4)
    source = compiled.encode_sources(tf.constant(lines))
    tokens, scores = decoding.beam_search(model, source, beam_size=4, alpha=0.6, max_extra=5, num_return=4)
    got_tokens, got_scores = compiled.translate_ids(source)  # eager: one trace per distinct padded shape
    assert got_tokens.shape == tokens.shape
    np.testing.assert_array_equal(got_tokens.numpy(), tokens.numpy())
    np.testing.assert_allclose(got_scores.numpy(), scores.numpy(), atol=1e-5)
    compiled.translate_ids(source[:2, :3])  # 2 rows of width 3: the (2, 16) bucket
    assert compiled._graph_search.experimental_get_tracing_count() == 2  # (4, 16) for both chunks of 7, then (2, 16)


def test_bucket_sizes():
    assert bucket_sizes(128, 16) == [16, 32, 64, 128]
    assert bucket_sizes(20, 16) == [16, 20] and bucket_sizes(10, 16) == [10]
    assert bucket_sizes(6) == [1, 2, 4, 6]
    assert bucket_table(6).numpy().tolist() == [1, 1, 2, 4, 4, 6, 6]
    with pytest.raises(ValueError, match="must be >= 1"):
        bucket_sizes(0)


@pytest.mark.slow
def test_saved_model_round_trip(trained_copy_model, word_tokenizer, translator, tmp_path):
    """The Translator, XLA-compiled as exports are, saves as a SavedModel giving the uncompiled translations."""
    model, _ = trained_copy_model
    expected = translator(SENTENCES)  # the module's uncompiled Translator, traced already
    small = Translator(model, word_tokenizer, beam_size=4, alpha=0.6, max_extra=5, jit_compile=True, chunk_size=2)
    # Saved from a root that tracks what `translate` reads (the weights, the tokenizer), not the Translator, whose
    # other five tf.functions would be traced and written too (exports: tests/test_export.py). Without the
    # gradient functions (a fifth of the save's time): nothing here differentiates. Exports keep them, so that
    # loading one warns of nothing.
    root = tf.Module()
    root.weights = [v.value if hasattr(v, "value") else v for v in model.variables]
    root.tokenizer = word_tokenizer
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    tf.saved_model.save(root, str(tmp_path), signatures={"serving_default": small.translate}, options=options)
    loaded = tf.saved_model.load(str(tmp_path))
    result = loaded.signatures["serving_default"](tf.constant(SENTENCES))
    assert [t.decode() for t in result["translation"].numpy()] == expected


_CHUNKED = {}


def chunked_translator(trained_copy_model, word_tokenizer, chunk_size):
    """The module translator's settings in chunks of `chunk_size`, built (and its `translate` traced) once."""
    if chunk_size not in _CHUNKED:
        _CHUNKED[chunk_size] = Translator(trained_copy_model[0], word_tokenizer, beam_size=4, alpha=0.6, max_extra=5,
                                          chunk_size=chunk_size)
    return _CHUNKED[chunk_size]


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size", [1, 3])
def test_length_ordered_chunks_return_the_one_search_results_in_input_order(trained_copy_model, word_tokenizer,
                                                                            chunk_size):
    """Sentences are decoded shortest first, a few per search loop; each comes back at its own place."""
    model, _ = trained_copy_model
    lines = SENTENCES + SENTENCES[::-1][:3]  # lengths 3, 7, 1, 6, 6, 1, 7: length order is not input order
    chunked = chunked_translator(trained_copy_model, word_tokenizer, chunk_size)
    source = chunked.encode_sources(tf.constant(lines))
    tokens, scores = decoding.beam_search(model, source, beam_size=4, alpha=0.6, max_extra=5, num_return=4)
    got_tokens, got_scores = chunked.translate_ids(source)
    assert got_tokens.shape == tokens.shape  # padded back to the one search's width
    np.testing.assert_array_equal(got_tokens.numpy(), tokens.numpy())
    np.testing.assert_allclose(got_scores.numpy(), scores.numpy(), atol=1e-5)
    best_tokens, best_scores = chunked.translate_ids(source, num_return=1)
    np.testing.assert_array_equal(best_tokens.numpy(), tokens.numpy()[:, :1])
    result = chunked.translate(tf.constant(lines))
    expected = [" ".join(f"w{i}" for i in row if i > 3) for row in tokens[:, 0].numpy().tolist()]
    assert [t.decode() for t in result["translation"].numpy()] == expected
    np.testing.assert_allclose(result["score"].numpy(), scores.numpy()[:, 0], atol=1e-5)


@pytest.mark.slow
def test_bad_inputs_give_one_output_each_in_chunks(trained_copy_model, word_tokenizer, translator):
    """Empty, whitespace, 3,000 words, invalid UTF-8, non-Latin, in one mixed batch spread over chunks."""
    model, _ = trained_copy_model
    batch = [b"w5 w6", b"", b"  \t ", " ".join(["w9"] * 3000).encode(), b"bad \xff\xfe bytes \xc3",
             "\u4e24\u53ea\u72d7 \u03b1\u03b2\u03b3".encode(), b"w7"]
    assert translator.chunk_size == 0  # one search: the module's translator, traced already
    assert Translator(model, word_tokenizer).chunk_size == TRAINED_CHUNK_SIZE  # built directly: bounded chunks
    expected = translator.translate(tf.constant(batch))
    for chunk_size in (3, 8):  # chunks of 3, 3 and 1 (a translator shared with the test above); one chunk, not full
        chunked = chunked_translator(trained_copy_model, word_tokenizer, chunk_size)
        result = chunked.translate(tf.constant(batch))
        assert result["translation"].shape == (len(batch),)
        assert result["translation"].numpy().tolist() == expected["translation"].numpy().tolist()
        np.testing.assert_allclose(result["score"].numpy(), expected["score"].numpy(), atol=1e-5)
        assert result["translation"].numpy().tolist()[1:3] == [b"", b""]
        assert chunked.translate(tf.constant([], tf.string))["translation"].shape == (0,)
    with pytest.raises(ValueError, match="chunk_size must be >= 0"):
        Translator(model, word_tokenizer, chunk_size=-1)


def test_score_in_chunks_gives_the_one_pass_scores_in_input_order(trained_copy_model, word_tokenizer, translator):
    """`score` runs `chunk_size` pairs per teacher-forced pass, shortest targets first, each chunk at its own source
    and target widths (one pass over a request held (N, T, V) logits): the scores are the one pass's, in input
    order."""
    lines = SENTENCES + SENTENCES[::-1][:3]  # lengths 3, 7, 1, 6, 6, 1, 7
    targets = lines[::-1]  # lengths 7, 1, 6, 6, 1, 7, 3: length order is neither input nor source order
    expected = translator.score(tf.constant(lines), tf.constant(targets)).numpy()
    chunked = chunked_translator(trained_copy_model, word_tokenizer, 3)  # chunks of 3, 3 and 1
    np.testing.assert_allclose(chunked.score(tf.constant(lines), tf.constant(targets)).numpy(), expected, atol=1e-5)
    assert len(set(np.round(expected, 3))) == len(lines)  # all different, so a score out of place is seen
    assert chunked.score(tf.constant([], tf.string), tf.constant([], tf.string)).shape == (0,)


@pytest.mark.slow  # a fresh process importing TensorFlow
def test_configure_threads_sets_the_pools_before_tensorflow_starts_and_refuses_after(translator, tmp_path):
    """In one fresh process (importing TensorFlow costs seconds a process), before it runs an op: the pools are
    set, then XLA_FLAGS handled for one intra-op thread, then flags set after the call take effect."""
    import json
    import os
    import subprocess
    import sys

    dump = tmp_path / "dump"
    # One intra-op thread: XLA's matrix products move to the calling thread, unless XLA_FLAGS already say otherwise.
    cases = [(None, "--xla_cpu_multi_thread_eigen=false"),
             ("--xla_dump_to=x", "--xla_dump_to=x --xla_cpu_multi_thread_eigen=false"),
             ("--xla_cpu_multi_thread_eigen=true", "--xla_cpu_multi_thread_eigen=true")]
    code = f"""
import json, os
os.environ.pop("XLA_FLAGS", None)
from keras_transformer.engines.tensorflow_threads import configure_threads
print(json.dumps(configure_threads(inter_op=1, intra_op=2)))
for flags in {[flags for flags, _ in cases]!r}:
    os.environ.pop("XLA_FLAGS", None)
    if flags is not None:
        os.environ["XLA_FLAGS"] = flags
    print(json.dumps([configure_threads(inter_op=1, intra_op=1), os.environ.get("XLA_FLAGS")]))
# XLA reads XLA_FLAGS when it first compiles, after the package is imported and the call made: flags set
# then take effect (a dump folder, the flag whose effect can be seen, is written).
os.environ["XLA_FLAGS"] = "--xla_dump_to={dump}"
configure_threads(intra_op=1)
import tensorflow as tf
print(float(tf.function(lambda x: tf.matmul(x, x), jit_compile=True)(tf.ones((2, 2)))[0, 0]))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()[-5:]
    assert json.loads(lines[0]) == [1, 2]
    assert [json.loads(line) for line in lines[1:4]] == [[[1, 1], expected] for _, expected in cases]
    assert lines[4] == "2.0" and any(dump.iterdir())
    from keras_transformer.engines.tensorflow_threads import configure_threads

    current = tf.config.threading.get_inter_op_parallelism_threads()
    with pytest.raises(RuntimeError, match="configure_threads: TensorFlow has already run an op"):
        configure_threads(inter_op=current + 3)  # this process has run ops (the translator fixture)
