"""The shipped EN->DE model translates as it did before the package was restructured, and early exit.

`golden/multi30k_en_de.test2016.first50.de` holds what `keras-transformer translate --model
saved_models/multi30k_en_de` printed for the first 50 sentences of Multi30k test2016 at commit 0f3f59d,
before the restructuring: the model loader, the Translator and the SavedModel must still give those lines
with the exact stopping rule (the shipped models now decode with `early_exit`, which changes a few
translations: docs/decoding.md).
"""

import dataclasses
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import evaluation, inference
from keras_transformer.attention import plotting
from keras_transformer.engines.tensorflow import Translator

# Its module fixtures are expensive: `make test` (--dist loadgroup) runs the whole file on one worker, so they
# are built once.
pytestmark = pytest.mark.xdist_group("test_shipped_models")

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "multi30k_en_de.test2016.first50.de"


SHIPPED = ROOT / "saved_models" / "multi30k_en_de"


@pytest.fixture(scope="module")
def first_50(multi30k_dir):
    return evaluation.read_lines(multi30k_dir / "test_2016_flickr.en.gz")[:50]


@pytest.fixture(scope="module")
def exact():
    """The shipped model loaded with the exact stopping rule, shared by both tests (its search is traced once)."""
    return inference.load_translator(SHIPPED, early_exit=False)


@pytest.mark.slow
def test_shipped_german_model_translates_the_first_50_test_sentences_as_before(first_50, exact):
    """Slow: 50 sentences through the shipped base-size model; the golden file is the behaviour users rely on."""
    expected = GOLDEN.read_text(encoding="utf-8").splitlines()
    assert not exact.early_exit
    translations = inference.translate(exact, first_50)
    assert [evaluation.one_line(line) for line in translations] == expected


@pytest.mark.slow
def test_early_exit_changes_the_translations_the_written_out_rule_changes(multi30k_dir, exact, reference_search,
                                                                          tmp_path):
    """Validation sentences 75 and 119 are two of the 10 (of 1,014) whose translation the shipped EN->DE model's
    early exit changes; sentence 0 keeps its. The early exit gives what the written-out search gives (the exact
    rule's agreement with it: tests/test_decoding.py), and the attention plot draws the translation served.

    The early-exit translations are its search's token ids (eager: cheaper than tracing a second search graph
    for three sentences) detokenized, as `Translator.translate` does (test_translation checks that it does)."""
    sentences = [evaluation.read_lines(multi30k_dir / "val.en.gz")[i] for i in (75, 119, 0)]
    early = inference.load_translator(SHIPPED)
    assert early.early_exit  # the shipped config's setting
    assert (early.beam_size, early.alpha, early.max_extra) == (exact.beam_size, exact.alpha, exact.max_extra)
    source = early.encode_sources(tf.constant(sentences)).numpy()
    tokens = np.asarray(early.translate_ids(source, num_return=1)[0])[:, 0]
    served = [t.decode("utf-8") for t in early.target_tokenizer.detokenize(tokens).numpy()]
    exhaustive = exact(sentences)
    assert [a != b for a, b in zip(exhaustive, served)] == [True, True, False]
    maps, _ = plotting.plot_attention_for_path(SHIPPED, sentences[0], tmp_path, kinds=("cross",), dpi=40)
    assert maps.translation == served[0]
    for row, ids in enumerate(source):
        expected, _ = reference_search(early.model, ids.tolist(), beam_size=early.beam_size, alpha=early.alpha,
                                       max_extra=early.max_extra, early_exit=True)
        assert tokens[row][tokens[row] != 0].tolist() == expected[0][0], row


GREEDY = GOLDEN.with_name("multi30k_en_de.test2016.first50.greedy.de")
OLD_MODEL_FILE = GOLDEN.with_name("multi30k_en_de.model.before-decoding-options.yaml")


@pytest.mark.slow
def test_the_shipped_savedmodel_and_greedy_decoding_translate_as_before(first_50, exact, shipped_served):
    """The SavedModel's own graph (re-exported with the decoding package) serves the golden lines (its early exit
    changes none of these 50), and greedy decoding gives what `decoding.greedy_decode` gave before the package
    (`golden/...first50.greedy.de`, written by commit 33a04d3's code)."""
    served = shipped_served["test"]  # conftest: the SavedModel's serving_default on these 50
    assert [evaluation.one_line(t) for t in served] == GOLDEN.read_text(encoding="utf-8").splitlines()
    greedy = Translator(exact.model, exact.source_tokenizer, exact.target_tokenizer, strategy="greedy", chunk_size=0)
    tokens, _ = greedy.translate_ids(greedy.encode_sources(tf.constant(first_50)))  # one eager search of 50 rows
    texts = [t.decode("utf-8") for t in greedy.target_tokenizer.detokenize(tokens[:, 0]).numpy()]
    assert [evaluation.one_line(line) for line in texts] == GREEDY.read_text(encoding="utf-8").splitlines()


