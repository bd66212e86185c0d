"""keras-transformer import of mBART-50 checkpoints (model_type mbart): small random MBartForConditionalGeneration
models (transformers' own classes, the reference), imported and checked against it: token ids, logits, greedy and
beam search with the target language forced; exports; a sharded save; faults.

Two shapes, built once for the file, both with MBart50Tokenizer (sentencepiece.bpe.model, a unigram model as mBART's
is, trained here on Multi30k lines; fairseq's numbering; the 52 language codes such as de_DE): "scaled"
(scale_embedding true, gelu, two encoder layers and one decoder layer, two heads) and "unscaled" (scale_embedding
false, relu, one encoder layer and two decoder layers, four heads, a final_logits_bias that is not zero).
"""

import json
import os
import shutil

import numpy as np
import pytest
from factories import end_some_translations, import_references, lines_of, load_imported, until_eos

import keras_transformer as kt
from keras_transformer.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("test_pretrained_mbart")

SHAPES = {
    "scaled": dict(scale=True, activation="gelu", encoder_layers=2, decoder_layers=1, heads=2, logits_bias=False),
    "unscaled": dict(scale=False, activation="relu", encoder_layers=1, decoder_layers=2, heads=4, logits_bias=True),
}
SOURCE, TARGET, OTHER = "en_XX", "de_DE", "fr_XX"
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


def build_reference(folder, *, scale, activation, encoder_layers, decoder_layers, heads, logits_bias, seed=0):
    """A random MBartForConditionalGeneration with MBart50Tokenizer's files, as save_pretrained saves them."""
    import sentencepiece
    folder.mkdir(parents=True)
    with open(folder / "sentencepiece.bpe.model", "wb") as handle:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines_of("train.en.gz", 300) + lines_of("train.de.gz", 300)), model_writer=handle,
            vocab_size=200, model_type="unigram", character_coverage=1.0, minloglevel=2, num_threads=1)
    reference = transformers.MBart50Tokenizer.from_pretrained(str(folder), src_lang=SOURCE, tgt_lang=TARGET)
    config = transformers.MBartConfig(
        vocab_size=len(reference) + 2, d_model=16, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=32, decoder_ffn_dim=32,
        activation_function=activation, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, scale_embedding=scale, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        tokenizer_class="MBart50Tokenizer")
    torch.manual_seed(seed)
    model = transformers.MBartForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0, WEIGHT_STD if parameter.dim() > 1 else 0.1)
            if "layer_norm.weight" in name or "layernorm_embedding.weight" in name:
                parameter.add_(1.0)
        if logits_bias:
            model.final_logits_bias.normal_(0, 0.1)
    model.generation_config.bad_words_ids = [[config.pad_token_id]]  # the package never produces pad
    language = reference.convert_tokens_to_ids(OTHER)
    end_some_translations(model, reference(SENTENCES)["input_ids"],
                          lambda model, ids: _generate(model, ids, language, num_beams=1))
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    reference.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """name -> (checkpoint folder, imported workdir, the transformers model, its tokenizer)."""
    root = tmp_path_factory.mktemp("pretrained_mbart")
    return import_references(root, SHAPES, build_reference, transformers.MBartForConditionalGeneration)


def test_token_ids_equal_the_reference_tokenizer(references):
    """Sources [src_lang] tokens </s> and targets [tgt_lang] tokens </s>, as MBart50Tokenizer gives them (fairseq's
    ids, SentencePiece's one up, the language codes after them); a sentence that opens with a language code has
    that language; decoding drops the language and special tokens as `batch_decode(skip_special_tokens=True)`."""
    import tensorflow as tf
    _, workdir, _, reference = references["scaled"]
    _, config, source, target = load_imported(workdir)
    lines = lines_of("val.en.gz", 60) + SENTENCES + ["", "  spaces", "Ünïcödé ☃ text"]
    assert [ids + [config.eos_id] for ids in source.tokenize(lines).to_list()] == reference(lines)["input_ids"]
    german = lines_of("val.de.gz", 40)
    assert [ids + [config.eos_id] for ids in target.tokenize(german).to_list()] == \
        reference(text_target=german)["input_ids"]
    other = reference.convert_tokens_to_ids(OTHER)
    assert source.tokenize([f"{OTHER} A dog."]).to_list()[0] == \
        [other] + reference("A dog.", add_special_tokens=False)["input_ids"]
    assert len(source.languages) == 52 and (source.language, target.language) == (SOURCE, TARGET)
    rows = [row[1:] + [config.eos_id, config.pad_id] for row in reference(text_target=german)["input_ids"]]
    assert [text.decode() for text in target.detokenize(tf.ragged.constant([[other] + row for row in rows])).numpy()] \
        == reference.batch_decode(rows, skip_special_tokens=True)


@pytest.mark.parametrize("name", SHAPES)
def test_logits_equal_the_reference_on_a_padded_batch(references, name):
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    assert (config.bos_id, config.eos_id, config.position, config.embedding_norm) == (2, 2, "learned", True)
    assert config.scale_embeddings == SHAPES[name]["scale"] and config.output_bias == SHAPES[name]["logits_bias"]
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # padded rows
    rng = np.random.default_rng(0)
    decoder_input = np.full((len(SENTENCES), 7), config.bos_id)  # starts from eos, as mBART-50's decoder
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
    """Slow: eight of transformers' generate calls a shape, beam search among them. Our searches with the target
    language as the target prefix, transformers' with it as forced_bos_token_id: the same ids, sentence by
    sentence, the decoder starting from eos (which ends a hypothesis only when produced)."""
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    special = dict(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)
    language = tokenizer.convert_tokens_to_ids(OTHER)
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


