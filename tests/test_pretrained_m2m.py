"""keras-transformer import of M2M-100 / NLLB-200 checkpoints (model_type m2m_100): small random
M2M100ForConditionalGeneration models (transformers' own classes, the reference), imported and checked against it:
token ids, logits, greedy and beam search with the target language forced; exports; fine-tuning; faults.

Two shapes, built once for the file: NLLB (NllbTokenizer: tokenizer.json numbering sentencepiece.bpe.model's pieces
fairseq's way, language codes such as fra_Latn; relu; two encoder layers, one decoder layer) and M2M-100
(M2M100Tokenizer: vocab.json and fairseq's 100 language codes __xx__; gelu; one encoder layer, two decoder layers;
four heads). The SentencePiece models are trained here on Multi30k lines.
"""

import json
import os
import shutil

import numpy as np
import pytest
from factories import (
    DOCUMENT,
    DOCUMENT_SENTENCES,
    check_training_batch,
    document_layout,
    end_some_translations,
    import_references,
    lines_of,
    load_imported,
    until_eos,
)

import keras_transformer as kt
from keras_transformer.errors import CheckpointNotFoundError, ConfigError, CorruptFileError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("test_pretrained_m2m")

SHAPES = {
    "nllb": dict(tokenizer="nllb", activation="relu", encoder_layers=2, decoder_layers=1, heads=2,
                 source="eng_Latn", target="deu_Latn", other="fra_Latn"),
    "m2m100": dict(tokenizer="m2m100", activation="gelu", encoder_layers=1, decoder_layers=2, heads=4,
                   source="__en__", target="__de__", other="__fr__"),
}
SENTENCES = ["A man rides a bike.", "Two dogs play in the snow near a house.", "A girl.",
             "Zwei Männer sitzen auf einer Bank!"]
MAX_EXTRA = 6
WEIGHT_STD = 0.3


def _generate(reference, ids, language, **options):
    """transformers' generate with the target language forced first (its `forced_bos_token_id`), without the
    decoder's start token."""
    with torch.no_grad():
        output = reference.generate(torch.tensor([ids]), max_new_tokens=len(ids) + MAX_EXTRA, do_sample=False,
                                    forced_bos_token_id=language, forced_eos_token_id=None, **options)
    return output[0].tolist()[1:]


