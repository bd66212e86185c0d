"""SavedModel export: a TensorFlow-only process reproduces the in-memory Translator; bad inputs never crash."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.data.tokenizers import train_tokenizers
from keras_transformer.evaluation import read_lines
from keras_transformer.export import export_translator, load_exported, load_keras_translator
from keras_transformer.translation import Translator

SENTENCES = ["A man rides a bike.", "Two dogs play in the snow.", "A girl in a pink dress is jumping."]
REFERENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Mädchen in einem rosa Kleid springt."]
BAD_INPUTS = ["", "   \t ", " ".join(["word"] * 3000), "\u4e24\u53ea\u72d7\u5728\u96ea\u5730\u91cc\u73a9",
              "Ein Mann \u0444\u043e\u0442\u043e \u03b1\u03b2\u03b3 \U0001F600"]
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, multi30k_dir):
    """A small model trained for a few steps on Multi30k val, exported once for the module."""
    import keras

    keras.utils.set_random_seed(3)
    english = read_lines(multi30k_dir / "val.en.gz")[:300]
    german = read_lines(multi30k_dir / "val.de.gz")[:300]
    source_tokenizer, target_tokenizer = train_tokenizers(english, german, vocab_size=400)
    config = kt.TransformerConfig.preset("tiny", vocab_size=source_tokenizer.vocab_size, num_layers=1, d_model=32,
                                         d_ff=64, max_length=48, warmup_steps=20, beam_size=3)
    model = kt.build_model(config)
    translator = Translator(model, source_tokenizer, target_tokenizer, beam_size=3, alpha=0.6, max_extra=8)
    train_briefly(translator, config, english, german)
    directory = tmp_path_factory.mktemp("export") / "en_de"
    export_translator(translator, directory, config=config)
    return directory, translator


def train_briefly(translator, config, english, german):
    """A few updates on the first 128 pairs, so the outputs are not uniform noise."""
    model = translator.model
    source = translator.encode_sources(tf.constant(english[:128])).numpy()
    target = translator.encode_targets(tf.constant(german[:128])).numpy()
    decoder_input = np.concatenate([np.full((len(target), 1), config.bos_id), target[:, :-1]], axis=1)
    decoder_input[decoder_input == config.eos_id] = config.pad_id
    model.compile(optimizer=kt.make_optimizer(config), loss=kt.LabelSmoothedCrossEntropy(0.1))
    model.fit({"source": source, "target": decoder_input}, target, batch_size=32, epochs=2, verbose=0)


TF_ONLY_CLIENT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
loaded = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
raw = [t.encode("utf-8") for t in texts] + [b"bad \\xff\\xfe bytes \\xc3"]
signatures = loaded.signatures
served = signatures["serving_default"](tf.constant(raw))
alone = signatures["serving_default"](tf.constant(raw[:1]))
empty = signatures["serving_default"](tf.constant([], dtype=tf.string))
n_best = signatures["n_best"](tf.constant(raw[:3]))
forced = signatures["score"](sources=tf.constant(raw[:3]), targets=tf.constant(json.loads(sys.argv[3])))
assert not any(name.startswith("keras_transformer") for name in sys.modules)
decode = lambda values: [v.decode("utf-8") for v in values]
print(json.dumps({
    "translation": decode(served["translation"].numpy()), "score": served["score"].numpy().tolist(),
    "alone": decode(alone["translation"].numpy()), "empty_shape": list(empty["translation"].shape),
    "n_best": [decode(row) for row in n_best["translations"].numpy()], "n_best_scores": n_best["scores"].numpy().tolist(),
    "forced": forced["score"].numpy().tolist(),
}))
"""


