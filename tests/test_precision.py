"""A bfloat16 SavedModel export: bfloat16 variables, its precision recorded, translations as float32's."""

import json
import logging

import numpy as np
import pytest
import tensorflow as tf
from factories import copy_accuracy, make_workdir, random_sentences, word_vocabulary

from keras_transformer import cli, load_translator
from keras_transformer.engines.tensorflow import Translator
from keras_transformer.exports import savedmodel
from keras_transformer.exports.folder import MANIFEST, export_precision
from keras_transformer.model import cast_model

# The module's export is built once: `make test` runs the file on one worker.
pytestmark = pytest.mark.xdist_group("test_precision")

# bfloat16 keeps 8 bits of mantissa: each weight moves by up to 0.4% of itself, which moved the copy model's logits
# by about 1% of their range, so a translation changes only where two hypotheses score within that of each other:
# a few lines in a hundred. At least 90% identical lines (and the copy task's word accuracy within 2 points) leaves
# room for that, and still fails a graph that mixes precisions wrongly (float32 scores rounded to bfloat16 before the
# search, or weights cast without rounding, change far more).
AGREEMENT = 0.9
ACCURACY_POINTS = 2.0


@pytest.fixture(scope="module")
def copy_workdir(trained_copy_model, tmp_path_factory):
    """conftest's trained copy model as a workdir with a SentencePiece word vocabulary (beam 4, alpha 0.6)."""
    model, config = trained_copy_model
    root = tmp_path_factory.mktemp("precision")
    tokenizer = word_vocabulary(root / "vocab", 32)
    make_workdir(root / "run", config, models=[model], tokenizers=(tokenizer, tokenizer))
    return root / "run", tokenizer


@pytest.fixture(scope="module")
def bfloat16_export(copy_workdir):
    """`copy_workdir` exported by the command line with `--precision bfloat16` (without XLA: no compilation)."""
    out = copy_workdir[0].parent / "bf16"
    assert cli.main(["export", "--workdir", str(copy_workdir[0]), "--out", str(out), "--precision", "bfloat16",
                     "--no-xla", "--beam-size", "4", "--alpha", "0.6", "--max-extra", "5"]) == 0
    return out


@pytest.mark.slow  # about 9 CPU s: the export is loaded twice
def test_a_bfloat16_export_stores_bfloat16_variables_and_says_so(bfloat16_export, copy_workdir, capsys):
    """Slow: reads a real bfloat16 SavedModel export (the module's fixture exports one)."""
    model_weights = len(load_translator(copy_workdir[0]).model.weights)
    reader = tf.train.load_checkpoint(str(bfloat16_export / "variables" / "variables"))
    dtypes = [dtype for name, dtype in reader.get_variable_to_dtype_map().items() if "model_variables" in name]
    assert len(dtypes) == model_weights and set(dtypes) == {tf.bfloat16}
    assert export_precision(bfloat16_export) == "bfloat16"
    assert json.loads((bfloat16_export / MANIFEST).read_text())["precision"] == "bfloat16"
    assert "Precision: **bfloat16**" in (bfloat16_export / "README.md").read_text()
    assert cli.main(["verify", str(bfloat16_export)]) == 0
    assert "precision bfloat16" in capsys.readouterr().out
    rebuilt = load_translator(bfloat16_export).model  # the Python engine decodes as the graph does
    assert rebuilt.dtype_policy.name == "bfloat16" and {w.dtype for w in rebuilt.weights} == {"bfloat16"}


@pytest.mark.slow  # about 15 CPU s: both graphs are traced
def test_bfloat16_translations_agree_with_float32(bfloat16_export, copy_workdir, trained_copy_model):
    """The exported graph (bfloat16) against the in-memory float32 Translator on 100 random sentences: 94 the same,
    65.9% of words copied against 65.8% (2026-11-27)."""
    sentences = random_sentences(100, seed=65)
    loaded = tf.saved_model.load(str(bfloat16_export))
    served = loaded.signatures["serving_default"](tf.constant(sentences))
    bfloat16 = [text.decode() for text in served["translation"].numpy()]
    tokenizer = copy_workdir[1]
    float32 = Translator(trained_copy_model[0], tokenizer, beam_size=4, alpha=0.6, max_extra=5).translate_lines(
        sentences)
    same = sum(a == b for a, b in zip(float32, bfloat16)) / len(sentences)
    assert same >= AGREEMENT, (same, [(a, b) for a, b in zip(float32, bfloat16) if a != b][:5])
    assert abs(copy_accuracy(bfloat16, sentences) - copy_accuracy(float32, sentences)) <= ACCURACY_POINTS
    assert served["score"].dtype == tf.float32


@pytest.mark.slow  # about 9 CPU s under load: a model built and called eagerly
def test_cast_model_rounds_to_nearest_and_keeps_softmax_and_logits_in_float32(trained_copy_model):
    """Slow: builds a bfloat16 copy of a trained model and decodes with it, checking each weight's rounding."""
    model, config = trained_copy_model
    half = cast_model(model, config, "bfloat16")
    assert cast_model(half, config, "bfloat16") is half and cast_model(model, config, "float32") is model
    weight, stored = model.weights[0].numpy(), half.weights[0].numpy().astype("float32")
    # Rounded to the nearest bfloat16 (8 significant bits): off by half a step, 2^-8 of the value, at most.
    assert np.all(np.abs(stored - weight) <= np.abs(weight) * 2.0 ** -8)
    assert np.abs(stored - weight).max() > 0  # rounded, not kept
    source, target = np.array([[5, 6, 7, 3]], "int32"), np.array([[2, 5, 6]], "int32")
    logits = half({"source": source, "target": target})
    assert logits.dtype == "float32"
    np.testing.assert_allclose(logits, model({"source": source, "target": target}), atol=0.1)


def test_the_export_refuses_a_precision_in_one_line_and_warns_without_bfloat16_instructions(
        copy_workdir, tmp_path, capsys, caplog, monkeypatch):
    for precision in ("int8", "float16", "fp8"):
        assert cli.main(["export", "--workdir", str(copy_workdir[0]), "--out", str(tmp_path / "x"),
                         "--precision", precision]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--precision {precision} is not offered for --format savedmodel" in err[0], err
    assert not (tmp_path / "x").exists()
    for native, amx, expected in ((False, False, "neither AVX512_BF16 nor AMX"),
                                  (True, False, "has AVX512_BF16 but not AMX"), (True, True, None)):
        monkeypatch.setattr(savedmodel, "cpu_has_native_bfloat16", lambda native=native: native)
        monkeypatch.setattr(savedmodel, "cpu_has_amx", lambda amx=amx: amx)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert savedmodel.check_precision("bfloat16") == "bfloat16"
        if expected is None:
            assert "bfloat16" not in caplog.text
        else:
            assert expected in caplog.text and "docs/serving.md" in caplog.text
