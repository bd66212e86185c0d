"""LiteRT export: the converted search gives the package's token ids and scores, runs without TensorFlow, and
damaged or foreign folders are refused in one line."""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

from factories import make_workdir, random_sentences, word_vocabulary  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.decoding.options import DecodeOptions  # noqa: E402
from keras_transformer.engines.litert import LiteRTTranslator  # noqa: E402
from keras_transformer.errors import CheckpointError, ConfigError, ExportDamagedError  # noqa: E402
from keras_transformer.exports import litert, make_exporter  # noqa: E402
from keras_transformer.exports.folder import MANIFEST, verify_export  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_litert_export")

DECODING = {"beam_size": 4, "alpha": 0.6, "max_extra": 5}
SENTENCES = ["w5 w6 w7", "w8 w9 w10 w11 w12 w13 w14", "w16", "w20 w21 w22 w23 w24 w25"] + random_sentences(28, 1)
# Quantized exports must give float32's best translation for at least this share of SENTENCES (measured: float16
# 31/32, int8 28/32; on 300 other sentences 299 and 276). The copy model is partly trained: some sentences have
# hypotheses whose scores differ by less than int8 weights (dynamic range, 8 bits per channel) move them, so some
# flips are expected; float16 weights (11 significant bits) move them far less. The margins leave room for
# another converter's rounding, not for a broken quantization (which scrambles most outputs of a copy model).
AGREEMENT = {"float16": 0.9, "int8": 0.8}


@pytest.fixture(scope="module")
def exports(trained_copy_model, tmp_path_factory):
    """`(workdir, {precision: folder})`: conftest's trained copy model as a workdir with a SentencePiece word
    vocabulary, exported in float32 by the exporter `keras-transformer export --format litert` calls, and in float16
    and int8 from the same trace (`litert.convert` traces once and converts once per precision; the exporter's
    call is made to convert all three)."""
    model, config = trained_copy_model
    root = tmp_path_factory.mktemp("litert")
    word_vocabulary(root / "run" / "data" / "vocab", 32)
    make_workdir(root / "run", config, models=[model])
    convert, converted = litert.convert, {}

    def convert_all(model, config, options, precisions, *settings):
        converted.update(convert(model, config, options, ("float32", "float16", "int8"), *settings))
        return {precision: converted[precision] for precision in precisions}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(litert, "convert", convert_all)
        folders = {"float32": make_exporter("litert").export(root / "run", root / "float32", **DECODING)}
    options = DecodeOptions(**DECODING)
    for precision in ("float16", "int8"):
        folders[precision] = litert.write_litert(converted[precision], config, options, precision,
                                                 root / "run" / "data" / "vocab", root / precision)
    return root / "run", {precision: pathlib.Path(folder) for precision, folder in folders.items()}


@pytest.fixture(scope="module")
def reference(exports):
    """The workdir's TensorFlow translator (the search the SavedModel holds) with the exports' decoding."""
    return kt.load_translator(exports[0], jit_compile=False, **DECODING)


def _same_search(converted, reference):
    """Checks that `converted` (a LiteRT translator) gives `reference`'s beam hypotheses (texts, and scores within
    1e-4), greedy outputs and forced scores on SENTENCES; returns `(its n-best rows, its best texts)`."""
    ours, theirs = converted.n_best_lines(SENTENCES), reference.n_best_lines(SENTENCES)
    # one word piece per word: equal strings are equal token ids
    assert [[text for text, _ in row] for row in ours] == [[text for text, _ in row] for row in theirs]
    np.testing.assert_allclose([[s for _, s in row] for row in ours], [[s for _, s in row] for row in theirs],
                               atol=1e-4)
    greedy = {"strategy": "greedy"}
    assert converted.with_options(converted.options.replace(**greedy))(SENTENCES) == \
        reference.with_options(reference.options.replace(**greedy))(SENTENCES)
    best = [row[0][0] for row in ours]
    np.testing.assert_allclose(converted.score_lines(SENTENCES, best), reference.score_lines(SENTENCES, best),
                               atol=1e-4)
    return ours, best