def build_reference(folder, *, tokenizer, activation, encoder_layers, decoder_layers, heads, source, target, other,
                    seed=0):
    """A random M2M100ForConditionalGeneration with its tokenizer's files, as save_pretrained saves them (and, for
    NLLB, sentencepiece.bpe.model beside them, as the Hub folders hold it)."""
    import sentencepiece
    folder.mkdir(parents=True)
    model_file = folder / "sentencepiece.bpe.model"
    with open(model_file, "wb") as handle:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines_of("train.en.gz", 300) + lines_of("train.de.gz", 300)), model_writer=handle,
            vocab_size=200, model_type="bpe", character_coverage=1.0, minloglevel=2, num_threads=1)
    if tokenizer == "nllb":
        reference = transformers.NllbTokenizer.from_pretrained(str(folder), src_lang=source, tgt_lang=target,
                                                               additional_special_tokens=[source, target, other])
        vocab_size = len(reference) + 3  # rows no token names, as published models round their sizes
    else:
        processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for index in range(processor.get_piece_size()):
            if not (processor.is_control(index) or processor.is_unknown(index)):
                vocabulary.setdefault(processor.id_to_piece(index), len(vocabulary))
        json.dump(vocabulary, open(folder / "vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
        reference = transformers.M2M100Tokenizer(str(folder / "vocab.json"), str(model_file), src_lang=source[2:-2],
                                                 tgt_lang=target[2:-2])
        vocab_size = reference.vocab_size + len(reference.lang_code_to_id) + 8  # and M2M-100's 8 made-up words
    config = transformers.M2M100Config(
        vocab_size=vocab_size, d_model=16, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=32, decoder_ffn_dim=32,
        activation_function=activation, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, scale_embedding=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(seed)
    model = transformers.M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0, WEIGHT_STD if parameter.dim() > 1 else 0.1)
            if "layer_norm.weight" in name:
                parameter.add_(1.0)
    model.generation_config.bad_words_ids = [[config.pad_token_id]]  # the package never produces pad
    language = reference.convert_tokens_to_ids(other)
    end_some_translations(model, reference(SENTENCES)["input_ids"],
                          lambda model, ids: _generate(model, ids, language, num_beams=1))
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    reference.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """name -> (checkpoint folder, imported workdir, the transformers model, its tokenizer)."""
    root = tmp_path_factory.mktemp("pretrained_m2m")
    return import_references(root, SHAPES, build_reference, transformers.M2M100ForConditionalGeneration)


@pytest.mark.parametrize("name", SHAPES)
def test_token_ids_equal_the_reference_tokenizer(references, name):
    """Sources [src_lang] tokens </s> and targets [tgt_lang] tokens </s>, as the reference tokenizer gives them;
    a sentence that opens with a language code has that language; decoding drops the language and special tokens
    as `batch_decode(skip_special_tokens=True)` does."""
    import tensorflow as tf
    _, workdir, _, reference = references[name]
    _, config, source, target = load_imported(workdir)
    shape = SHAPES[name]
    lines = lines_of("val.en.gz", 60) + SENTENCES + ["", "  spaces", "Ünïcödé ☃ text"]
    if name == "m2m100":  # NllbTokenizer (the tokenizers library) keeps trailing spaces as a "▁"; SentencePiece not
        lines.append("trailing spaces  ")
    assert [ids + [config.eos_id] for ids in source.tokenize(lines).to_list()] == reference(lines)["input_ids"]
    german = lines_of("val.de.gz", 40)
    assert [ids + [config.eos_id] for ids in target.tokenize(german).to_list()] == \
        reference(text_target=german)["input_ids"]
    other = reference.convert_tokens_to_ids(shape["other"])
    assert source.tokenize([f"{shape['other']} A dog."]).to_list()[0] == \
        [other] + reference("A dog.", add_special_tokens=False)["input_ids"]
    assert target.languages == source.languages and shape["other"] in target.languages
    # the reference decodes the rows without their language tokens (M2M100Tokenizer, once saved by transformers 5,
    # no longer counts them as special); ours drops them
    rows = [row[1:] + [config.eos_id, config.pad_id] for row in reference(text_target=german)["input_ids"]]
    ids = [[other, row_language] + row for row_language, row in
           zip((ids[0] for ids in reference(text_target=german)["input_ids"]), rows)]
    assert [text.decode() for text in target.detokenize(tf.ragged.constant(ids)).numpy()] == \
        reference.batch_decode(rows, skip_special_tokens=True)


@pytest.mark.parametrize("name", SHAPES)
def test_logits_equal_the_reference_on_a_padded_batch(references, name):
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    assert (config.bos_id, config.eos_id, config.position_offset) == (2, 2, 2)
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # padded rows
    rng = np.random.default_rng(0)
    decoder_input = np.full((len(SENTENCES), 7), config.bos_id)  # starts from eos, as M2M-100's decoder
    decoder_input[:, 1:] = rng.integers(3, config.vocab_size, size=(len(SENTENCES), 6))
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             decoder_input_ids=torch.tensor(decoder_input)).logits.numpy()
    ours = np.asarray(model({"source": batch["input_ids"].numpy().astype("int32"),
                             "target": decoder_input.astype("int32")}))
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHAPES)
def test_greedy_and_beam_search_equal_generate_with_the_language_forced(references, name):
    """Our searches with the target language as the target prefix, transformers' with it as forced_bos_token_id:
    the same ids, sentence by sentence, the decoder starting from eos (which ends a hypothesis only when
    produced)."""
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    special = dict(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)
    language = tokenizer.convert_tokens_to_ids(SHAPES[name]["other"])
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)["input_ids"].astype("int32")  # (B, S), padded
    prefix = [[language]] * len(SENTENCES)
    greedy, _ = kt.greedy_decode(model, batch, max_extra=MAX_EXTRA, target_prefix=prefix, **special)  # (B, T)
    beam, _ = kt.beam_search(model, batch, beam_size=4, alpha=0.0, max_extra=MAX_EXTRA, target_prefix=prefix,
                             **special)  # (B, 1, T)
    ended = 0
    for row, ids in enumerate(tokenizer(SENTENCES)["input_ids"]):
        expected = _generate(reference, ids, language, num_beams=1)
        assert until_eos(np.asarray(greedy)[row], config) == until_eos(expected, config)
        ended += config.eos_id in expected
        expected = _generate(reference, ids, language, num_beams=4, length_penalty=0.0, early_stopping=False)
        assert until_eos(np.asarray(beam)[row, 0], config) == until_eos(expected, config)
    assert ended  # some translation ended with eos before its limit


