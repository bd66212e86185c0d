"""SavedModel export: a TensorFlow-only process reproduces the in-memory Translator; bad inputs never crash."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from factories import seeded_weights

import keras_transformer as kt
from keras_transformer import load_translator
from keras_transformer.data.tokenizers import train_tokenizers
from keras_transformer.engines.tensorflow import TRAINED_CHUNK_SIZE, Translator
from keras_transformer.errors import ConfigError
from keras_transformer.evaluation import read_lines
from keras_transformer.exports.savedmodel import TranslatorModule, export_translator, load_exported
from keras_transformer.exports.warmup import read_warmup_file, warm_up, warmup_requests
from keras_transformer.workdir.checkpoints import read_model_file

# Its module fixtures are expensive: `make test` (--dist loadgroup) runs the whole file on one worker, so they
# are built once.
pytestmark = pytest.mark.xdist_group("test_export")

SENTENCES = ["A man rides a bike.", "Two dogs play in the snow.", "A girl in a pink dress is jumping."]
REFERENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Mädchen in einem rosa Kleid springt."]
BAD_INPUTS = ["", "   \t ", " ".join(["word"] * 3000), "\u4e24\u53ea\u72d7\u5728\u96ea\u5730\u91cc\u73a9",
              "Ein Mann \u0444\u043e\u0442\u043e \u03b1\u03b2\u03b3 \U0001F600"]
BIN = os.path.dirname(sys.executable)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_a_full_disk_during_an_export_ends_in_one_line_and_leaves_the_old_export(exported, tmp_path, monkeypatch,
                                                                                 capsys):
    """TensorFlow reports a full disk while writing the SavedModel (a `ResourceExhaustedError`): `export` ends in
    one line of ours that names --out and the space left there, status 4, no traceback; the old export at --out
    is untouched and nothing is left beside it."""
    from keras_transformer import cli
    directory, _ = exported
    served = tmp_path / "served"
    shutil.copytree(directory, served)
    before = {path: path.read_bytes() for path in served.rglob("*") if path.is_file()}

    def full_disk(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, f"{served}/variables/variables.data-00000-of-00001"
                                                           ".tempstate1; No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", full_disk)
    assert cli.main(["export", "--workdir", str(directory), "--out", str(served), "--overwrite", "--no-xla"]) == 4
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("keras-transformer export: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"out of disk space writing {served} (" in lines[0] and "nothing was lost" in lines[0]
    assert {path: path.read_bytes() for path in served.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["served"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, multi30k_dir):
    """A small model with seeded weights and Multi30k val tokenizers, exported once for the module."""
    english = read_lines(multi30k_dir / "val.en.gz")[:300]
    german = read_lines(multi30k_dir / "val.de.gz")[:300]
    source_tokenizer, target_tokenizer = train_tokenizers(english, german, vocab_size=400)
    config = kt.TransformerConfig.preset("tiny", vocab_size=source_tokenizer.vocab_size, num_layers=1, d_model=32,
                                         d_ff=64, max_length=48)
    model = seeded_weights(kt.build_model(config), 3)
    translator = Translator(model, source_tokenizer, target_tokenizer, beam_size=3, alpha=0.6, max_extra=8)
    directory = tmp_path_factory.mktemp("export") / "en_de"
    export_translator(translator, directory, config=config)
    return directory, translator


@pytest.fixture(scope="module")
def exported_ensemble(exported, tmp_path_factory):
    """`(directory, ensemble, other, configs)`: `exported`'s translator and a model of another shape (d_model 48,
    post-norm, relative positions of Shaw et al. with k = 3) sharing its tokenizers, exported as one SavedModel
    decoding their ensemble (under XLA, as every export)."""
    directory, translator = exported
    config = kt.TransformerConfig.from_yaml(directory / "assets.extra" / "model.yaml")
    other_config = kt.TransformerConfig.preset("tiny", vocab_size=config.vocab_size, num_layers=1, d_model=48,
                                               num_heads=4, d_ff=96, max_length=48, norm_first=False,
                                               position="relative", max_relative_position=3)
    other = Translator(seeded_weights(kt.build_model(other_config), 5), translator.source_tokenizer,
                       translator.target_tokenizer)
    ensemble = Translator.ensemble([translator, other])
    out = tmp_path_factory.mktemp("ensemble") / "ensemble"
    export_translator(ensemble, out, config=[config, other_config])
    return out, ensemble, other, (config, other_config)


TF_ONLY_CLIENT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
results = []
decode = lambda values: [v.decode("utf-8") for v in values]
for directory, texts, references, every_check in json.loads(sys.argv[1]):
    loaded = tf.saved_model.load(directory)
    raw = [t.encode("utf-8") for t in texts] + [b"bad \\xff\\xfe bytes \\xc3"]
    signatures = loaded.signatures
    served = signatures["serving_default"](tf.constant(raw))
    forced = signatures["score"](sources=tf.constant(raw[:3]), targets=tf.constant(references))
    result = {"translation": decode(served["translation"].numpy()), "score": served["score"].numpy().tolist(),
              "forced": forced["score"].numpy().tolist()}
    if every_check:  # the other signatures and batches (each signature's first call costs a graph optimisation)
        alone = signatures["serving_default"](tf.constant(raw[:1]))
        nothing = tf.constant([], dtype=tf.string)
        empty = signatures["serving_default"](nothing)
        empty_score = signatures["score"](sources=nothing, targets=nothing)  # in one pass, a (0, 0, 1) gather failed
        n_best = signatures["n_best"](tf.constant(raw[:3]))
        result.update({"alone": decode(alone["translation"].numpy()), "empty_shape": list(empty["translation"].shape),
                       "empty_score_shape": list(empty_score["score"].shape),
                       "n_best": [decode(row) for row in n_best["translations"].numpy()],
                       "n_best_scores": n_best["scores"].numpy().tolist()})
    results.append(result)
assert not any(name.startswith("keras_transformer") for name in sys.modules)
print(json.dumps(results))
"""