@pytest.mark.slow
def test_float32_gives_the_token_ids_and_scores_of_the_tensorflow_search(exports, reference):
    """Beam search (every hypothesis), greedy decoding and forced scores of the float32 .tflite against the workdir's
    TensorFlow translator; a slow test: it converts the model."""
    converted = kt.load_translator(exports[1]["float32"])
    assert isinstance(converted, LiteRTTranslator) and converted.options == reference.options
    ours, best = _same_search(converted, reference)
    # the detailed forms (documents, --json, n-best with signals) carry the same hypotheses and their signals
    detailed = converted.n_best_detailed(SENTENCES)
    assert [[h.text for h in row] for row in detailed] == [[text for text, _ in row] for row in ours]
    np.testing.assert_allclose([[h.score for h in row] for row in detailed], [[s for _, s in row] for row in ours],
                               atol=1e-5)
    assert all(h.mean_log_prob < 0 and h.tokens > 0 for row in detailed for h in row)
    # the model copies: most words come back (not a comparison of two empty outputs)
    assert np.mean([len(set(a.split()) & set(b.split())) / len(b.split()) for a, b in zip(best, SENTENCES)]) > 0.5


@pytest.mark.slow
def test_float16_and_int8_agree_with_float32_in_smaller_files(exports):
    """Quantized exports give float32's translation for most sentences (`AGREEMENT`) in smaller files; a slow test:
    it converts the model."""
    folders = exports[1]
    best = {precision: LiteRTTranslator(folder)(SENTENCES) for precision, folder in folders.items()}
    for precision, threshold in AGREEMENT.items():
        same = np.mean([a == b for a, b in zip(best[precision], best["float32"])])
        assert same >= threshold, (precision, same)
    sizes = {precision: (folder / "model.tflite").stat().st_size for precision, folder in folders.items()}
    assert sizes["int8"] < sizes["float16"] < sizes["float32"]
    # the tied embedding is stored once in int8: the lookup reads the softmax's per-row matrix
    from tensorflow.lite.tools import flatbuffer_utils
    model = flatbuffer_utils.read_model(str(folders["int8"] / "model.tflite"))
    config = kt.TransformerConfig.from_yaml(exports[0] / "model.yaml")
    embedding = {tensor.buffer for graph in model.subgraphs for tensor in graph.tensors
                 if list(tensor.shape) == [config.vocab_size, config.d_model] and tensor.type == 9}  # int8
    assert len(embedding) == 1, embedding
    assert kt.exports.folder.export_precision(folders["int8"]) == "int8"