def test_a_model_file_from_before_the_decoding_options_is_refused_in_one_line_saying_how_to_move_them(tmp_path):
    """The shipped model's model.yaml as it was before the decoding options had their own mapping (beam_size,
    length_penalty, max_decode_extra, early_exit among the architecture's fields; no release wrote it) is refused,
    the fields named; moved under decoding: as the message says, its training settings are refused next, and
    without them it reads as the shipped one, rewritten once without them (the weights and graph unchanged)."""
    import yaml

    from keras_transformer.config import TRAINING_FIELDS, TransformerConfig
    from keras_transformer.errors import ConfigError
    from keras_transformer.workdir.checkpoints import read_model_file
    with pytest.raises(ConfigError, match=r"model.before-decoding-options.yaml: beam_size, length_penalty, "
                                          r"max_decode_extra, early_exit among the architecture's fields"):
        read_model_file(OLD_MODEL_FILE)
    with pytest.raises(ValueError, match="decoding settings are not part of TransformerConfig"):
        TransformerConfig.from_yaml(OLD_MODEL_FILE)
    values = yaml.safe_load(OLD_MODEL_FILE.read_text(encoding="utf-8"))
    moved = {"length_penalty": "alpha", "max_decode_extra": "max_extra"}
    values["decoding"] = {moved.get(name, name): values.pop(name)
                          for name in ("beam_size", "length_penalty", "max_decode_extra", "early_exit")}
    fixed = tmp_path / "model.yaml"
    fixed.write_text(yaml.safe_dump(values), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model.yaml: label_smoothing is a training setting now, not the model's: "
                                          r"remove it from this file \(an experiment gives it as "
                                          r"training.label_smoothing\)"):
        read_model_file(fixed)
    assert {name: values.pop(name) for name in TRAINING_FIELDS} == {
        "label_smoothing": 0.1, "warmup_steps": 500, "learning_rate_scale": 0.506, "beta_1": 0.9, "beta_2": 0.98,
        "epsilon": 1e-9}  # the recipe's (configs/multi30k_en_de.yaml's training section)
    fixed.write_text(yaml.safe_dump(values), encoding="utf-8")
    config, options = read_model_file(SHIPPED / "assets.extra" / "model.yaml")
    assert read_model_file(fixed) == (config, options)
    assert (options.strategy, options.beam_size, options.alpha, options.max_extra, options.early_exit) == (
        "beam", 5, 1.0, 50, True)


@pytest.mark.parametrize("name", ["multi30k_en_de", "multi30k_en_fr"])
def test_every_shipped_model_verifies_against_its_manifest(name, capsys):
    """README and docs/serving.md: `keras-transformer verify` checks any export, the shipped ones included."""
    from keras_transformer import cli

    assert cli.main(["verify", str(ROOT / "saved_models" / name)]) == 0
    out = capsys.readouterr().out
    assert "whole (11 files" in out and "SHA-256 checked" in out and "README.md" in out


@pytest.mark.parametrize("name", ["multi30k_en_de", "multi30k_en_fr"])
def test_a_shipped_model_file_holds_the_architecture_alone(name):
    """The shipped model.yaml files were rewritten once without the training settings, which left the model's
    config: they hold TransformerConfig fields (those written at export) and a decoding mapping, nothing else."""
    import yaml

    from keras_transformer.config import TRAINING_FIELDS, TransformerConfig
    values = yaml.safe_load((ROOT / "saved_models" / name / "assets.extra" / "model.yaml").read_text(encoding="utf-8"))
    assert not set(TRAINING_FIELDS) & set(values)
    assert set(values) - {"decoding"} <= {field.name for field in dataclasses.fields(TransformerConfig)}


# A one-word and a two-word constraint (two forms: a tab between), a non-ASCII one, none, and on a short sentence
# fourteen phrases that cannot all fit in its length limit (50 tokens past its source): some are reported unmet.
TERM_LINES = ["A man rides a bike.", "A girl walks down the street.", "Two dogs play in the snow.", "A cat.", "Hi."]
TERM_SLOTS = [["Velo", "ein Mann\tder Mann"], ["Straße", "Mädchen"], ["", ""], ["Katze", ""],
              ["ein sehr großes gelbes Haus", "zwei kleine schwarze Hunde", "eine alte grüne Brücke",
               "drei junge rote Vögel", "ein langer weißer Zug", "vier kleine graue Mäuse", "ein hoher blauer Turm",
               "fünf bunte Luftballons", "ein rostiges altes Auto", "sechs hungrige weiße Enten",
               "ein leerer dunkler Bahnhof", "sieben müde Wanderer", "ein kaputter roter Schirm",
               "acht lachende Kinder"]]


@pytest.mark.slow
def test_the_shipped_savedmodel_and_its_keras_model_force_the_same_terms():
    """The re-exported shipped EN->DE SavedModel's `translate_constrained` signature (terms tokenized and the
    search compiled in its graph) gives what the engine on its Keras model gives with the same terms
    (`translate_terms`): translations, scores and the constraints left unmet, every one that fits met, and the
    banned word absent. Slow: the shipped base-size model, its constrained search compiled with XLA."""
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    engine = inference.load_translator(SHIPPED)
    slots = [row + [""] * (14 - len(row)) for row in TERM_SLOTS]
    given = [[tuple(slot.split("\t")) for slot in row if slot] for row in TERM_SLOTS]
    expected = [hypotheses[0] for hypotheses in engine.translate_terms(TERM_LINES, given, banned=["Fahrrad"])]
    served = tf.saved_model.load(str(SHIPPED)).signatures["translate_constrained"](
        inputs=tf.constant(TERM_LINES), constraints=tf.constant(slots),
        banned=tf.constant([["Fahrrad"]] * len(TERM_LINES)))
    texts = [t.decode("utf-8") for t in served["translation"].numpy()]
    assert texts == [e["translation"] for e in expected]
    np.testing.assert_allclose(served["score"].numpy(), [e["score"] for e in expected], atol=1e-4)
    unmet = [[slot for slot, met in zip(row, flags) if slot and not met]
             for row, flags in zip(slots, served["met"].numpy().tolist())]
    assert unmet == [["\t".join(u) if isinstance(u, list) else u for u in e["unmet"]] for e in expected]
    assert unmet[:4] == [[]] * 4 and unmet[4], unmet
    assert "Velo" in texts[0] and "Straße" in texts[1] and "Mädchen" in texts[1] and "Fahrrad" not in texts[0]