def test_the_workdir_records_the_family_and_the_languages_by_the_codes_users_know(references):
    """imported.json names the family; model.yaml the architecture; `--target-lang de` and `de_DE` alike."""
    from keras_transformer.engines.languages import language_token
    from keras_transformer.workdir.checkpoints import read_model_file
    _, workdir, _, _ = references["scaled"]
    record = json.loads((workdir / "imported.json").read_text())
    assert record["family"] == "mbart" and set(record["files"]) >= {"tokenizer.json", "sentencepiece.bpe.model"}
    config, options = read_model_file(workdir / "model.yaml")
    assert (options.strategy, options.beam_size) == ("beam", 4)
    assert config.norm_first and config.tie_embeddings == "all" and config.max_length == 64
    _, _, _, target = load_imported(workdir)
    for code in ("de", "deu", "de_DE"):
        assert language_token(code, target.languages) == "de_DE"
    assert language_token("zh", target.languages) == "zh_CN" and language_token("es", target.languages) == "es_XX"


def _weights(workdir):
    import h5py
    arrays = {}
    with h5py.File(workdir / "checkpoints" / "ckpt-0000.weights.h5", "r") as handle:
        handle.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset)
                          else None)
    return arrays


@pytest.mark.slow
def test_a_sharded_save_pretrained_imports_to_the_same_weights(references, tmp_path):
    """Slow: an import of its own (a few seconds). save_pretrained with a small max_shard_size: shards and their
    index, imported to the unsharded import's weights bit for bit."""
    folder, workdir, reference, _ = references["unscaled"]
    sharded = tmp_path / "sharded"
    shutil.copytree(folder, sharded, ignore=shutil.ignore_patterns("model.safetensors"))
    reference.save_pretrained(sharded, max_shard_size="20KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    ours, expected = _weights(kt.import_checkpoint(sharded, tmp_path / "workdir")), _weights(workdir)
    assert sorted(ours) == sorted(expected) and len(ours) > 20
    for name, value in expected.items():
        assert ours[name].dtype == value.dtype and np.array_equal(ours[name], value), name


@pytest.mark.parametrize("fault, named", [
    ("tokenizer", "tokenizer_class 'BertTokenizer' is not read; the package imports MBart50Tokenizer's layout"),
    ("positions", "model.encoder.embed_positions.weight has shape (66, 16) but config.json's sizes give (34, 16)"),
])
def test_a_checkpoint_the_model_cannot_hold_is_refused_by_name_and_writes_nothing(references, tmp_path, fault,
                                                                                  named):
    """A tokenizer of neither mBART layout (MBart50Tokenizer's, MBartTokenizer's: tests/test_pretrained_mbart_cc25.py),
    and positions that are not config.json's."""
    folder = tmp_path / "checkpoint"
    shutil.copytree(references["scaled"][0], folder)
    for name in ("tokenizer_config.json", "config.json"):
        settings = json.loads((folder / name).read_text())
        if fault == "tokenizer" and name == "tokenizer_config.json":
            settings["tokenizer_class"] = "BertTokenizer"
        elif fault == "positions" and name == "config.json":
            settings["max_position_embeddings"] = 32
        (folder / name).write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        kt.import_checkpoint(folder, tmp_path / "workdir")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]


@pytest.mark.slow
def test_the_savedmodel_ctranslate2_and_litert_exports_translate_as_the_workdir(references, tmp_path):
    """Slow: three exports. The SavedModel, CTranslate2 and LiteRT exports of an imported mBART-50 workdir
    (learned positions, the embedding norm) give the workdir's translations, greedy, strings in and strings out,
    with a target language forced (by its code and by the code users know) and without."""
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, reference, tokenizer = references["unscaled"]
    lines = SENTENCES
    translator = load_translator(workdir, strategy="greedy")
    expected = {"plain": translator.translate_lines(lines),
                "target": translator.translate_lines(lines, target_lang=OTHER)}
    assert len(set(expected["target"])) > 1 and expected["target"] != expected["plain"]
    # the workdir's translation is transformers' generate (as long at most), detokenized as its tokenizer does
    ids = _generate(reference, tokenizer(lines[0])["input_ids"], tokenizer.convert_tokens_to_ids(OTHER), num_beams=1)
    short = load_translator(workdir, strategy="greedy", max_extra=MAX_EXTRA)
    assert short.translate_lines(lines[:1], target_lang=OTHER) == [tokenizer.decode(ids, skip_special_tokens=True)]
    for name in ("savedmodel", "ctranslate2", "litert"):
        options = {"jit_compile": False} if name == "savedmodel" else {}
        out = make_exporter(name, **options).export(workdir, tmp_path / name, strategy="greedy")
        exported = load_translator(out)
        assert exported.translate_lines(lines) == expected["plain"], name
        assert exported.translate_lines(lines, target_lang=OTHER) == expected["target"], name
        assert exported.translate_lines(lines, target_lang="fr") == expected["target"], name
