"""keras-transformer import: small random MarianMTModel checkpoints (transformers' own classes, the reference),
imported and checked against it: token ids, logits, greedy and beam search; exports; fine-tuning; faults.

Three shapes, built once for the file: a shared vocabulary with multi-target `>>lang<<` tokens and swish, unequal
encoder/decoder depth; separate vocabularies (share_encoder_decoder_embeddings false) with gelu; separate
vocabularies with an untied softmax and relu. Each has a non-zero final_logits_bias and SentencePiece models
trained here on Multi30k lines.
"""

import json
import os
import pathlib
import shutil

import numpy as np
import pytest
from factories import (
    DOCUMENT,
    DOCUMENT_SENTENCES,
    check_training_batch,
    document_layout,
    import_references,
    lines_of,
    load_imported,
    until_eos,
)

import keras_transformer as kt
from keras_transformer.errors import CheckpointNotFoundError, ConfigError, CorruptFileError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("test_pretrained")

SHAPES = {
    "shared_swish": dict(share=True, tie=True, activation="swish", encoder_layers=2, decoder_layers=1,
                         tags=(">>fra<<", ">>deu<<")),
    "separate_gelu": dict(share=False, tie=True, activation="gelu", encoder_layers=1, decoder_layers=2, tags=()),
    "untied_relu": dict(share=False, tie=False, activation="relu", encoder_layers=1, decoder_layers=1, tags=()),
}
LICENCE = "cc-by-4.0"  # the model card's front matter of every reference checkpoint
SENTENCES = ["A man rides a bike.", "Two dogs play in the snow near a house.", "A girl.",
             "Zwei Männer sitzen auf einer Bank!", ">>fra<< A woman sings on a stage."]
MAX_EXTRA = 6
WEIGHT_STD = 0.3  # of the random weights, larger than MarianMTModel's initialization: outputs that differ
BIAS_STD = 0.1  # of final_logits_bias


def _sentencepiece(sentences, size, path):
    import sentencepiece
    with open(path, "wb") as handle:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=handle, vocab_size=size, model_type="unigram",
            character_coverage=1.0, minloglevel=2, num_threads=1, unk_id=0, eos_id=1, bos_id=-1, pad_id=-1)


def _vocabulary(tags, *spm_files):
    import sentencepiece
    vocabulary = {"</s>": 0, "<unk>": 1}
    for token in tags:
        vocabulary.setdefault(token, len(vocabulary))
    for path in spm_files:
        processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
        for index in range(processor.get_piece_size()):
            if not (processor.is_control(index) or processor.is_unknown(index)):
                vocabulary.setdefault(processor.id_to_piece(index), len(vocabulary))
    vocabulary["<pad>"] = len(vocabulary)
    return vocabulary