@pytest.mark.slow
def test_the_engine_translates_without_importing_tensorflow(exports):
    """`keras_transformer.load_translator` of a LiteRT export, in a fresh process: the same translations as here, with
    neither TensorFlow nor Keras imported; a slow test: a subprocess and a conversion."""
    folder = exports[1]["float32"]
    code = ("import sys, json; import keras_transformer as kt; "
            f"t = kt.load_translator({str(folder)!r}, intra_threads=1); out = t({SENTENCES[:4]!r}); "
            "print(json.dumps([out, [m for m in ('tensorflow', 'keras') if m in sys.modules]]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr[-2000:]
    translations, imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert imported == []
    assert translations == LiteRTTranslator(folder)(SENTENCES[:4])


@pytest.mark.slow
def test_verify_and_the_loader_catch_a_changed_or_truncated_model(exports, tmp_path):
    """A byte changed in model.tflite fails `verify`; a truncated one is named by the loader's size check, and
    without a manifest by LiteRT itself, each in one line; a slow test: it converts the model."""
    folder = tmp_path / "copy"
    shutil.copytree(exports[1]["float32"], folder)
    assert verify_export(folder).files == 4  # model.tflite, sentencepiece.model, litert.json, README.md
    model = folder / "model.tflite"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(ExportDamagedError, match="model.tflite differs from the export's manifest"):
        verify_export(folder)
    model.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ExportDamagedError, match="model.tflite is .* bytes where the export's manifest records"):
        kt.load_translator(folder)
    (folder / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="cannot be read by LiteRT") as error:
        LiteRTTranslator(folder)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_folders_of_other_formats_and_other_settings_are_refused_in_one_line(exports, tmp_path):
    """The engine, the loader and the writer each refuse what is not a LiteRT export (or a setting the graph does not
    hold), naming it; a slow test: it converts the model."""
    workdir, folders = exports
    errors = []
    for attempt, kind in [(lambda: LiteRTTranslator(workdir), CheckpointError),
                          (lambda: kt.load_translator(workdir, engine="litert"), ConfigError),
                          (lambda: kt.load_translator(folders["float32"], engine="tensorflow"), ConfigError),
                          (lambda: kt.load_translator([folders["float32"], workdir]), ConfigError),
                          (lambda: LiteRTTranslator(folders["float32"], beam_size=5), ConfigError),
                          (lambda: LiteRTTranslator(folders["float32"], strategy="sample"), ConfigError),
                          (lambda: make_exporter("litert", precision="bfloat16"), ConfigError)]:
        with pytest.raises(kind) as error:
            attempt()
        errors.append(str(error.value))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError) as error:
        litert.write_litert((folders["float32"] / "model.tflite").read_bytes(),
                            kt.TransformerConfig.from_yaml(workdir / "model.yaml"), DecodeOptions(**DECODING),
                            "float32", workdir / "data" / "vocab", tmp_path / "other")
    errors.append(str(error.value))
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine" and len(os.listdir(tmp_path / "other")) == 1
    assert all("\n" not in message for message in errors), errors
    assert "beam_size 4 as a constant, not 5" in errors[4]


@pytest.mark.slow
def test_a_model_from_an_import_names_its_source_and_licence_and_every_card_its_decoding(exports, tmp_path):
    """A LiteRT export of a model with an import record (`imported.json`) copies it and names the source, licence
    and original hashes in `litert.json`, the manifest and the README, beside the decoding baked in and the special
    ids; one without says it was trained with keras_transformer. A slow test: it needs a converted model (the
    module's, written again without converting)."""
    from keras_transformer.workdir.provenance import fine_tuned_record
    workdir, folders = exports
    card = (folders["float32"] / "README.md").read_text()
    assert "Trained with keras_transformer." in card and "beam: beam_size 4, alpha 0.6, max_extra 5" in card
    assert "pad 0 `<pad>`, unk 1 `<unk>`, bos 2 `<s>`, eos 3 `</s>`" in card
    assert "provenance" not in json.loads((folders["float32"] / MANIFEST).read_text())
    record = fine_tuned_record({"source": "org/model", "licence": "mit", "family": "marian",
                                "files": {"model.safetensors": {"bytes": 3, "sha256": "ab" * 32}}},
                               "runs/import", weights=False)
    config = kt.TransformerConfig.from_yaml(workdir / "model.yaml")
    out = litert.write_litert((folders["float32"] / "model.tflite").read_bytes(), config, DecodeOptions(**DECODING),
                              "float32", workdir / "data" / "vocab", tmp_path / "derived", provenance=record)
    out = pathlib.Path(out)
    card = (out / "README.md").read_text()
    assert "The architecture of org/model (licence mit), trained from new weights with keras_transformer" in card
    assert "ab" * 32 in card and json.loads((out / "imported.json").read_text()) == record
    for summary in (json.loads((out / "litert.json").read_text())["provenance"],
                    json.loads((out / MANIFEST).read_text())["provenance"]):
        assert summary["source"] == "org/model" and summary["licence"] == "mit" and summary["origin"] == "fine-tuned"
        assert summary["files"] == {"model.safetensors": "ab" * 32} and not summary["imported_weights"]
    assert verify_export(out) is not None  # every file, imported.json included, checks against the manifest