def run_tf_only(script, *args):
    """Runs `script` in a fresh interpreter that imports only tensorflow and tensorflow_text."""
    result = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    # An export written without its gradient functions warned at every load, once per function.
    assert "unsaved custom gradients" not in result.stderr, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def saved_model_proto(directory):
    """The `SavedModel` protocol buffer of an export's `saved_model.pb`."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((directory / "saved_model.pb").read_bytes())
    return saved


def test_tensorflow_only_process_serves_what_the_in_memory_translator_gives(exported):
    directory, translator = exported
    texts = SENTENCES + BAD_INPUTS
    served = run_tf_only(TF_ONLY_CLIENT, directory, json.dumps(texts), json.dumps(REFERENCES))
    raw = [t.encode("utf-8") for t in texts] + [b"bad \xff\xfe bytes \xc3"]
    expected = translator.translate(tf.constant(raw))
    # Exactly the in-memory translations, for normal and bad inputs alike; one output per input.
    assert served["translation"] == [t.decode("utf-8") for t in expected["translation"].numpy()]
    np.testing.assert_allclose(served["score"], expected["score"].numpy(), rtol=1e-4, atol=1e-4)
    assert len(served["translation"]) == len(raw) and np.all(np.isfinite(served["score"]))
    assert served["translation"][3] == "" and served["translation"][4] == ""  # empty, whitespace only
    assert served["alone"][0] == served["translation"][0]  # a mixed batch changes no sentence's translation
    assert served["empty_shape"] == [0]
    # n-best: beam_size hypotheses, best first, the first one being the translation.
    assert [len(row) for row in served["n_best"]] == [3, 3, 3]
    scores = np.array(served["n_best_scores"])
    assert np.all(scores[:, :-1] >= scores[:, 1:] - 1e-6)
    assert [row[0] for row in served["n_best"]] == served["translation"][:3]
    # Forced decoding (scoring given translations) agrees with the in-memory Translator.
    expected_forced = translator.score(tf.constant(SENTENCES), tf.constant(REFERENCES)).numpy()
    np.testing.assert_allclose(served["forced"], expected_forced, rtol=1e-4, atol=1e-4)


def test_exported_ensemble_serves_what_the_in_memory_ensemble_gives(exported, multi30k_dir, tmp_path):
    """Two models (of different shapes) sharing the tokenizers export as one SavedModel decoding their ensemble."""
    import keras

    directory, translator = exported
    keras.utils.set_random_seed(5)
    config = kt.TransformerConfig.from_yaml(directory / "assets.extra" / "model.yaml")
    other_config = kt.TransformerConfig.preset("tiny", vocab_size=config.vocab_size, num_layers=2, d_model=48,
                                               num_heads=4, d_ff=96, max_length=48, norm_first=False)
    other = Translator(kt.build_model(other_config), translator.source_tokenizer, translator.target_tokenizer)
    train_briefly(other, other_config, read_lines(multi30k_dir / "val.en.gz")[:300],
                  read_lines(multi30k_dir / "val.de.gz")[:300])
    ensemble = Translator.ensemble([translator, other])
    assert len(ensemble.models) == 2 and (ensemble.beam_size, ensemble.alpha) == (3, 0.6)
    with pytest.raises(AttributeError, match="ensemble of 2 models"):
        ensemble.model
    with pytest.raises(ValueError, match="one config per model"):
        export_translator(ensemble, tmp_path / "bad", config=config)
    export_translator(ensemble, tmp_path / "ensemble", config=[config, other_config])
    assert sorted(p.name for p in (tmp_path / "ensemble" / "assets.extra" / "members").iterdir()) == ["0", "1"]

    texts = SENTENCES + BAD_INPUTS[:2]
    served = run_tf_only(TF_ONLY_CLIENT, tmp_path / "ensemble", json.dumps(texts), json.dumps(REFERENCES))
    raw = [t.encode("utf-8") for t in texts] + [b"bad \xff\xfe bytes \xc3"]
    expected = ensemble.translate(tf.constant(raw))
    assert served["translation"] == [t.decode("utf-8") for t in expected["translation"].numpy()]
    np.testing.assert_allclose(served["score"], expected["score"].numpy(), rtol=1e-4, atol=1e-4)
    expected_forced = ensemble.score(tf.constant(SENTENCES), tf.constant(REFERENCES)).numpy()
    np.testing.assert_allclose(served["forced"], expected_forced, rtol=1e-4, atol=1e-4)
    # The ensemble's forced scores are neither member's (each member's distribution alone).
    for member in (translator, other):
        alone = member.score(tf.constant(SENTENCES), tf.constant(REFERENCES)).numpy()
        assert np.abs(alone - expected_forced).max() > 1e-3
    rebuilt = load_keras_translator(tmp_path / "ensemble", beam_size=3, alpha=0.6, max_extra=8)
    assert len(rebuilt.models) == 2 and rebuilt(SENTENCES) == ensemble(SENTENCES)


def test_exported_config_records_the_decoding_the_graph_does(exported):
    """The translator decodes with max_extra 8, its config says 50: the export's model.yaml says 8, so the
    rebuilt Keras translator decodes as the graph does."""
    directory, translator = exported
    config = kt.TransformerConfig.from_yaml(directory / "assets.extra" / "model.yaml")
    assert (config.beam_size, config.length_penalty, config.max_decode_extra, config.early_exit) == (3, 0.6, 8, False)
    rebuilt = load_keras_translator(directory)
    assert (rebuilt.beam_size, rebuilt.alpha, rebuilt.max_extra, rebuilt.early_exit) == (3, 0.6, 8, False)


def test_ids_signature_matches_the_string_signature(exported):
    directory, translator = exported
    loaded = load_exported(directory)
    source_ids = translator.encode_sources(tf.constant(SENTENCES))
    by_ids = loaded.signatures["translate_ids"](source_ids=source_ids)
    expected = translator.translate(tf.constant(SENTENCES))
    detokenized = translator.target_tokenizer.detokenize(by_ids["tokens"]).numpy()
    assert detokenized.tolist() == expected["translation"].numpy().tolist()
    np.testing.assert_allclose(by_ids["score"].numpy(), expected["score"].numpy(), atol=1e-4)


def test_score_signature_refuses_a_different_number_of_targets(exported):
    """Two sources and one target gave two identical scores (the target broadcast over the batch)."""
    directory, _ = exported
    score = load_exported(directory).signatures["score"]
    for sources, targets in ((2, 1), (1, 2)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"got\] \[{sources}\] \[source\(s\) but\] \[{targets}\] \[target\(s\); give"):
            score(sources=tf.constant(SENTENCES[:sources]), targets=tf.constant(REFERENCES[:targets]))


def test_keras_model_travels_in_assets_extra(exported):
    directory, translator = exported
    assert (directory / "assets" / "sentencepiece.model").exists()
    rebuilt = load_keras_translator(directory, beam_size=3, alpha=0.6, max_extra=8)
    assert rebuilt(SENTENCES) == translator(SENTENCES)


def test_each_signature_is_traced_and_written_once(exported):
    """Given concrete functions traced outside its save context, `save` traced every signature again and wrote
    both copies (twice the export time and a saved_model.pb twice the size)."""
    import re

    directory, _ = exported
    names = [f.signature.name for f in saved_model_proto(directory).meta_graphs[0].graph_def.library.function]
    for signature in ("serve", "translate_ids"):  # n_best and score share their names with the Translator's
        assert len([n for n in names if re.fullmatch(rf"__inference_{signature}_\d+", n)]) == 1, sorted(names)


def test_saved_model_stores_each_weight_once(exported):
    directory, translator = exported
    stored = [node.variable for node in saved_model_proto(directory).meta_graphs[0].object_graph_def.nodes
              if node.WhichOneof("kind") == "variable"]
    assert sorted(v.name for v in stored) == sorted(v.path for v in translator.model.variables)
    data = sum(f.stat().st_size for f in (directory / "variables").glob("variables.data-*"))
    weights = sum(np.prod(v.shape) * 4 for v in translator.model.variables)
    assert weights <= data < 1.1 * weights


SAVED_MODEL_CLI = ("import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
                   "sys.argv[0] = 'saved_model_cli'; saved_model_cli.main()")


def test_saved_model_cli_show_and_run(exported):
    directory, _ = exported
    shown = subprocess.run([os.path.join(BIN, "saved_model_cli"), "show", "--all", "--dir", str(directory)],
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    for name in ("serving_default", "n_best", "translate_ids", "score", "translation"):
        assert name in shown.stdout
    # `run` executes the graph, so the tensorflow-text ops must be registered first (docs/serving.md).
    ran = subprocess.run([sys.executable, "-c", SAVED_MODEL_CLI, "run", "--dir", str(directory), "--tag_set",
                          "serve", "--signature_def", "serving_default", "--input_exprs",
                          'inputs=["A man rides a bike.", "A dog."]'], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "Result for output key translation" in ran.stdout
    score_line = ran.stdout.split("Result for output key score:")[1].strip().splitlines()[0]
    assert len(score_line.strip("[]").split()) == 2  # one score per input sentence


def test_missing_export_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="saved_model.pb is missing"):
        load_exported(tmp_path)
    with pytest.raises(FileNotFoundError, match="no Keras weights"):
        load_keras_translator(tmp_path)


def test_an_existing_export_is_kept_unless_overwrite_is_asked(exported):
    directory, translator = exported
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    with pytest.raises(FileExistsError, match="already holds a SavedModel; replace it with --overwrite"):
        export_translator(translator, directory)
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before