def test_the_workdir_records_the_family_and_the_options(references):
    _, workdir, _, _ = references["nllb"]
    record = json.loads((workdir / "imported.json").read_text())
    assert record["family"] == "m2m_100" and set(record["files"]) >= {"tokenizer.json", "sentencepiece.bpe.model"}
    from keras_transformer.workdir.checkpoints import read_model_file
    config, options = read_model_file(workdir / "model.yaml")
    assert (options.strategy, options.beam_size) == ("beam", 4)
    assert config.norm_first and config.sinusoid_layout == "fairseq" and config.tie_embeddings == "all"
    assert not config.output_bias and config.bos_id == config.eos_id
    assert kt.TransformerConfig.from_yaml(workdir / "model.yaml") == config


def test_languages_are_taken_by_the_codes_users_know_and_an_ambiguous_code_is_refused_naming_its_candidates(
        references):
    """`--target-lang de` / `source_lang="de"`: M2M-100's `__de__` (as transformers' `get_lang_id("de")`), NLLB's
    `deu_Latn` (`deu` too), as the model's own token (the export test below translates with `fr` on both exports).
    A code that names several tokens is refused naming them; one that names none, naming the model's languages."""
    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.engines.interface import TranslatorInterface
    from keras_transformer.engines.languages import language_token

    class Languages(TranslatorInterface):  # what every engine's translator inherits, with the import's languages
        translate_batch = n_best_batch = score_batch = None

        def __init__(self, workdir):
            source, target = load_tokenizers(workdir / "data" / "vocab")
            self.source_languages, self.target_languages = tuple(source.languages), tuple(target.languages)

    translators = {name: Languages(references[name][1]) for name in SHAPES}
    for name, code, token in (("m2m100", "de", "__de__"), ("m2m100", "deu", "__de__"), ("nllb", "de", "deu_Latn"),
                              ("nllb", "deu", "deu_Latn"), ("nllb", "fr", "fra_Latn")):
        translator = translators[name]
        assert translator.target_prefixes(2, "Ein", target_lang=code) == [f"{token} Ein"] * 2, (name, code)
        assert translator.with_source_lang(["Hallo.", ""], code) == [f"{token} Hallo.", ""], (name, code)
    tokenizer = references["m2m100"][3]
    assert tokenizer.get_lang_id("de") == tokenizer.convert_tokens_to_ids("__de__")  # transformers' reading of de
    m2m, nllb = translators["m2m100"], translators["nllb"]
    with pytest.raises(ConfigError, match=r"target language 'a' names several of this model's: __af__, __am__, "
                                          r"__ar__, __ast__, __az__; give one of them"):
        m2m.target_prefixes(1, target_lang="a")
    with pytest.raises(ConfigError, match=r"unknown source language 'es'; this model's source languages \(3\): "
                                          r"deu_Latn, eng_Latn, fra_Latn"):  # es is Spanish (spa), not est_Latn
        nllb.with_source_lang(["Hola."], "es")
    # NLLB's codes with several scripts: the language's code names both
    with pytest.raises(ConfigError, match="names several of this model's: zho_Hans, zho_Hant; give one of them"):
        language_token("zh", ["eng_Latn", "zho_Hans", "zho_Hant"])
    assert language_token("es", ["est_Latn", "spa_Latn"]) == "spa_Latn"