# A serving process (TensorFlow and tensorflow-text only) given one request of `count` short sentences through
# `score` (as many pairs), then through `serving_default`: it prints how far its resident memory rose above that
# of the loaded model (VmRSS after loading; VmHWM, the peak, restarted there) by the end of each.
MEMORY_CLIENT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

def mib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":")) / 1024

directory, count = sys.argv[1], int(sys.argv[2])
english = ["A dog runs.", "Two men sit.", "A girl jumps."]
german = ["Ein Hund rennt.", "Zwei Männer sitzen.", "Ein Mädchen springt."]
sources = tf.constant([english[i % 3] for i in range(count)])
targets = tf.constant([german[i % 3] for i in range(count)])
signatures = tf.saved_model.load(directory).signatures
loaded = mib("VmRSS")
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # Linux: the peak (VmHWM) restarts from the present resident size
scores = signatures["score"](sources=sources, targets=targets)["score"]
after_score = mib("VmHWM")
translations = signatures["serving_default"](sources)["translation"]
assert scores.shape == [count] and translations.shape == [count], (scores.shape, translations.shape)
print(json.dumps({"loaded": loaded, "score": after_score - loaded, "serving_default": mib("VmHWM") - loaded}))
"""

SAVED_MODEL_CLI = ("import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
                   "sys.argv[0] = 'saved_model_cli'; saved_model_cli.main()")


def run(command, timeout=600):
    """`(returncode, stdout, stderr)` of `command` (a list) run to its end."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def subprocesses(exported, exported_ensemble):
    """The module's fresh processes (each pays seconds to import TensorFlow), one after the other: side by side
    they would contend for the cores with the other pytest workers.

    - `client`: one interpreter importing only tensorflow and tensorflow_text that serves both exports
      (`exported` on SENTENCES + BAD_INPUTS through every signature, the ensemble on SENTENCES + 2 bad inputs
      through `serving_default` and `score`; each plus invalid UTF-8);
    - `show`: the `saved_model_cli show --all` command on `exported`;
    - `run`: `saved_model_cli run` on `exported`, the tensorflow-text ops registered first (docs/serving.md).
    """
    jobs = [[str(exported[0]), SENTENCES + BAD_INPUTS, REFERENCES, True],
            [str(exported_ensemble[0]), SENTENCES + BAD_INPUTS[:2], REFERENCES, False]]
    return {
        "client": run([sys.executable, "-c", TF_ONLY_CLIENT, json.dumps(jobs)]),
        "show": run([os.path.join(BIN, "saved_model_cli"), "show", "--all", "--dir", str(exported[0])]),
        "run": run([sys.executable, "-c", SAVED_MODEL_CLI, "run", "--dir", str(exported[0]), "--tag_set", "serve",
                    "--signature_def", "serving_default", "--input_exprs", 'inputs=["A man rides a bike.", "A dog."]']),
    }


@pytest.fixture(scope="module")
def served(subprocesses):
    """`(single, ensemble)`: what the TensorFlow-only client printed for each export."""
    returncode, stdout, stderr = subprocesses["client"]
    assert returncode == 0, stderr[-3000:]
    # An export written without its gradient functions warned at every load, once per function.
    assert "unsaved custom gradients" not in stderr, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def loaded(exported):
    """`exported` loaded back with `load_exported`, shared by the tests calling its signatures in process."""
    return load_exported(exported[0])