def build_reference(folder, *, share, tie, activation, encoder_layers, decoder_layers, tags, seed=0):
    """A random MarianMTModel with its tokenizer files, saved as save_pretrained saves them."""
    folder.mkdir(parents=True)
    _sentencepiece(lines_of("train.en.gz", 300), 170, folder / "source.spm")
    _sentencepiece(lines_of("train.de.gz", 300), 150, folder / "target.spm")
    if share:
        source = target = _vocabulary(tags, folder / "source.spm", folder / "target.spm")
    else:
        source, target = _vocabulary(tags, folder / "source.spm"), _vocabulary(tags, folder / "target.spm")
        # config.json has one pad id: the target's <pad> at the source's, and the target vocabulary 12 larger
        target = {token: index for token, index in target.items() if token != "<pad>"}
        assert len(target) < len(source) - 1
        while len(target) < len(source) + 12:
            target["<pad>" if len(target) == len(source) - 1 else f"<extra_{len(target)}>"] = len(target)
    json.dump(source, open(folder / "vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
    if not share:
        json.dump(target, open(folder / "target_vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
    pad = len(source) - 1
    config = transformers.MarianConfig(
        vocab_size=len(source), decoder_vocab_size=len(target), d_model=16, encoder_layers=encoder_layers,
        decoder_layers=decoder_layers, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, activation_function=activation, max_position_embeddings=64, pad_token_id=pad,
        eos_token_id=0, decoder_start_token_id=pad, share_encoder_decoder_embeddings=share,
        tie_word_embeddings=tie, scale_embedding=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0, WEIGHT_STD if parameter.dim() > 1 else 0.1)
            if "layer_norm.weight" in name:
                parameter.add_(1.0)
        model.final_logits_bias.normal_(0, BIAS_STD)
    model.generation_config.bad_words_ids = [[pad]]
    tokenizer = transformers.MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
        target_vocab_file=None if share else str(folder / "target_vocab.json"), separate_vocabs=not share)
    # eos's bias, raised until some greedy translation of SENTENCES ends with eos (a random model's translations
    # otherwise all run to their limit): the searches' finished hypotheses are then compared too
    sources = tokenizer(SENTENCES)["input_ids"]
    for eos_bias in np.arange(0.0, 8.0, 0.5):
        with torch.no_grad():
            model.final_logits_bias[0, 0] = float(eos_bias)
        outputs = [_generate(model, ids, num_beams=1) for ids in sources]
        if any(0 in output for output in outputs):  # some translation ends with eos before its limit
            break
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(f"---\nlicense: {LICENCE}\n---\n# A random model\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """name -> (checkpoint folder, imported workdir, the transformers model, its tokenizer)."""
    root = tmp_path_factory.mktemp("pretrained")
    return import_references(root, SHAPES, build_reference, transformers.MarianMTModel, transformers.MarianTokenizer)


@pytest.mark.parametrize("name", SHAPES)
def test_token_ids_equal_the_reference_tokenizer(references, name):
    folder, workdir, _, reference = references[name]
    _, config, source, target = load_imported(workdir)
    lines = lines_of("val.en.gz", 60) + SENTENCES + [">>deu<<no space", ">>xx<< an unknown tag", "", "  spaces  "]
    ours = [ids + [config.eos_id] for ids in source.tokenize(lines).to_list()]
    assert ours == reference(lines)["input_ids"]
    german = lines_of("val.de.gz", 40)
    ours = [ids + [config.eos_id] for ids in target.tokenize(german).to_list()]
    assert ours == reference(text_target=german)["input_ids"]
    # decoding: what generate's ids read as, up to the first eos
    ids = [row + [config.eos_id] for row in reference(text_target=german)["input_ids"]]
    import tensorflow as tf
    assert [text.decode() for text in target.detokenize(tf.ragged.constant(ids)).numpy()] == \
        reference.batch_decode(ids, skip_special_tokens=True)
    if SHAPES[name]["tags"]:
        assert source.tokenize([">>fra<< A dog."]).to_list()[0][0] == reference.convert_tokens_to_ids(">>fra<<")


@pytest.mark.parametrize("name", SHAPES)
def test_logits_equal_the_reference_on_a_padded_batch(references, name):
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # padded rows
    rng = np.random.default_rng(0)
    decoder_input = np.full((len(SENTENCES), 7), config.pad_id)  # starts from the pad id, as Marian's decoder
    decoder_input[:, 1:] = rng.integers(2, config.pad_id, size=(len(SENTENCES), 6))
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             decoder_input_ids=torch.tensor(decoder_input)).logits.numpy()
    ours = np.asarray(model({"source": batch["input_ids"].numpy().astype("int32"),
                             "target": decoder_input.astype("int32")}))
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)


def _generate(reference, ids, **options):
    limit = len(ids) + MAX_EXTRA
    with torch.no_grad():
        output = reference.generate(torch.tensor([ids]), max_new_tokens=limit, do_sample=False,
                                    forced_eos_token_id=None, **options)[0].tolist()
    return output[1:]  # without the decoder's start token


@pytest.mark.slow
@pytest.mark.parametrize("name", SHAPES)
def test_greedy_and_beam_search_equal_generate(references, name):
    """Slow: runs transformers' `generate` (torch) beside our searches; parity with the reference needs both."""
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    special = dict(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)["input_ids"].astype("int32")  # (B, S), padded
    greedy, _ = kt.greedy_decode(model, batch, max_extra=MAX_EXTRA, **special)  # (B, T)
    beam, _ = kt.beam_search(model, batch, beam_size=4, alpha=0.0, max_extra=MAX_EXTRA, **special)  # (B, 1, T)
    for row, ids in enumerate(tokenizer(SENTENCES)["input_ids"]):
        expected = _generate(reference, ids, num_beams=1)
        assert until_eos(np.asarray(greedy)[row], config) == until_eos(expected, config)
        expected = _generate(reference, ids, num_beams=4, length_penalty=0.0, early_stopping=False)
        assert until_eos(np.asarray(beam)[row, 0], config) == until_eos(expected, config)


def test_the_workdir_records_where_it_came_from_and_the_decoding_defaults(references):
    folder, workdir, _, _ = references["shared_swish"]
    record = json.loads((workdir / "imported.json").read_text())
    assert record["family"] == "marian" and record["config"]["model_type"] == "marian"
    assert set(record["files"]) >= {"config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json"}
    from keras_transformer.workdir.checkpoints import read_model_file
    config, options = read_model_file(workdir / "model.yaml")
    assert (options.strategy, options.beam_size) == ("beam", 4)  # generation_config.json's num_beams
    assert config.bos_id == config.pad_id and config.sinusoid_layout == "concatenated"
    assert config.activation == "swish" and config.output_bias and config.tie_embeddings == "all"
    assert kt.TransformerConfig.from_yaml(workdir / "model.yaml") == config
    # the architecture and the decoding defaults only: no Adam betas, schedule or label smoothing
    import yaml

    from keras_transformer.config import TRAINING_FIELDS
    written = yaml.safe_load((workdir / "model.yaml").read_text(encoding="utf-8"))
    assert not set(TRAINING_FIELDS) & set(written) and set(written) - {"decoding"} == set(config.to_dict())


def test_a_run_from_an_import_takes_its_decoding_defaults_and_its_record_unless_the_config_says_otherwise(
        references):
    """`model.from` an import: the decoding section starts from the import's defaults (beam 4 and alpha 1.0 from
    its generation config, not DecodeOptions' beam 4 / alpha 0.6) and the keys given win; the run's import record
    names the source, its licence and the original files' hashes."""
    from keras_transformer.experiment import ExperimentConfig
    from keras_transformer.workdir.checkpoints import read_model_file
    from keras_transformer.workdir.provenance import provenance_sentence, run_provenance
    folder, workdir, _, _ = references["shared_swish"]
    _, imported = read_model_file(workdir / "model.yaml")
    assert (imported.strategy, imported.beam_size, imported.alpha) == ("beam", 4, 1.0)

    def decoding(section):
        return ExperimentConfig.from_dict({"model": {"from": str(workdir)}, "decoding": section},
                                          check_model=False).decoding

    assert decoding({}).options == imported
    assert decoding({"length_penalty": 0.2, "batch_size": 8}).options == imported.replace(alpha=0.2)
    assert decoding({"length_penalty": 0.2, "batch_size": 8}).batch_size == 8
    assert decoding({"strategy": "greedy"}).options.strategy == "greedy"
    assert decoding({"strategy": "sample", "top_k": 5}).options.top_k == 5
    assert ExperimentConfig.from_dict({"model": {"preset": "tiny"}}).decoding.options == kt.DecodeOptions()
    checkpoint = workdir / "checkpoints" / "ckpt-0000.weights.h5"
    record = run_provenance(checkpoint, workdir)
    original = json.loads((workdir / "imported.json").read_text())
    assert record["source"] == original["source"] and record["licence"] == LICENCE
    assert record["files"]["model.safetensors"]["sha256"] == original["files"]["model.safetensors"]["sha256"]
    assert record["fine_tuned"]["weights"] and record["fine_tuned"]["from"] == str(checkpoint)
    assert provenance_sentence(record) == f"Imported from {original['source']} (licence {LICENCE}), fine-tuned with " \
                                          "keras_transformer."
    assert not run_provenance(None, workdir)["fine_tuned"]["weights"]  # the architecture only
    assert run_provenance(None, None) is None


def _check_provenance(out, workdir, card, decoding, eos, fine_tuned=False):
    """An export names the import's source and licence in its manifest and card, and its real decoding and eos."""
    out, record = pathlib.Path(out), json.loads((workdir / "imported.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())["provenance"]
    assert manifest["source"] == record["source"] and manifest["licence"] == LICENCE
    assert manifest["origin"] == ("fine-tuned" if fine_tuned else "imported")
    assert manifest["files"] == {name: entry["sha256"] for name, entry in record["files"].items()}
    assert json.loads((out / "imported.json").read_text())["source"] == record["source"]
    text = (out / card).read_text()
    assert f"from {record['source']} (licence {LICENCE})" in text and "trained with" not in text.lower()
    assert ("fine-tuned with keras_transformer" in text) == fine_tuned
    assert record["files"]["model.safetensors"]["sha256"] in text
    assert decoding in text and f"eos 0 `{eos}`" in text


def _copy(references, tmp_path, name="shared_swish"):
    folder = tmp_path / "checkpoint"
    shutil.copytree(references[name][0], folder)
    return folder


def test_import_says_once_that_it_imported_and_beam_flags_choose_beam_search_on_a_greedy_import(
        references, tmp_path, capsys, caplog):
    """A checkpoint whose generation config has no num_beams imports as greedy by default; `import` says once
    that it imported it; `translate --beam-size 2 --alpha 0` on it is beam search, not greedy decoding."""
    import logging

    from keras_transformer.cli import main
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.workdir.checkpoints import read_model_file

    folder = _copy(references, tmp_path, "untied_relu")
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({k: v for k, v in generation.items()
                                                               if k != "num_beams"}))
    workdir = tmp_path / "greedy"
    with caplog.at_level(logging.INFO, logger="keras_transformer"):
        assert main(["import", str(folder), "--workdir", str(workdir)]) == 0
    printed = capsys.readouterr()
    said = printed.out + printed.err + caplog.text
    assert said.count("Imported ") == 1 and f"into {workdir}" in said, said
    assert f"keras-transformer translate --model {workdir}" in printed.out
    assert read_model_file(workdir / "model.yaml")[1].strategy == "greedy"
    lines = SENTENCES[:3]
    assert main(["translate", "--model", str(workdir), "--beam-size", "2", "--alpha", "0", "--max-extra",
                 str(MAX_EXTRA), *lines]) == 0
    printed = capsys.readouterr()
    beam = load_translator(workdir, strategy="beam", beam_size=2, alpha=0.0, max_extra=MAX_EXTRA)
    assert printed.out.splitlines() == beam.translate_lines(lines)
    assert printed.err.splitlines()[-1] == f"Decoding: beam: beam_size 2, alpha 0.0, max_extra {MAX_EXTRA}"


@pytest.mark.parametrize("fault, error, named", [
    ("model_type", ConfigError, "model_type 'bert' is not a family"),
    ("tokenizer", CheckpointNotFoundError, "target.spm is missing"),
    ("truncated", CorruptFileError, "model.safetensors cannot be read"),
    ("shape", ConfigError, "model.encoder.layers.0.fc1.weight has shape (32, 16) but config.json's sizes give "
                           "(48, 16)"),
])
def test_a_faulty_checkpoint_ends_in_one_line_naming_it_and_writes_nothing(references, tmp_path, capsys, fault,
                                                                           error, named):
    folder = _copy(references, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    if fault == "model_type":
        config["model_type"] = "bert"
    elif fault == "shape":
        config["encoder_ffn_dim"] = config["decoder_ffn_dim"] = 48
    elif fault == "tokenizer":
        (folder / "target.spm").unlink()
    else:
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (folder / "config.json").write_text(json.dumps(config))
    workdir = tmp_path / "workdir"
    with pytest.raises(error, match=named.replace("(", r"\(").replace(")", r"\)")):
        kt.import_checkpoint(folder, workdir)
    assert not workdir.exists() and sorted(os.listdir(tmp_path)) == ["checkpoint"]
    from keras_transformer.cli import main
    assert main(["import", str(folder), "--workdir", str(workdir)]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and lines[0].startswith("keras-transformer import: error:")
    assert not workdir.exists()


@pytest.mark.slow
def test_the_savedmodel_and_ctranslate2_exports_translate_as_the_workdir(references, tmp_path):
    """Both exports of an imported workdir (separate vocabularies: two SentencePiece models, two vocabularies)
    give the workdir's translations, greedy, strings in and strings out."""
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, _, _ = references["separate_gelu"]
    lines = SENTENCES[:4]
    expected = load_translator(workdir, strategy="greedy").translate_lines(lines)
    assert len(set(expected)) > 1
    for name in ("savedmodel", "ctranslate2"):
        # Without XLA: what an import adds (its tokenizers in the graph, its model options) is the same graph either
        # way, and test_export checks the XLA-compiled search against the uncompiled one.
        options = {"jit_compile": False} if name == "savedmodel" else {}
        out = make_exporter(name, **options).export(workdir, tmp_path / name, strategy="greedy")
        assert load_translator(out).translate_lines(lines) == expected, name
        # the card and the manifest: imported from where, under which licence, decoding greedily, eos id 0
        _check_provenance(out, workdir, "README.md", "greedy: max_extra 50", "</s>")
    import tensorflow as tf
    loaded = tf.saved_model.load(str(tmp_path / "savedmodel"))
    served = loaded.signatures["serving_default"](tf.constant(lines))
    assert [text.decode() for text in served["translation"].numpy()] == expected


@pytest.mark.slow
def test_an_imported_workdir_exports_in_low_precision_and_each_export_verifies(references, tmp_path, capsys):
    """`export --precision bfloat16` (SavedModel) and `--format ctranslate2 --precision int8` take an imported
    workdir as any other: each export loads and translates a check sentence before it is swapped in (status 0
    says it did), records its precision in its manifest, and passes `verify` (every file against the manifest).
    tests/test_precision.py checks bfloat16's translations against float32's on a trained model; a random
    model's are too close to call."""
    from keras_transformer import cli
    from keras_transformer.exports.folder import export_precision

    _, workdir, _, _ = references["shared_swish"]
    for name, flags in (("bfloat16", ["--precision", "bfloat16", "--no-xla"]),
                        ("int8", ["--format", "ctranslate2", "--precision", "int8"])):
        out = tmp_path / name
        assert cli.main(["export", "--workdir", str(workdir), "--out", str(out), *flags]) == 0, name
        assert export_precision(out) == name
        capsys.readouterr()
        assert cli.main(["verify", str(out)]) == 0, name
        assert f"precision {name}" in capsys.readouterr().out


@pytest.mark.slow
def test_three_fine_tuning_updates_raise_the_likelihood_of_the_data_and_the_result_exports(references, tmp_path):
    """train with training.init_checkpoint on an imported workdir: its vocabulary is taken, three updates raise
    log P(targets | sources) of the training pairs (scored with both weights), and the tuned run exports. The
    experiment's model section is `from:` the import (tests/test_pretrained_m2m.py copies the fields by hand)."""
    from keras_transformer import training
    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    from keras_transformer.workdir.checkpoints import load_models
    _, workdir, _, _ = references["shared_swish"]
    sources, targets = lines_of("val.en.gz", 48), lines_of("val.de.gz", 48)
    for name, lines in (("train.en", sources), ("train.de", targets)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    experiment = {  # the model section starts from the import's model.yaml (`from:`)
        "model": {"from": str(workdir), "dropout": 0.0},
        "data": {"kind": "text", "train_source": str(tmp_path / "train.en"), "train_target": str(tmp_path / "train.de"),
                 "tokens_per_batch": 4096, "max_length": 40},
        "training": {"label_smoothing": 0.0, "warmup_steps": 1, "learning_rate_scale": 0.5, "epochs": 1,
                     "steps_per_epoch": 3, "seed": 0, "jit_compile": False,
                     "init_checkpoint": str(workdir / "checkpoints" / "ckpt-0000.weights.h5")},
    }
    tuned = tmp_path / "tuned"
    training.train(experiment, tuned)
    assert [p.read_bytes() for p in sorted((tuned / "data" / "vocab").rglob("*")) if p.is_file()] == \
        [p.read_bytes() for p in sorted((workdir / "data" / "vocab").rglob("*")) if p.is_file()]
    source_tokenizer, target_tokenizer = load_tokenizers(tuned / "data" / "vocab")
    config = load_models(workdir).configs[0]

    def padded(rows):  # tokens then eos, padded
        rows = [row + [config.eos_id] for row in rows]
        width = max(len(row) for row in rows)
        return np.array([row + [config.pad_id] * (width - len(row)) for row in rows], "int32")

    source_ids = padded([ids[:30] for ids in source_tokenizer.tokenize(sources).to_list()])  # within 64 positions
    target_ids = padded([ids[:30] for ids in target_tokenizer.tokenize(targets).to_list()])
    before = np.mean(np.asarray(kt.score(load_models(workdir).models[0], source_ids, target_ids,
                                         pad_id=config.pad_id, bos_id=config.bos_id)))
    after = np.mean(np.asarray(kt.score(load_models(tuned).models[0], source_ids, target_ids,
                                        pad_id=config.pad_id, bos_id=config.bos_id)))
    assert after > before
    # The tuned run exports (CTranslate2: the SavedModel export of an import is the test above) and translates as
    # the tuned workdir does.
    out = make_exporter("ctranslate2").export(tuned, tmp_path / "export", strategy="greedy")
    expected = load_translator(tuned, strategy="greedy").translate_lines(SENTENCES[:2])
    assert load_translator(out).translate_lines(SENTENCES[:2]) == expected and len(expected) == 2
    # The tuned run keeps the import's record and its decoding defaults (beam 4, alpha 1.0: the config sets none),
    # its export names both and what it decodes with; an average written elsewhere takes the record beside it.
    from keras_transformer.workdir.checkpoints import average_workdir, read_model_file
    from keras_transformer.workdir.provenance import checkpoint_provenance
    assert read_model_file(tuned / "model.yaml")[1] == read_model_file(workdir / "model.yaml")[1]
    record = json.loads((tuned / "imported.json").read_text())
    assert record["source"] == json.loads((workdir / "imported.json").read_text())["source"]
    assert record["fine_tuned"]["weights"]
    _check_provenance(out, tuned, "README.md", "greedy: max_extra 50", "</s>", fine_tuned=True)
    metadata = json.loads((pathlib.Path(out) / "keras_transformer.json").read_text())
    assert metadata["provenance"]["licence"] == LICENCE and metadata["special_ids"]["eos_id"] == 0
    (tmp_path / "elsewhere").mkdir()
    averaged, _ = average_workdir(tuned, checkpoints=sorted((tuned / "checkpoints").glob("ckpt-*.weights.h5")),
                                  output=tmp_path / "elsewhere" / "tuned.weights.h5")
    assert checkpoint_provenance(averaged) == record


@pytest.mark.slow
def test_evaluate_plot_attention_and_serve_take_the_imported_workdir(references, tmp_path, capsys, monkeypatch):
    """The commands that read a workdir read an imported one unchanged (separate vocabularies): `evaluate` scores
    the workdir's own translations as references at BLEU 100, `plot-attention` draws every layer of each kind,
    and `serve` (its load function run by the application in this process) answers /translate and predict with
    the workdir's translations."""
    import socket
    import threading
    import urllib.request

    uvicorn = pytest.importorskip("uvicorn")
    from keras_transformer import cli, serving
    from keras_transformer.engines.loader import load_translator
    _, workdir, reference, _ = references["separate_gelu"]
    lines = SENTENCES[:4]
    expected = load_translator(workdir, strategy="greedy", max_extra=MAX_EXTRA).translate_lines(lines)
    greedy = ["--strategy", "greedy", "--max-extra", str(MAX_EXTRA)]
    (tmp_path / "src.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("\n".join(expected) + "\n", encoding="utf-8")
    assert cli.main(["evaluate", "--model", str(workdir), "--source", str(tmp_path / "src.en"), "--reference",
                     str(tmp_path / "ref.de"), "--json", *greedy]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bleu"] == 100.0 and report["sentences"] == 4

    assert cli.main(["plot-attention", "--model", str(workdir), lines[0], "--out", str(tmp_path / "maps"),
                     "--beam-size", "1"]) == 0
    layers = {"encoder_self": reference.config.encoder_layers, "decoder_self": reference.config.decoder_layers,
              "cross": reference.config.decoder_layers}
    assert sorted(os.listdir(tmp_path / "maps")) == sorted(["translation.txt"] + [
        f"{kind}_layer{layer}.png" for kind, count in layers.items() for layer in range(1, count + 1)])

    built = {}
    monkeypatch.setattr(serving, "serve", lambda load, name, **options: built.update(
        app=serving.build_app(load, name, options["settings"])) or 0)
    assert cli.main(["serve", "--model", str(workdir), *greedy]) == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(built["app"], host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run)
    thread.start()

    def call(path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data),
                                    timeout=60) as answer:
            return json.loads(answer.read())

    try:
        for _ in range(600):
            try:
                if call("/readyz")["status"] == "ready":
                    break
            except OSError:  # not listening yet, or 503 while the model loads and warms up
                pass
            threading.Event().wait(0.1)
        assert call("/translate", {"sentences": lines})["translations"] == expected
        name = workdir.name
        predicted = call(f"/v1/models/{name}:predict", {"instances": lines})["predictions"]
        assert [row["translation"] for row in predicted] == expected
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def test_a_large_matrix_read_from_a_checkpoint_becomes_the_variable_s_memory_with_its_exact_values(tmp_path):
    """On TensorFlow a large matrix read from a safetensors file is taken over by the variable (no full-size
    copy); a view that is not aligned, and a transposed one, are copied once; the values are the array's, bit for
    bit, either way, and the original of a copied view is left as it was."""
    import struct

    import keras

    from keras_transformer.imports.checkpoint import SafetensorsFile
    from keras_transformer.imports.tensorflow_weights import LARGE_BYTES, assign_array

    rows, columns = 1024, 600  # 2.4 MB: more than LARGE_BYTES
    assert rows * columns * 4 > LARGE_BYTES
    values = np.random.default_rng(0).standard_normal((rows, columns)).astype(np.float32)
    header = json.dumps({"w": {"dtype": "F32", "shape": [rows, columns], "data_offsets": [0, values.nbytes]}})
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + values.tobytes())
    read = SafetensorsFile(path)["w"]
    variable = keras.Variable(np.zeros((rows, columns), np.float32))
    assign_array(variable, read)
    np.testing.assert_array_equal(variable.numpy(), values)
    read[0, 0] = 42.0  # the variable's memory is the array's (why a caller drops the array): not a copy
    assert variable.numpy()[0, 0] == 42.0

    unaligned = np.frombuffer(bytearray(4) + values.tobytes(), np.float32)[1:].reshape(rows, columns)
    for view, expected in ((unaligned, values), (values.T.copy().T, values), (values[:, ::-1], values[:, ::-1])):
        before = view.copy()
        other = keras.Variable(np.zeros((rows, columns), np.float32))
        assign_array(other, view)
        np.testing.assert_array_equal(other.numpy(), expected)
        np.testing.assert_array_equal(view, before)
        view[0, 0] = 42.0
        assert other.numpy()[0, 0] == before[0, 0] != 42.0  # a copy



@pytest.mark.slow
def test_an_imported_model_translates_a_document_sentence_by_sentence_with_its_layout(references):
    """An imported Marian workdir through translate_document: two paragraphs and a list come back with each
    sentence translated as translate_lines translates it alone, counted by the imported tokenizer."""
    from keras_transformer.engines.loader import load_translator
    _, workdir, _, tokenizer = references["separate_gelu"]
    translator = load_translator(workdir, strategy="greedy")
    expected = translator.translate_lines(DOCUMENT_SENTENCES)
    assert len(set(expected)) > 1
    assert translator.translate_document(DOCUMENT) == document_layout(expected)
    details = translator.translate_document(DOCUMENT, details=True)
    assert details["text"] == document_layout(expected)
    assert [(r["source"], r["translation"]) for r in details["sentences"]] == list(zip(DOCUMENT_SENTENCES, expected))
    assert all(r["tokens"] >= 1 and r["mean_log_prob"] < 0 for r in details["sentences"])
    # the budget counts the imported tokenizer's pieces: the reference's ids less its </s>
    assert [translator.count_source_tokens(s) for s in DOCUMENT_SENTENCES] == [
        len(tokenizer(s)["input_ids"]) - 1 for s in DOCUMENT_SENTENCES]


@pytest.mark.slow
def test_every_term_holds_on_an_imported_marian_model(references):
    """Slow: a random imported model's constrained beam search runs to its length limit, eagerly, four times
    (about 10 s); the fast terms tests use the word-level copy model, not a SentencePiece vocabulary of an
    imported family. Constraints (one and two words, non-ASCII, two in a sentence, one the model never produces,
    a glossary term twice in a source) all appear in the output of an imported Marian model, alone as in the batch, and
    a banned word in none (`factories.check_terms`)."""
    from factories import check_terms

    from keras_transformer.decoding import Glossary
    from keras_transformer.engines.loader import load_translator
    _, workdir, _, _ = references["separate_gelu"]
    translator = load_translator(workdir, beam_size=3, max_extra=MAX_EXTRA)
    check_terms(translator, "Fahrrad", Glossary.parse("man\tMann\n"))


@pytest.mark.slow
def test_the_litert_export_translates_as_the_workdir_with_its_two_vocabularies(references, tmp_path):
    """A LiteRT export of an imported workdir with separate vocabularies (two SentencePiece models, two vocabulary
    files) gives the workdir's beam hypotheses and scores and its greedy translations, and names the import, its
    licence, its decoding and its special ids; a slow test: it converts a model (and needs transformers)."""
    pytest.importorskip("ai_edge_litert")
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, _, _ = references["separate_gelu"]
    lines = SENTENCES[:4]
    translator = load_translator(workdir, strategy="beam", jit_compile=False)
    out = make_exporter("litert").export(workdir, tmp_path / "litert", strategy="beam")
    exported = load_translator(out)
    assert exported.engine == "litert" and exported.mapped and exported.options == translator.options
    expected, found = translator.n_best_lines(lines), exported.n_best_lines(lines)
    assert [[text for text, _ in row] for row in found] == [[text for text, _ in row] for row in expected]
    np.testing.assert_allclose([[s for _, s in row] for row in found], [[s for _, s in row] for row in expected],
                               atol=1e-4)
    greedy = {"strategy": "greedy"}
    assert exported.with_options(exported.options.replace(**greedy)).translate_lines(lines) == \
        translator.with_options(translator.options.replace(**greedy)).translate_lines(lines)
    assert len({row[0][0] for row in expected}) > 1
    files = json.loads((tmp_path / "litert" / "litert.json").read_text())
    assert files["sentencepiece"] == {"source": "source.sentencepiece.model", "target": "target.sentencepiece.model"}
    _check_provenance(out, workdir, "README.md", translator.options.describe(), "</s>")


def test_training_batches_hold_the_reference_tokenizer_s_ids_and_the_loss_is_its_cross_entropy(references):
    """Fine-tuning an import trains on the checkpoint's own ids: the pipeline's sources, decoder inputs and labels
    are the reference tokenizer's (its end token, padded with its pad id, the decoder started from its start id),
    and the training loss equals transformers' cross-entropy on them (`factories.check_training_batch`)."""
    _, workdir, reference, tokenizer = references["separate_gelu"]
    model, config, source, target = load_imported(workdir)
    check_training_batch(reference, tokenizer, model, config, source, target, lines_of("val.en.gz", 10),
                         lines_of("val.de.gz", 10))