@pytest.mark.slow
def test_an_operation_without_a_builtin_is_named_and_nothing_is_written(exports, tmp_path, monkeypatch):
    """Traced without its `tf.argmax` stand-in, Keras' argmax brings `tf.BitwiseAnd`, which LiteRT has no built-in
    for: the export fails in one line naming that operation, and leaves no folder (nor a half-written one) behind.
    A slow test: it runs the converter."""
    import contextlib
    workdir, _ = exports
    monkeypatch.setattr(litert, "builtin_argmax", contextlib.nullcontext)
    with pytest.raises(ConfigError) as error:
        make_exporter("litert").export(workdir, tmp_path / "out", strategy="greedy")
    message = str(error.value)
    assert "BitwiseAnd" in message and "built-in" in message and "\n" not in message, message
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def relative_export(relative_copy_model, tmp_path_factory):
    """`(workdir, folder)`: conftest's copy model with relative positions (Shaw et al., k = 2) as a workdir with the
    word vocabulary, exported in float32 by `keras-transformer export --format litert`'s exporter."""
    model, config = relative_copy_model
    root = tmp_path_factory.mktemp("litert_relative")
    word_vocabulary(root / "run" / "data" / "vocab", 32)
    make_workdir(root / "run", config, models=[model])
    return root / "run", pathlib.Path(make_exporter("litert").export(root / "run", root / "float32", **DECODING))


@pytest.mark.slow
def test_relative_positions_give_the_token_ids_and_scores_of_the_tensorflow_search(relative_export):
    """A model with relative position representations (`position: relative`, as the shipped EN-FR model) converts,
    and its float32 beam search (every hypothesis), greedy decoding and forced scores are the TensorFlow
    translator's; sentences of up to 10 words reach far past k = 2, so the clipped distances are all used. A slow
    test: it converts the model."""
    workdir, folder = relative_export
    converted, reference = kt.load_translator(folder), kt.load_translator(workdir, jit_compile=False, **DECODING)
    ours, best = _same_search(converted, reference)
    # not a comparison of degenerate outputs: the hypotheses vary, and the best ones keep some source words
    assert len({text for row in ours for text, _ in row}) > len(SENTENCES)
    assert np.mean([len(set(a.split()) & set(b.split())) / len(b.split()) for a, b in zip(best, SENTENCES)]) > 0.3


@pytest.mark.slow
def test_a_model_the_converter_fails_on_is_refused_naming_the_operation_and_its_layer(monkeypatch):
    """Where a decoding step adds the relative values' term before it moves the heads back (the layers' order until
    the export took relative positions), TensorFlow's layout optimization takes the permutation of that transpose
    into the search's loop and the converter fails: the conversion fails in one line naming the operation and the
    layer, not with the converter's MLIR dump. A slow test: it runs the converter on a tiny model."""
    from keras import ops

    from keras_transformer.layers import attention
    original = attention.heads_first_attention

    def sum_then_transpose(*args, heads_last=False, **kwargs):
        outputs, weights = original(*args, **kwargs)
        return (ops.transpose(outputs, (0, 2, 1, 3)) if heads_last else outputs), weights

    monkeypatch.setattr(attention, "heads_first_attention", sum_then_transpose)
    config = kt.TransformerConfig.preset("tiny", vocab_size=40, position="relative", max_relative_position=4)
    with pytest.raises(ConfigError) as error:
        litert.convert(kt.build_model(config), config, DecodeOptions(strategy="greedy", max_extra=2))
    message = str(error.value)
    assert "Transpose in" in message and "the converter failed" in message and "\n" not in message, message


def test_the_converter_s_warnings_are_kept_from_the_user_even_where_it_resets_the_log_level(caplog):
    """Reloading the frozen functions, TensorFlow warns once a function that its gradients were not saved (none is
    asked for): exporting a SavedModel folder printed ten such lines. The converter's loading sets absl's logger
    level again, so the export filters the records instead."""
    absl = logging.getLogger("absl")
    level = absl.level
    try:
        with caplog.at_level(logging.INFO), litert._quiet("absl"):
            absl.setLevel(logging.INFO)
            absl.warning("Importing a function (f) with ops with unsaved custom gradients.")
            absl.error("a real error")
        assert [record.getMessage() for record in caplog.records] == ["a real error"]
    finally:
        absl.setLevel(level)