@pytest.mark.parametrize("fault, error, named", [
    ("model_type", ConfigError, "model_type 'bert' is not a family"),
    ("tokenizer", CheckpointNotFoundError, "sentencepiece.bpe.model is missing"),
    ("truncated", CorruptFileError, "model.safetensors cannot be read"),
    ("shape", ConfigError, "model.encoder.layers.0.fc1.weight has shape (32, 16) but config.json's sizes give "
                           "(48, 16)"),
])
def test_a_faulty_checkpoint_ends_in_one_line_naming_it_and_writes_nothing(references, tmp_path, capsys, fault,
                                                                           error, named):
    folder = tmp_path / "checkpoint"
    shutil.copytree(references["nllb"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    if fault == "model_type":
        config["model_type"] = "bert"
    elif fault == "shape":
        config["encoder_ffn_dim"] = config["decoder_ffn_dim"] = 48
    elif fault == "tokenizer":
        (folder / "sentencepiece.bpe.model").unlink()
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
    """Both exports of an imported NLLB workdir give the workdir's translations, greedy, strings in and strings
    out, with a target language forced, a source language given, and neither."""
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, reference, tokenizer = references["nllb"]
    lines = SENTENCES
    translator = load_translator(workdir, strategy="greedy")
    expected = {"plain": translator.translate_lines(lines),
                "target": translator.translate_lines(lines, target_lang="fra_Latn"),
                "source": translator.translate_lines(translator.with_source_lang(lines, "deu_Latn"))}
    assert len(set(expected["target"])) > 1 and expected["target"] != expected["plain"]
    # the workdir's translation is transformers' generate, detokenized as its tokenizer does
    ids = _generate(reference, tokenizer(lines[0])["input_ids"], tokenizer.convert_tokens_to_ids("fra_Latn"))
    assert expected["target"][0] == tokenizer.decode(ids, skip_special_tokens=True)
    for name in ("savedmodel", "ctranslate2"):
        # Without XLA: what an import adds (its tokenizers in the graph, its model options) is the same graph either
        # way, and test_export checks the XLA-compiled search against the uncompiled one.
        options = {"jit_compile": False} if name == "savedmodel" else {}
        out = make_exporter(name, **options).export(workdir, tmp_path / name, strategy="greedy")
        exported = load_translator(out)
        assert exported.target_languages == translator.target_languages, name
        assert exported.translate_lines(lines) == expected["plain"], name
        assert exported.translate_lines(lines, target_lang="fra_Latn") == expected["target"], name
        assert exported.translate_lines(lines, target_lang="fr") == expected["target"], name  # the code users know
        assert exported.translate_lines(exported.with_source_lang(lines, "deu_Latn")) == expected["source"], name
        assert exported.source_language == translator.source_language == "eng_Latn", name  # the export's metadata
        # its card and manifest: imported (from where), greedy, NLLB's special ids (pad 1, eos 2; no <blank>)
        card = (tmp_path / name / "README.md").read_text()
        source = json.loads((workdir / "imported.json").read_text())["source"]
        assert f"Imported from {source}" in card and "greedy: max_extra 50" in card, name
        assert "pad 1 `<pad>`" in card and "eos 2 `</s>`" in card and "<blank>" not in card, name
        assert json.loads((tmp_path / name / "manifest.json").read_text())["provenance"]["source"] == source
        # the signals count the forced language token on every engine alike
        ours, theirs = (t.translate_detailed(lines, target_lang="fra_Latn") for t in (translator, exported))
        assert [d.tokens for d in theirs] == [d.tokens for d in ours], name
        np.testing.assert_allclose([d.mean_log_prob for d in theirs], [d.mean_log_prob for d in ours], atol=1e-4)
        assert ([exported.count_source_tokens(line) for line in lines] ==
                [translator.count_source_tokens(line) for line in lines]), name
    import tensorflow as tf
    loaded = tf.saved_model.load(str(tmp_path / "savedmodel"))
    served = loaded.signatures["translate_prefix"](inputs=tf.constant(lines),
                                                   target_prefix=tf.constant(["fra_Latn"] * len(lines)))
    assert [text.decode() for text in served["translation"].numpy()] == expected["target"]


@pytest.mark.slow
def test_three_fine_tuning_updates_raise_the_likelihood_of_the_data_and_the_result_exports(references, tmp_path):
    """train with training.init_checkpoint on an imported M2M-100 workdir: its vocabulary is taken (targets open
    with the target language, the decoder starts from eos), three updates raise log P(targets | sources) of the
    training pairs, and the tuned run exports."""
    import yaml

    from keras_transformer import training
    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    from keras_transformer.workdir.checkpoints import load_models
    _, workdir, _, _ = references["m2m100"]
    sources, targets = lines_of("val.en.gz", 48), lines_of("val.de.gz", 48)
    for name, lines in (("train.en", sources), ("train.de", targets)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    fields = yaml.safe_load((workdir / "model.yaml").read_text(encoding="utf-8"))
    fields.pop("decoding")
    experiment = {
        "model": {**fields, "dropout": 0.0},
        "data": {"kind": "text", "train_source": str(tmp_path / "train.en"), "train_target": str(tmp_path / "train.de"),
                 "tokens_per_batch": 4096, "max_length": 40},
        "training": {"label_smoothing": 0.0, "warmup_steps": 1, "learning_rate_scale": 0.5, "epochs": 1,
                     "steps_per_epoch": 3, "seed": 0, "jit_compile": False,
                     "init_checkpoint": str(workdir / "checkpoints" / "ckpt-0000.weights.h5")},
    }
    tuned = tmp_path / "tuned"
    training.train(experiment, tuned)
    # the initial weights' import record goes with them (training.init_checkpoint alone: no model.from here)
    record = json.loads((tuned / "imported.json").read_text())
    assert record["source"] == json.loads((workdir / "imported.json").read_text())["source"]
    assert record["fine_tuned"]["weights"]
    source_tokenizer, target_tokenizer = load_tokenizers(tuned / "data" / "vocab")
    config = load_models(workdir).configs[0]
    assert target_tokenizer.tokenize(["Ein Hund."]).to_list()[0][0] == \
        target_tokenizer.tokens.index(target_tokenizer.language)

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
    expected = load_translator(tuned, strategy="greedy").translate_lines(SENTENCES[:2], target_lang="__fr__")
    assert load_translator(out).translate_lines(SENTENCES[:2], target_lang="__fr__") == expected and len(expected) == 2


@pytest.mark.parametrize("d_model", [16, 17])
def test_the_fairseq_sinusoids_with_an_offset_are_m2m_100s_table_and_round_trip(d_model):
    """`PositionalEncoding(layout="fairseq", offset=2)` adds at index t the row of position t + 2 of
    `M2M100SinusoidalPositionalEmbedding` (odd widths: a zero last column), and is rebuilt by `from_config`."""
    import keras
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    from keras_transformer.layers import PositionalEncoding
    expected = M2M100SinusoidalPositionalEmbedding.get_embedding(40 + 2, d_model, padding_idx=1).numpy()[2:]
    layer = PositionalEncoding(40, layout="fairseq", offset=2)
    out = np.asarray(layer(np.zeros((1, 40, d_model), "float32")))[0]
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=0)  # torch computes in float32
    again = keras.layers.deserialize(keras.layers.serialize(layer))
    assert (again.layout, again.offset) == ("fairseq", 2)
    np.testing.assert_array_equal(np.asarray(again(np.zeros((1, 5, d_model), "float32")))[0], out[:5])



@pytest.mark.slow
def test_an_imported_nllb_model_translates_a_document_with_its_language_codes(references, monkeypatch):
    """An imported NLLB workdir through translate_document: the segmenter takes the model's source language
    (src_lang) or the one given, whose token goes first; the target language's token is forced; each sentence
    comes back as translate_lines translates it alone, in the document's layout."""
    from keras_transformer.documents import document
    from keras_transformer.engines.loader import load_translator
    _, workdir, _, tokenizer = references["nllb"]
    translator = load_translator(workdir, strategy="greedy")
    assert translator.source_language == "eng_Latn"
    languages, segment = [], document.segment
    monkeypatch.setattr(document, "segment", lambda text, language: languages.append(language) or segment(
        text, language))
    expected = translator.translate_lines(DOCUMENT_SENTENCES, target_lang="deu_Latn")
    assert translator.translate_document(DOCUMENT, target_lang="deu_Latn") == document_layout(expected)
    from_german = translator.translate_lines(translator.with_source_lang(DOCUMENT_SENTENCES, "deu_Latn"),
                                             target_lang="deu_Latn")
    assert from_german != expected
    details = translator.translate_document(DOCUMENT, source_lang="deu_Latn", target_lang="deu_Latn", details=True)
    assert details["text"] == document_layout(from_german)
    assert languages == ["eng_Latn", "deu_Latn"]
    assert [(r["source"], r["translation"]) for r in details["sentences"]] == list(zip(DOCUMENT_SENTENCES,
                                                                                        from_german))
    assert all(r["tokens"] >= 2 for r in details["sentences"])  # the language token and </s> at least
    # the budget counts the sentence's pieces: the reference's ids less the language token and </s>
    assert [translator.count_source_tokens(s) for s in DOCUMENT_SENTENCES] == [
        len(tokenizer(s)["input_ids"]) - 2 for s in DOCUMENT_SENTENCES]


@pytest.mark.slow
def test_every_term_holds_on_an_imported_nllb_model_with_its_language_forced(references):
    """Slow: a random imported model's constrained beam search runs to its length limit, eagerly, four times
    (about 10 s); the fast terms tests use the word-level copy model, not a SentencePiece vocabulary of an
    imported family. Constraints (one and two words, non-ASCII, two in a sentence, one the model never produces,
    a glossary term twice in a source) all appear in the output of an imported NLLB model after its
    target language token, alone as in the batch, and a banned word in none (`factories.check_terms`)."""
    from factories import check_terms

    from keras_transformer.decoding import Glossary
    from keras_transformer.engines.loader import load_translator
    _, workdir, _, _ = references["nllb"]
    translator = load_translator(workdir, beam_size=3, max_extra=MAX_EXTRA)
    check_terms(translator, "Fahrrad", Glossary.parse("man\tMann\n"), target_lang="deu_Latn")


@pytest.mark.slow
def test_the_litert_export_translates_as_the_workdir_with_its_languages(references, tmp_path):
    """A LiteRT export of an imported NLLB workdir gives the workdir's translations, beam search (hypotheses and
    scores) and greedy, with a target language forced first (`target_lang`, through the signature's target
    prefix), a source language given, and neither; its card names the import and NLLB's special ids. A slow test:
    it converts a model (and needs transformers)."""
    pytest.importorskip("ai_edge_litert")
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, _, _ = references["nllb"]
    lines = SENTENCES
    translator = load_translator(workdir, strategy="beam", jit_compile=False)
    out = make_exporter("litert").export(workdir, tmp_path / "litert", strategy="beam")
    exported = load_translator(out)
    assert exported.target_languages == translator.target_languages and "fra_Latn" in exported.target_languages
    assert exported.source_language == translator.source_language == "eng_Latn"
    for options in ({}, {"strategy": "greedy"}):
        ours, theirs = (t.with_options(t.options.replace(**options)) for t in (translator, exported))
        for forced in ({}, {"target_lang": "fra_Latn"}):
            expected, found = ours.n_best_lines(lines, **forced), theirs.n_best_lines(lines, **forced)
            assert [[text for text, _ in row] for row in found] == [[text for text, _ in row] for row in expected]
            np.testing.assert_allclose([[s for _, s in row] for row in found],
                                       [[s for _, s in row] for row in expected], atol=1e-4)
        assert theirs.translate_lines(lines, target_lang="fr") == ours.translate_lines(lines, target_lang="fra_Latn")
        assert theirs.translate_lines(theirs.with_source_lang(lines, "deu_Latn")) == \
            ours.translate_lines(ours.with_source_lang(lines, "deu_Latn"))
    plain, french = translator.translate_lines(lines), translator.translate_lines(lines, target_lang="fra_Latn")
    assert plain != french and len(set(french)) > 1
    # the signals count the forced language token on both engines alike
    ours, theirs = (t.translate_detailed(lines, target_lang="fra_Latn") for t in (translator, exported))
    assert [d.tokens for d in theirs] == [d.tokens for d in ours]
    card = (tmp_path / "litert" / "README.md").read_text()
    source = json.loads((workdir / "imported.json").read_text())["source"]
    assert f"Imported from {source}" in card and translator.options.describe() in card
    assert "pad 1 `<pad>`" in card and "eos 2 `</s>`" in card and "fra_Latn" in card
    assert json.loads((tmp_path / "litert" / "manifest.json").read_text())["provenance"]["source"] == source


def test_training_batches_hold_the_reference_tokenizer_s_ids_and_the_loss_is_its_cross_entropy(references):
    """Fine-tuning an import trains on the checkpoint's own ids: the pipeline's sources, decoder inputs and labels
    are the reference tokenizer's (its end token, padded with its pad id, the decoder started from its start id),
    and the training loss equals transformers' cross-entropy on them (`factories.check_training_batch`)."""
    _, workdir, reference, tokenizer = references["nllb"]
    model, config, source, target = load_imported(workdir)
    check_training_batch(reference, tokenizer, model, config, source, target, lines_of("val.en.gz", 10),
                         lines_of("val.de.gz", 10))