def saved_model_proto(directory):
    """The `SavedModel` protocol buffer of an export's `saved_model.pb`."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((directory / "saved_model.pb").read_bytes())
    return saved


@pytest.mark.slow
def test_tensorflow_only_process_serves_what_the_in_memory_translator_gives(exported, served):
    """Slow: compares a SavedModel loaded in a TensorFlow-only process with the in-memory translator it came from."""
    directory, translator = exported
    served = served[0]
    texts = SENTENCES + BAD_INPUTS
    raw = [t.encode("utf-8") for t in texts] + [b"bad \xff\xfe bytes \xc3"]
    expected = translator.translate(tf.constant(raw))
    # Exactly the in-memory translations, for normal and bad inputs alike; one output per input.
    assert served["translation"] == [t.decode("utf-8") for t in expected["translation"].numpy()]
    np.testing.assert_allclose(served["score"], expected["score"].numpy(), rtol=1e-4, atol=1e-4)
    assert len(served["translation"]) == len(raw) and np.all(np.isfinite(served["score"]))
    assert served["translation"][3] == "" and served["translation"][4] == ""  # empty, whitespace only
    assert served["alone"][0] == served["translation"][0]  # a mixed batch changes no sentence's translation
    assert served["empty_shape"] == [0] and served["empty_score_shape"] == [0]
    # n-best: beam_size hypotheses, best first, the first one being the translation.
    assert [len(row) for row in served["n_best"]] == [3, 3, 3]
    scores = np.array(served["n_best_scores"])
    assert np.all(scores[:, :-1] >= scores[:, 1:] - 1e-6)
    assert [row[0] for row in served["n_best"]] == served["translation"][:3]
    # Forced decoding (scoring given translations) agrees with the in-memory Translator.
    expected_forced = translator.score(tf.constant(SENTENCES), tf.constant(REFERENCES)).numpy()
    np.testing.assert_allclose(served["forced"], expected_forced, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_exported_ensemble_serves_what_the_in_memory_ensemble_gives(exported, exported_ensemble, served, tmp_path):
    """Two models (of different shapes) sharing the tokenizers export as one SavedModel decoding their ensemble."""
    directory, translator = exported
    ensemble_directory, ensemble, other, (config, other_config) = exported_ensemble
    assert len(ensemble.models) == 2 and (ensemble.beam_size, ensemble.alpha) == (3, 0.6)
    with pytest.raises(AttributeError, match="ensemble of 2 models"):
        ensemble.model
    with pytest.raises(ValueError, match="one config per model"):
        export_translator(ensemble, tmp_path / "bad", config=config)
    assert sorted(p.name for p in (ensemble_directory / "assets.extra" / "members").iterdir()) == ["0", "1"]

    served = served[1]
    texts = SENTENCES + BAD_INPUTS[:2]
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
    rebuilt = load_translator(ensemble_directory, beam_size=3, alpha=0.6, max_extra=8)
    assert len(rebuilt.models) == 2 and rebuilt(SENTENCES) == ensemble(SENTENCES)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_exported_config_records_the_decoding_the_graph_does(exported):
    """The translator decodes with max_extra 8, the default is 50: the export's model.yaml says 8, so the
    rebuilt Keras translator decodes as the graph does."""
    directory, translator = exported
    _, options = read_model_file(directory / "assets.extra" / "model.yaml")
    assert options == kt.DecodeOptions(beam_size=3, alpha=0.6, max_extra=8, early_exit=False)
    rebuilt = load_translator(directory)
    assert (rebuilt.beam_size, rebuilt.alpha, rebuilt.max_extra, rebuilt.early_exit) == (3, 0.6, 8, False)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_ids_signature_matches_the_string_signature(exported, loaded):
    """The exported `translate_ids` signature, given the source ids, decodes what the string signature does
    (the same tokens detokenized, scores within 1e-4)."""
    directory, translator = exported
    source_ids = translator.encode_sources(tf.constant(SENTENCES))
    by_ids = loaded.signatures["translate_ids"](source_ids=source_ids)
    expected = translator.translate(tf.constant(SENTENCES))
    detokenized = translator.target_tokenizer.detokenize(by_ids["tokens"]).numpy()
    assert detokenized.tolist() == expected["translation"].numpy().tolist()
    np.testing.assert_allclose(by_ids["score"].numpy(), expected["score"].numpy(), atol=1e-4)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_score_signature_refuses_a_different_number_of_targets(loaded):
    """Two sources and one target gave two identical scores (the target broadcast over the batch)."""
    score = loaded.signatures["score"]
    for sources, targets in ((2, 1), (1, 2)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"got\] \[{sources}\] \[source\(s\) but\] \[{targets}\] \[target\(s\); give"):
            score(sources=tf.constant(SENTENCES[:sources]), targets=tf.constant(REFERENCES[:targets]))


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_keras_model_travels_in_assets_extra(exported):
    """The export carries the SentencePiece model and the Keras model: `load_translator` on the folder rebuilds a
    translator that translates as the exported one."""
    directory, translator = exported
    assert (directory / "assets" / "sentencepiece.model").exists()
    rebuilt = load_translator(directory, beam_size=3, alpha=0.6, max_extra=8)
    assert rebuilt(SENTENCES) == translator(SENTENCES)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_each_signature_is_traced_and_written_once(exported):
    """Given concrete functions traced outside its save context, `save` traced every signature again and wrote
    both copies (twice the export time and a saved_model.pb twice the size)."""
    import re

    directory, translator = exported
    names = [f.signature.name for f in saved_model_proto(directory).meta_graphs[0].graph_def.library.function]
    for signature in ("serve", "translate_ids"):  # n_best and score share their names with the Translator's
        assert len([n for n in names if re.fullmatch(rf"__inference_{signature}_\d+", n)]) == 1, sorted(names)
    # The search on a chunk is a function of its own per distinct setting, called by each signature decoding with
    # it: serving_default and translate_ids share the best-hypothesis one; n_best, translate_prefix and sample
    # have theirs. (Inlined into each signature, it was traced five times.)
    assert len([n for n in names if re.fullmatch(r"__inference__search_ids_\d+", n)]) == 4, sorted(names)
    assert not translator.jit_compile  # an uncompiled Translator (`export --no-xla`) exports without XLA
    assert b"_XlaMustCompile" not in (directory / "saved_model.pb").read_bytes()


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_saved_model_stores_each_weight_once(exported):
    """The SavedModel stores each of the model's variables once: its variables data holds 1x to 1.1x the weights'
    bytes."""
    directory, translator = exported
    stored = [node.variable for node in saved_model_proto(directory).meta_graphs[0].object_graph_def.nodes
              if node.WhichOneof("kind") == "variable"]
    assert sorted(v.name for v in stored) == sorted(v.path for v in translator.model.variables)
    data = sum(f.stat().st_size for f in (directory / "variables").glob("variables.data-*"))
    weights = sum(np.prod(v.shape) * 4 for v in translator.model.variables)
    assert weights <= data < 1.1 * weights


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_saved_model_cli_show_and_run(subprocesses):
    """`saved_model_cli show` lists the signatures and `run` executes serving_default in a fresh process (the
    tensorflow-text ops registered first), one score per sentence."""
    returncode, shown, stderr = subprocesses["show"]
    assert returncode == 0, stderr[-2000:]
    for name in ("serving_default", "n_best", "translate_ids", "score", "translation"):
        assert name in shown
    # `run` executes the graph, so the tensorflow-text ops must be registered first (docs/serving.md).
    returncode, ran, stderr = subprocesses["run"]
    assert returncode == 0, stderr[-2000:]
    assert "Result for output key translation" in ran
    score_line = ran.split("Result for output key score:")[1].strip().splitlines()[0]
    assert len(score_line.strip("[]").split()) == 2  # one score per input sentence


def _decoded(outputs):
    return [t.decode("utf-8") for t in outputs["translation"].numpy()]


def _served(directory):
    return _decoded(load_exported(directory).signatures["serving_default"](tf.constant(SENTENCES)))


@pytest.mark.slow
def test_a_re_export_that_fails_part_way_leaves_the_old_export_serving(exported, loaded, tmp_path, monkeypatch):
    """Re-exported over an export with other weights, a write that fails part way (a full disk, say, with the graph
    file half written) leaves the old export whole, its graph and its Keras weights, and nothing half-written
    beside it; a re-export that succeeds keeps the folder's other files (the model card), and the folder is
    readable by other accounts as any new folder is."""
    directory, translator = exported
    config = kt.TransformerConfig.from_yaml(directory / "assets.extra" / "model.yaml")
    retrained = Translator(seeded_weights(kt.build_model(config), 11), translator.source_tokenizer,
                           translator.target_tokenizer, beam_size=3, alpha=0.6, max_extra=8)
    served = tmp_path / "served"
    shutil.copytree(directory, served)
    (served / "README.md").write_text("model card", encoding="utf-8")
    # What the old export serves: `loaded` holds the same files, so this load's graph optimisations are shared.
    before = _decoded(loaded.signatures["serving_default"](tf.constant(SENTENCES)))
    weights = (served / "assets.extra" / "model.weights.h5").read_bytes()
    files = {path: path.read_bytes() for path in served.rglob("*") if path.is_file()}
    graph = (directory / "saved_model.pb").read_bytes()

    def write_part_then_fail(module, export_dir, *args, **kwargs):  # (the real save's tracing is not the point)
        os.makedirs(export_dir, exist_ok=True)
        with open(os.path.join(export_dir, "saved_model.pb"), "wb") as handle:
            handle.write(graph[:len(graph) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", write_part_then_fail)
    with pytest.raises(OSError, match="No space left on device"):
        export_translator(retrained, served, config=config, overwrite=True)
    monkeypatch.undo()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["served"]
    assert {path: path.read_bytes() for path in served.rglob("*") if path.is_file()} == files  # it serves as before
    assert (served / "assets.extra" / "model.weights.h5").read_bytes() == weights
    export_translator(retrained, served, config=config, overwrite=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["served"]
    assert (served / "README.md").read_text(encoding="utf-8") == "model card"
    assert _served(served) == [retrained.translate_lines([s])[0] for s in SENTENCES] != before
    umask = os.umask(0)
    os.umask(umask)
    assert served.stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_out_is_refused_in_a_training_workdir_or_over_a_folder_that_is_not_an_export(exported, tmp_path):
    """An export into a training workdir, or over a folder that is not an export, is refused and leaves both as
    they were."""
    _, translator = exported
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "model.yaml").write_text("d_model: 32\n", encoding="utf-8")
    for out in (workdir, workdir / "export"):
        with pytest.raises(ConfigError, match=f"training workdir {workdir}"):
            export_translator(translator, out, overwrite=True)
    assert sorted(path.name for path in workdir.iterdir()) == ["checkpoints", "model.yaml"]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(FileExistsError, match="is not a SavedModel export"):
        export_translator(translator, notes, overwrite=True)
    assert sorted(path.name for path in notes.iterdir()) == ["todo.txt"]


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_a_translator_of_one_search_per_batch_is_exported_in_chunks(exported):
    """`chunk_size=0` (one search per batch, for callers that bound their batches) would let a request's size set
    the memory a server needs: the export serves the same models and settings in chunks instead."""
    _, translator = exported
    one_search = Translator.ensemble([translator], chunk_size=0)
    served = TranslatorModule(one_search).translator
    assert served.chunk_size == TRAINED_CHUNK_SIZE and served.models == one_search.models
    assert ((served.beam_size, served.alpha, served.max_extra, served.early_exit)
            == (one_search.beam_size, one_search.alpha, one_search.max_extra, one_search.early_exit))
    assert TranslatorModule(translator).translator is translator  # chunked already: served as it is


def test_missing_export_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="saved_model.pb is missing"):
        load_exported(tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a model folder"):
        load_translator(tmp_path)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_an_existing_export_is_kept_unless_overwrite_is_asked(exported):
    """An export over an existing one without overwrite is refused naming --overwrite, every file left untouched."""
    directory, translator = exported
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    with pytest.raises(FileExistsError, match="already holds a SavedModel; replace it with --overwrite"):
        export_translator(translator, directory)
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before


@pytest.mark.slow
def test_a_request_of_10000_sentences_is_served_in_bounded_memory(exported):
    """Every signature works through a request in chunks: 10,000 sentences (and 10,000 pairs for `score`) raise a
    serving process's memory at most twice as much as 64 do.

    Compared: in a fresh process per request size, the peak resident memory (VmHWM) above the resident memory of
    the loaded model, after a `score` request and then after a `serving_default` one (so the second figure is
    the process's peak over both); both sizes pay the same first-call costs (the graph optimisations). The export
    is a `Translator` built with the default `chunk_size`. Before chunking, `score` held (N, T, V) float32 logits
    for the whole request (10,000 x 64 x 8,000 is 20 GB), and a `Translator` built directly searched its whole
    request at once: 10,000 sentences rose by 442 and 560 MB, 64 by 27 and 50 MB (now 34 and 65 against 30 and
    57; one run on the 2-core development machine).
    """
    directory, _ = exported
    rose = {}
    for count in (64, 10_000):  # one process after the other, so that neither slows the other down
        returncode, stdout, stderr = run([sys.executable, "-c", MEMORY_CLIENT, str(directory), str(count)])
        assert returncode == 0, stderr[-3000:]
        rose[count] = json.loads(stdout.strip().splitlines()[-1])
    for signature in ("score", "serving_default"):
        assert rose[10_000][signature] <= 2 * rose[64][signature], rose


@pytest.mark.slow
def test_the_sample_signature_draws_what_the_translator_draws(exported, loaded):
    """With a fixed seed the exported SavedModel's `sample` signature (settings as inputs, under XLA) and a
    Translator sampling with the same options give identical samples, whatever the batch: a sentence's draws depend
    on the seed and the sentence only. Another seed draws others."""
    directory, translator = exported
    options = translator.options.replace(strategy="sample", top_k=20, top_p=0.95, temperature=1.3, seed=11)
    sampling = Translator(translator.model, translator.source_tokenizer, translator.target_tokenizer, options)
    sample = loaded.signatures["sample"]
    settings = dict(seed=tf.constant(11), temperature=tf.constant(1.3), top_k=tf.constant(20), top_p=tf.constant(0.95))
    served = sample(inputs=tf.constant(SENTENCES + REFERENCES), **settings)
    texts = [t.decode("utf-8") for t in served["translation"].numpy()]
    assert texts == sampling.translate_lines(SENTENCES + REFERENCES, batch_size=2)
    reordered = sample(inputs=tf.constant(REFERENCES[::-1] + SENTENCES[:1]), **settings)["translation"].numpy()
    assert [t.decode("utf-8") for t in reordered] == texts[3:][::-1] + texts[:1]
    in_memory = sampling.sample(tf.constant(SENTENCES + REFERENCES), **settings)
    np.testing.assert_allclose(served["score"].numpy(), in_memory["score"].numpy(), atol=1e-4)
    other = sample(inputs=tf.constant(SENTENCES + REFERENCES), **{**settings, "seed": tf.constant(12)})
    assert [t.decode("utf-8") for t in other["translation"].numpy()] != texts


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_the_translate_prefix_signature_forces_what_the_translator_forces(exported, loaded):
    """The export's `translate_prefix` signature (an input of its own) gives what the in-memory Translator gives
    with those target prefixes: each translation starts with its prefix, scored with it; "" forces nothing (the
    `serving_default` translation); a prefix leaving no room for a decoded token fails in the graph, naming it."""
    directory, translator = exported
    prefixes = ["Ein Hund", "", "Eine Frau in"]
    served = loaded.signatures["translate_prefix"](inputs=tf.constant(SENTENCES), target_prefix=tf.constant(prefixes))
    texts = [t.decode("utf-8") for t in served["translation"].numpy()]
    assert texts[0].startswith("Ein Hund") and texts[2].startswith("Eine Frau in")
    # The in-memory Translator's method, run eagerly (the same ops, without tracing a second graph).
    in_memory = translator.translate_prefixed.python_function(tf.constant(SENTENCES), tf.constant(prefixes))
    assert texts == [t.decode("utf-8") for t in in_memory["translation"].numpy()]
    np.testing.assert_allclose(served["score"].numpy(), in_memory["score"].numpy(), atol=1e-4)
    plain = loaded.signatures["serving_default"](tf.constant(SENTENCES[1:2]))
    assert texts[1] == plain["translation"].numpy()[0].decode("utf-8")
    with pytest.raises(tf.errors.InvalidArgumentError, match="target prefix: a prefix of.*leaves no room"):
        loaded.signatures["translate_prefix"](inputs=tf.constant(SENTENCES[:1]),
                                              target_prefix=tf.constant(["Ein " * 60]))


# Sentence 1: a one-word and a two-word constraint (forms of one: a tab between); 2: a non-ASCII term; 3: none;
# 4 (a source of 6 tokens, room for 14): two terms of 7 and 8 tokens, of which only the shorter fits.
TERM_LINES = SENTENCES + ["A dog."]
TERM_SLOTS = [["Fahrrad\tRad", "ein Mann"], ["Schnee", "Mädchen"], ["", ""],
              ["auf der Straße", "Eine Frau in einem"]]


@pytest.mark.slow
def test_the_translate_constrained_signature_gives_the_engine_s_constrained_translations(exported, loaded):
    """The export's `translate_constrained` signature (terms as text, tokenized and checked in the graph) gives
    what the engine loaded from the same folder gives with those terms (`translate_terms`): the same translations,
    scores, and constraints reported unmet; a term too long for the sentence's length limit is reported, not crashed
    on; banned phrases hold in both. Slow: the engine is loaded from the export and decodes eagerly, and the
    signature's constrained search is optimised on its first call (about 45 s on 2 cores)."""
    directory, _ = exported
    engine = load_translator(directory)
    given = [[tuple(slot.split("\t")) for slot in row if slot] for row in TERM_SLOTS]
    banned = ["im"]
    expected = [hypotheses[0] for hypotheses in engine.translate_terms(TERM_LINES, given, banned=banned)]
    served = loaded.signatures["translate_constrained"](
        inputs=tf.constant(TERM_LINES), constraints=tf.constant(TERM_SLOTS),
        banned=tf.constant([banned] * len(TERM_LINES)))
    assert [t.decode("utf-8") for t in served["translation"].numpy()] == [e["translation"] for e in expected]
    np.testing.assert_allclose(served["score"].numpy(), [e["score"] for e in expected], atol=1e-4)
    unmet = [[slot for slot, met in zip(row, flags) if slot and not met]
             for row, flags in zip(TERM_SLOTS, served["met"].numpy().tolist())]
    assert unmet == [["\t".join(u) if isinstance(u, list) else u for u in e["unmet"]] for e in expected]
    assert unmet[:3] == [[], [], []] and len(unmet[3]) == 1  # the longer of sentence 4's terms did not fit
    assert served["met"].numpy()[2].tolist() == [True, True]  # empty slots
    assert not any(" im " in f" {e['translation']} " for e in expected)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_the_translate_constrained_signature_refuses_terms_over_the_limits_in_the_graph(loaded):
    """Over-limit terms (more slots than `MAX_CONSTRAINTS`, a term of more than `MAX_TERM_TOKENS` tokens, other row
    counts) fail inside the graph with a message naming the limit, as a TensorFlow Serving client sees them."""
    signature = loaded.signatures["translate_constrained"]
    one = tf.constant(SENTENCES[:1])
    nothing = tf.constant([[""]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="constraints: rows of.*17.*at most 16 per line"):
        signature(inputs=one, constraints=tf.constant([["Hund"] * 17]), banned=nothing)
    with pytest.raises(tf.errors.InvalidArgumentError, match="constraints: a term of.*at most 8"):
        signature(inputs=one, constraints=tf.constant([["Ein Mann fährt mit einem roten Fahrrad die Straße"]]),
                  banned=nothing)
    with pytest.raises(tf.errors.InvalidArgumentError, match="banned: a term of.*at most 8"):
        signature(inputs=one, constraints=nothing,
                  banned=tf.constant([["Ein Mann fährt mit einem roten Fahrrad die Straße"]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="1.*sentence.*but.*2.*row.*of constraints"):
        signature(inputs=one, constraints=tf.constant([["Hund"], ["Katze"]]), banned=nothing)


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_the_warmup_file_is_tensorflow_servings_and_replays_through_the_export(exported, loaded):
    """TensorFlow Serving replays `assets.extra/tf_serving_warmup_requests` when it loads an export: its own
    protocol buffers (tensorflow-serving-api) read every record, and each request, run through the loaded
    export, gives what the in-memory translator gives. `warm_up` replays the same requests."""
    from tensorflow_serving.apis import prediction_log_pb2

    directory, translator = exported
    requests = []
    for record in tf.data.TFRecordDataset(str(directory / "assets.extra" / "tf_serving_warmup_requests")):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        assert log.WhichOneof("log_type") == "predict_log"
        request = log.predict_log.request
        requests.append((request.model_spec.signature_name,
                         {name: tf.make_ndarray(tensor) for name, tensor in request.inputs.items()}))
    # This export has no XLA, so no shapes to compile: one request per signature sets up its graph.
    assert sorted(name for name, _ in requests) == ["n_best", "score", "serving_default", "translate_ids"]
    for name, inputs in requests:
        outputs = loaded.signatures[name](**{key: tf.constant(value) for key, value in inputs.items()})
        if name in ("serving_default", "n_best"):
            expected = translator.translate(tf.constant(inputs["inputs"]))["translation"].numpy()
            got = outputs["translation"] if name == "serving_default" else outputs["translations"][:, 0]
            assert got.numpy().tolist() == expected.tolist() and all(expected)
        else:
            assert np.all(np.isfinite(outputs["score"].numpy()))
    assert [(name, sorted(inputs)) for name, inputs in read_warmup_file(directory)] == [
        (name, sorted(inputs)) for name, inputs in requests]
    assert warm_up(directory, loaded) is loaded


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_warmup_requests_cover_every_shape_xla_compiles(exported, tmp_path):
    """With XLA a chunk is padded to a (rows, width) bucket, one program each: rows 1, 2, 4 or 8 (the last chunk
    holds the request's remainder) and width 16, 32 or 48 (this model's max_length) whatever the rows. The
    warm-up holds one request per bucket for serving_default and for n_best (another program: more
    hypotheses). An export written before warm-up files is named with the fix."""
    _, translator = exported
    compiled = Translator.ensemble([translator], jit_compile=True)
    buckets = {}
    for name, inputs in warmup_requests(compiled):
        if name in ("serving_default", "n_best"):
            lengths = np.sum(compiled.encode_sources(tf.constant(inputs["inputs"])).numpy() != 0, axis=1)
            rows = next(size for size in (1, 2, 4, 8) if size >= len(lengths))
            width = next(size for size in (16, 32, 48) if size >= lengths.max())
            buckets.setdefault(name, []).append((rows, width))
    every = [(rows, width) for rows in (1, 2, 4, 8) for width in (16, 32, 48)]
    assert sorted(buckets["serving_default"]) == sorted(buckets["n_best"]) == every
    with pytest.raises(FileNotFoundError, match="export it again"):
        read_warmup_file(tmp_path)


# ------------------------------------------------------------------ one writer, a manifest, a swap without a gap
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(REPO, "saved_models", "multi30k_en_de")

# Swaps the export in argv[1] (marked "new") in for argv[2] through `writing_export`, the code both exporters
# use, and dies (os._exit, as kill -9) before the swap's step number argv[3]; argv[4] "fallback" takes away the
# atomic exchange. Prints the steps it took when it is not killed.
SWAP_AND_DIE = """
import os, shutil, sys
from keras_transformer import files
from keras_transformer.exports import folder as export_folder
source, out, kill_at, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if mode == "fallback":
    def no_exchange(first, second):
        raise OSError(38, "Function not implemented")
    files.exchange_paths = no_exchange
steps = []
def step(name, function):
    def run(*args, **kwargs):
        if len(steps) == kill_at:
            os._exit(9)
        steps.append(name)
        return function(*args, **kwargs)
    return run
with export_folder.writing_export(out) as staging:
    shutil.copytree(source, staging, dirs_exist_ok=True)
    for module, name in ((os, "replace"), (os, "rename"), (files, "exchange_paths"), (shutil, "rmtree")):
        setattr(module, name, step(name, getattr(module, name)))
print(" ".join(steps))
"""


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_a_kill_at_any_step_of_the_swap_leaves_a_whole_export_that_loads_and_the_next_export_cleans_up(
        exported, tmp_path):
    """Killed before each step of the swap (the manifest's rename, the exchange; or, without an atomic exchange,
    the two renames; then the old export's removal), `--out` holds a whole export, the old or the new, that
    loads; one killed between the fallback's two renames is put back by the next load. The next export removes
    whatever the killed one left beside `--out`."""
    from keras_transformer.exports import folder as export_folder
    from keras_transformer.workdir.checkpoints import load_models, model_folder

    directory, _ = exported
    new = tmp_path / "new"
    shutil.copytree(directory, new)
    (new / "NEW").write_text("the new export", encoding="utf-8")
    for mode, expected in (("exchange", ["replace", "exchange_paths", "rmtree"]),
                           ("fallback", ["replace", "exchange_paths", "replace", "replace", "rmtree"])):
        for kill_at in range(len(expected) + 1):
            parent = tmp_path / f"{mode}-{kill_at}"
            out = parent / "en_de"
            shutil.copytree(directory, out)
            done = subprocess.run([sys.executable, "-c", SWAP_AND_DIE, str(new), str(out), str(kill_at), mode],
                                  cwd=REPO, capture_output=True, text=True, timeout=60)
            if kill_at == len(expected):
                assert done.returncode == 0 and done.stdout.split() == expected, (mode, done.stderr[-2000:])
            else:
                assert done.returncode == 9, (mode, kill_at, done.stderr[-2000:])
            left = sorted(path.name for path in parent.iterdir() if path.name != "en_de")
            gap = not out.exists()  # only between the fallback's two renames
            assert gap == (mode == "fallback" and kill_at == 3), (mode, kill_at)
            if gap or kill_at == len(expected):  # the loader puts an export killed in that gap back
                assert len(load_models(out).models) == 1
            assert model_folder(out).kind == "export"  # what every loader reads first (sizes checked)
            assert export_folder.verify_export(out) is not None, (mode, kill_at)
            assert (out / "NEW").exists() == (kill_at >= expected.index("rmtree")), (mode, kill_at)
            assert left or kill_at == len(expected), (mode, kill_at)  # the killed export left something beside
            again = tmp_path / "again"
            shutil.copytree(directory, again, dirs_exist_ok=True)
            with export_folder.writing_export(out) as staging:
                shutil.copytree(again, staging, dirs_exist_ok=True)
            assert sorted(path.name for path in parent.iterdir()) == ["en_de"], (mode, kill_at)
            assert not (out / "NEW").exists() and export_folder.verify_export(out) is not None


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_a_second_export_to_the_same_folder_is_refused_by_name_while_the_first_runs(exported, tmp_path, capsys):
    """Two exports to one `--out` never both succeed: while one holds the folder, another (from Python or from
    the command line, before it loads anything) is refused with the first one's process named, and the folder
    is left as it was."""
    from factories import ExportLockHolder

    from keras_transformer import cli
    from keras_transformer.errors import WorkdirBusyError

    directory, translator = exported
    out = tmp_path / "en_de"
    with ExportLockHolder(out) as holder:
        with pytest.raises(WorkdirBusyError, match=f"in use by process {holder.pid} on host .*\\(export, started"):
            export_translator(translator, out)
        assert cli.main(["export", "--workdir", str(directory), "--out", str(out)]) == 2
        assert f"in use by process {holder.pid}" in capsys.readouterr().err
        assert not out.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == [".en_de.lock"]  # the killed holder's, unlocked


@pytest.mark.slow  # on the module's real SavedModel export (built once, about a minute)
def test_an_export_carries_a_manifest_that_verify_and_every_loader_check(exported, tmp_path, capsys):
    """An export lists the size and SHA-256 of each of its files in manifest.json. `verify` checks every digest
    (exit 0 whole, 3 damaged naming the file, 2 without a manifest); every loader checks the sizes, so a
    truncated variables file is named before TensorFlow reads it. An export without a manifest (the shipped
    ones) still loads."""
    from keras_transformer import cli
    from keras_transformer.errors import ExportDamagedError
    from keras_transformer.workdir.layout import check_model_folder

    directory, _ = exported
    listed = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))["files"]
    on_disk = sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*")
                     if path.is_file() and path.name != "manifest.json")
    assert sorted(listed) == on_disk and "variables/variables.index" in listed
    for name in on_disk:
        import hashlib
        data = (directory / name).read_bytes()
        assert listed[name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert cli.main(["verify", str(directory)]) == 0
    assert f"{directory}: whole ({len(on_disk)} files" in capsys.readouterr().out

    truncated = tmp_path / "truncated"
    shutil.copytree(directory, truncated)
    data_file = next((truncated / "variables").glob("variables.data-*"))
    data_file.write_bytes(data_file.read_bytes()[:-100])
    assert cli.main(["verify", str(truncated)]) == 3
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{data_file} is " in error and "the export is damaged" in error
    for load in (load_translator, load_exported, check_model_folder):
        with pytest.raises(ExportDamagedError, match=f"{data_file} is {data_file.stat().st_size} bytes where"):
            load(truncated)
    assert cli.main(["translate", "--model", str(truncated), "A dog."]) == 3  # a corrupt file
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(data_file) in error

    changed = tmp_path / "changed"
    shutil.copytree(directory, changed)
    graph = changed / "saved_model.pb"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    check_model_folder(changed)  # the loader checks sizes only
    assert cli.main(["verify", str(changed)]) == 3
    assert f"{graph} differs from the export's manifest" in capsys.readouterr().err
    (changed / "manifest.json").unlink()
    assert cli.main(["verify", str(changed)]) == 2
    assert "has no manifest.json" in capsys.readouterr().err

    check_model_folder(changed)  # an export without a manifest loads as before
    assert cli.main(["verify", SHIPPED]) == 0  # the shipped models carry one (a manifest of their files in git)
    check_model_folder(SHIPPED)
