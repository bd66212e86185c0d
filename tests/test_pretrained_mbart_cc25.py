"""keras-transformer import of mBART-large-cc25 checkpoints (MBartForConditionalGeneration with MBartTokenizer): a
small random model (transformers' own classes, the reference), imported and checked against it: a source is
``tokens </s> [src_lang]``, and the decoder starts from the target language itself (generate's
``decoder_start_token_id = lang_code_to_id[tgt_lang]``), per sentence; exports; a bad target language.

One shape, built once for the file (the helpers of tests/factories.py): MBartTokenizer over a unigram
SentencePiece model trained here on Multi30k lines (fairseq's numbering, the 25 language codes), scale_embedding
true, gelu, two encoder layers and one decoder layer, two heads.
"""

import json

import numpy as np
import pytest
from factories import end_some_translations, lines_of, load_imported, until_eos
from test_pretrained_mbart import MAX_EXTRA, SENTENCES, WEIGHT_STD

import keras_transformer as kt
from keras_transformer.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("test_pretrained_mbart_cc25")

SOURCE, TARGET, OTHER = "en_XX", "de_DE", "fr_XX"
LANGUAGES = [TARGET, OTHER, OTHER, TARGET]  # one per sentence of SENTENCES: two target languages in one batch


def _generate(reference, ids, language, **options):
    """transformers' generate started from the target language (cc25's decoder_start_token_id), without it."""
    with torch.no_grad():
        output = reference.generate(torch.tensor([ids]), max_new_tokens=len(ids) + MAX_EXTRA, do_sample=False,
                                    decoder_start_token_id=language, forced_bos_token_id=None,
                                    forced_eos_token_id=None, **options)
    return output[0].tolist()[1:]


def build_cc25(folder, seed=0):
    """A random MBartForConditionalGeneration with MBartTokenizer's files, as save_pretrained saves them."""
    import sentencepiece
    folder.mkdir(parents=True)
    with open(folder / "sentencepiece.bpe.model", "wb") as handle:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines_of("train.en.gz", 300) + lines_of("train.de.gz", 300)), model_writer=handle,
            vocab_size=200, model_type="unigram", character_coverage=1.0, minloglevel=2, num_threads=1)
    reference = transformers.MBartTokenizer.from_pretrained(str(folder), src_lang=SOURCE, tgt_lang=TARGET)
    config = transformers.MBartConfig(
        vocab_size=len(reference) + 2, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, activation_function="gelu",
        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, scale_embedding=True,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, tokenizer_class="MBartTokenizer")
    torch.manual_seed(seed)
    model = transformers.MBartForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0, WEIGHT_STD if parameter.dim() > 1 else 0.1)
            if "layer_norm.weight" in name or "layernorm_embedding.weight" in name:
                parameter.add_(1.0)
    model.generation_config.bad_words_ids = [[config.pad_token_id]]  # the package never produces pad
    language = reference.convert_tokens_to_ids(OTHER)
    end_some_translations(model, reference(SENTENCES)["input_ids"],
                          lambda model, ids: _generate(model, ids, language, num_beams=1))
    model.save_pretrained(folder)
    reference.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def cc25(tmp_path_factory):
    """(checkpoint folder, imported workdir, the transformers model, its tokenizer, ours: model, config, source and
    target tokenizers)."""
    root = tmp_path_factory.mktemp("pretrained_mbart_cc25")
    folder = build_cc25(root / "cc25")
    workdir = kt.import_checkpoint(folder, root / "workdir")
    model = transformers.MBartForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = transformers.MBartTokenizer.from_pretrained(str(folder), src_lang=SOURCE, tgt_lang=TARGET)
    return (folder, workdir, model, tokenizer, *load_imported(workdir))


def test_sources_are_tokens_eos_then_the_language_as_mbart_tokenizer_gives_them(cc25):
    """Sources `tokens </s> [src_lang]` (MBartTokenizer with src_lang), through the engines' encoding (the graph's
    and the export engines' alike), truncated before the suffix; the 25 language codes at fairseq's ids."""
    from keras_transformer.engines.subwords import source_end
    from keras_transformer.engines.tensorflow_graph import encode_ids
    _, workdir, _, reference, _, config, source, target = cc25
    lines = lines_of("val.en.gz", 40) + SENTENCES + ["", "Ünïcödé ☃ text"]
    ids = encode_ids(source, lines, 256, source.language_last).numpy().tolist()  # (N, S), padded
    ours = [[i for i in row if i != config.pad_id] for row in ids]
    assert ours == reference(lines)["input_ids"]
    assert [source_end(row, config.eos_id, 256, True) for row in source.tokenize(lines).to_list()] == ours
    short = encode_ids(source, SENTENCES[1:2], 5, True).numpy().tolist()[0]
    expected = reference(SENTENCES[1])["input_ids"]
    assert short == expected[:3] + expected[-2:]  # three tokens, then </s> [en_XX]
    assert source.language_last and target.language_last and (source.language, target.language) == (SOURCE, TARGET)
    assert list(source.languages) == list(transformers.models.mbart.tokenization_mbart.FAIRSEQ_LANGUAGE_CODES)
    assert [reference.convert_tokens_to_ids(code) for code in source.languages] == \
        [source.tokens.index(code) for code in source.languages]
    record = json.loads((workdir / "imported.json").read_text())
    assert record["family"] == "mbart" and config.bos_id == config.eos_id == 2


def test_the_layout_is_read_from_the_vocabulary_where_no_tokenizer_class_names_it(cc25, tmp_path):
    """MBartTokenizer's files without tokenizer_class anywhere: its 25 languages say cc25; MBart50Tokenizer's 52
    (written by transformers from the same SentencePiece model) say mBART-50."""
    import shutil

    from keras_transformer.imports.checkpoint import read_checkpoint
    from keras_transformer.imports.mbart import MBartFamily
    for kind, expected in ((transformers.MBartTokenizer, True), (transformers.MBart50Tokenizer, False)):
        folder = tmp_path / kind.__name__
        shutil.copytree(cc25[0], folder)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (folder / name).unlink(missing_ok=True)
        kind.from_pretrained(str(folder), src_lang=SOURCE).save_pretrained(folder)
        for name in ("tokenizer_config.json", "config.json"):
            settings = json.loads((folder / name).read_text())
            settings.pop("tokenizer_class", None)
            (folder / name).write_text(json.dumps(settings))
        assert MBartFamily().language_last(read_checkpoint(folder)) is expected, kind.__name__


def test_logits_equal_the_reference_from_the_target_language_on_a_padded_batch(cc25):
    _, _, reference, tokenizer, model, config, _, _ = cc25
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # padded rows
    rng = np.random.default_rng(0)
    decoder_input = np.zeros((len(SENTENCES), 7), "int64")
    decoder_input[:, 0] = [tokenizer.convert_tokens_to_ids(code) for code in LANGUAGES]  # cc25's start
    decoder_input[:, 1:] = rng.integers(3, config.vocab_size, size=(len(SENTENCES), 6))
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             decoder_input_ids=torch.tensor(decoder_input)).logits.numpy()
    ours = np.asarray(model({"source": batch["input_ids"].numpy().astype("int32"),
                             "target": decoder_input.astype("int32")}))
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_greedy_and_beam_search_start_each_sentence_from_its_target_language_as_generate(cc25):
    """Slow: two eager searches and eight of transformers' generate calls (3 CPU s). Two target languages in one
    batch, each sentence's the first token of its target prefix, the decoder's start (`start_from_prefix`): greedy
    and beam 4 (no length normalization) give generate's ids with decoder_start_token_id that language, sentence
    by sentence, the language not among the outputs."""
    _, _, reference, tokenizer, model, config, _, _ = cc25
    special = dict(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id, start_from_prefix=True)
    starts = [tokenizer.convert_tokens_to_ids(code) for code in LANGUAGES]
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)["input_ids"].astype("int32")  # (B, S)
    prefix = [[start] for start in starts]
    greedy, _ = kt.greedy_decode(model, batch, max_extra=MAX_EXTRA, target_prefix=prefix, **special)  # (B, T)
    beam, _ = kt.beam_search(model, batch, beam_size=4, alpha=0.0, max_extra=MAX_EXTRA, target_prefix=prefix,
                             **special)  # (B, 1, T)
    ended = 0
    for row, (ids, start) in enumerate(zip(tokenizer(SENTENCES)["input_ids"], starts)):
        expected = _generate(reference, ids, start, num_beams=1)
        assert until_eos(np.asarray(greedy)[row], config) == until_eos(expected, config), row
        ended += config.eos_id in expected
        expected = _generate(reference, ids, start, num_beams=4, length_penalty=0.0, early_stopping=False)
        assert until_eos(np.asarray(beam)[row, 0], config) == until_eos(expected, config), row
    assert ended  # some translation ended with eos before its limit
    assert len({tuple(until_eos(row, config)) for row in np.asarray(greedy)[:3]}) == 3


def test_a_decoder_start_token_naming_a_language_is_the_default_target_language(cc25, tmp_path):
    """A tuned cc25 checkpoint's config.json names its target language as decoder_start_token_id (mbart-large-en-ro:
    ro_RO): the import's target tokenizer has it as its language (outranking tokenizer_config.json's tgt_lang), and
    translating without a target language starts the decoder from it, as with target_lang that code (the slow
    exports test checks the workdir's default, tgt_lang's, in every engine)."""
    import shutil

    from keras_transformer.engines.tensorflow import Translator
    from keras_transformer.imports.checkpoint import read_checkpoint
    from keras_transformer.imports.mbart import MBartFamily
    folder, _, _, tokenizer, model, config, source, target = cc25
    assert target.language == TARGET  # the fixture's tokenizer_config.json: tgt_lang de_DE
    shutil.copytree(folder, tmp_path / "tuned")
    settings = json.loads((tmp_path / "tuned" / "config.json").read_text())
    settings["decoder_start_token_id"] = tokenizer.convert_tokens_to_ids(OTHER)
    (tmp_path / "tuned" / "config.json").write_text(json.dumps(settings))
    _, tuned = MBartFamily().tokenizers(read_checkpoint(tmp_path / "tuned"), config)
    assert tuned.language == OTHER
    translator = Translator(model, source, tuned, strategy="greedy", max_extra=MAX_EXTRA)
    assert translator.default_target_language == OTHER
    lines = SENTENCES[1:2]
    assert translator.translate_lines(lines) == translator.translate_lines(lines, target_lang=OTHER) != \
        translator.translate_lines(lines, target_lang=TARGET)


def test_an_unknown_target_language_is_refused_in_one_line_naming_the_languages(cc25, capsys):
    from keras_transformer.cli import main
    _, workdir, _, _, _, _, _, _ = cc25
    assert main(["translate", "--model", str(workdir), "--target-lang", "xx_YY", "A dog."]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # after the decoding line
    assert len(errors) == 1 and "Traceback" not in errors[0]
    assert "unknown target language 'xx_YY'" in errors[0] and "languages (25): ar_AR, cs_CZ" in errors[0]


def test_training_pairs_are_laid_out_as_mbart_and_the_loss_is_its_cross_entropy(cc25):
    """The data pipeline's batches of real pairs: sources `tokens </s> [src_lang]` (MBartTokenizer's ids),
    decoder inputs `[tgt_lang] tokens` (the decoder started from the target language, as the searches do) and
    labels `tokens </s>`, padded with pad; the training loss without label smoothing on them is transformers'
    cross-entropy of MBartForConditionalGeneration given the same ids."""
    from keras_transformer.data.pipeline import make_dataset_from_texts
    from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy
    _, _, reference, tokenizer, model, config, source, target = cc25
    sources, targets = lines_of("val.en.gz", 12), lines_of("val.de.gz", 12)
    dataset, tally = make_dataset_from_texts(sources, targets, source, target, tokens_per_batch=4096,
                                             max_length=64, num_replicas=1, seed=0)  # the model's 64 positions
    (inputs, labels), = list(dataset)  # one batch, its rows shuffled, the pairs over 64 positions left out
    inputs, labels = {k: v.numpy() for k, v in inputs.items()}, labels.numpy()
    assert inputs["source"].shape[0] == tally.kept >= 8 and (inputs["source"] == config.pad_id).any()
    row_of = {tuple(ids): row for row, ids in enumerate(tokenizer(sources)["input_ids"])}  # tokens </s> [en_XX]
    order = [row_of[tuple(int(i) for i in ids if i != config.pad_id)] for ids in inputs["source"]]
    language = tokenizer.convert_tokens_to_ids(TARGET)
    tokens = [tokenizer(text_target=targets[row])["input_ids"][:-2] for row in order]  # less </s> [de_DE]
    assert [[int(i) for i in ids if i != config.pad_id] for ids in inputs["target"]] == [[language] + t for t in tokens]
    assert [[int(i) for i in ids if i != config.pad_id] for ids in labels] == [t + [config.eos_id] for t in tokens]
    assert (inputs["target"] == config.pad_id).sum() == (labels == config.pad_id).sum() > 0  # aligned, padded alike
    ours = LabelSmoothedCrossEntropy(0.0, pad_id=config.pad_id)(labels, model(inputs))
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(inputs["source"].astype("int64")),
                             attention_mask=torch.tensor(inputs["source"] != config.pad_id).long(),
                             decoder_input_ids=torch.tensor(inputs["target"].astype("int64")),
                             labels=torch.tensor(np.where(labels == config.pad_id, -100, labels).astype("int64"))).loss
    np.testing.assert_allclose(float(ours), float(expected), atol=1e-4, rtol=0)
    # no target language to start the decoder from: refused by name, not trained wrong
    special = {key: getattr(target, key) for key in ("pad_id", "unk_id", "bos_id", "eos_id")}
    bare = type(target)(target._model, target.tokens, languages=target.languages, language_last=True, **special)
    with pytest.raises(ConfigError, match="target tokenizer is language_last .* without a default language"):
        make_dataset_from_texts(sources, targets, source, bare)


@pytest.mark.slow
def test_three_fine_tuning_updates_from_the_import_raise_the_likelihood_of_the_data(cc25, tmp_path):
    """Slow: trains (three updates). `train` with `model.from` the cc25 import and its checkpoint: the pairs laid
    out as cc25's, three updates raise log P(targets | sources) of the training pairs, scored as transformers'
    MBartForConditionalGeneration scores them with the decoder started from the target language."""
    from keras_transformer import training
    from keras_transformer.workdir.checkpoints import load_models
    _, workdir, _, tokenizer, _, config, _, _ = cc25
    pairs = [(s, t) for s, t in zip(lines_of("val.en.gz", 40), lines_of("val.de.gz", 40))
             if max(len(tokenizer(s)["input_ids"]), len(tokenizer(text_target=t)["input_ids"])) <= 48]
    sources, targets = [s for s, _ in pairs[:16]], [t for _, t in pairs[:16]]
    for name, lines in (("train.en", sources), ("train.de", targets)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    experiment = {
        "model": {"from": str(workdir), "dropout": 0.0},
        "data": {"kind": "text", "train_source": str(tmp_path / "train.en"), "train_target": str(tmp_path / "train.de"),
                 "tokens_per_batch": 4096, "max_length": 64},
        "training": {"label_smoothing": 0.0, "warmup_steps": 1, "learning_rate_scale": 0.5, "epochs": 1,
                     "steps_per_epoch": 3, "seed": 0, "jit_compile": False,
                     "init_checkpoint": str(workdir / "checkpoints" / "ckpt-0000.weights.h5")},
    }
    training.train(experiment, tmp_path / "tuned")
    assert len(sources) == 16
    batch = tokenizer(sources, text_target=targets, return_tensors="np", padding=True)
    language = tokenizer.convert_tokens_to_ids(TARGET)
    labels = batch["labels"]  # tokens </s> [de_DE], padded
    decoder = np.concatenate([np.full_like(labels[:, :1], language), labels[:, :-1]], 1)  # [de_DE] tokens ...
    labels = np.where(labels == language, config.pad_id, labels)  # tokens </s>
    inputs = {"source": batch["input_ids"].astype("int32"), "target": decoder.astype("int32")}

    def log_likelihood(folder):
        logits = np.asarray(load_models(folder).models[0](inputs), "float64")
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, labels[..., None].astype("int64"), -1)[..., 0]
        return float((picked * (labels != config.pad_id)).sum())
    assert log_likelihood(tmp_path / "tuned") > log_likelihood(workdir)


@pytest.mark.slow
def test_the_workdir_and_its_savedmodel_ctranslate2_and_litert_exports_translate_as_generate(cc25, tmp_path):
    """Slow: three exports. The workdir's greedy translations started from the target language (by its code and by
    the code users know) are transformers' generate detokenized; the SavedModel, CTranslate2 and LiteRT exports
    give them too, strings in and strings out, with one target language, two in one batch (each sentence's target
    prefix opening with its language) and none; and all score translations as transformers does."""
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, reference, tokenizer, _, _, _, _ = cc25
    translator = load_translator(workdir, strategy="greedy", max_extra=MAX_EXTRA)
    expected = {code: translator.translate_lines(SENTENCES, target_lang=code) for code in (TARGET, OTHER)}
    expected["plain"] = translator.translate_lines(SENTENCES)  # from tgt_lang, the default target language
    for code in (TARGET, OTHER):
        start = tokenizer.convert_tokens_to_ids(code)
        assert expected[code] == [tokenizer.decode(_generate(reference, ids, start, num_beams=1),
                                                   skip_special_tokens=True)
                                  for ids in tokenizer(SENTENCES)["input_ids"]], code
    assert expected["plain"] == expected[TARGET] != expected[OTHER]
    assert translator.translate_lines(SENTENCES, target_lang="fr") == expected[OTHER]
    expected["mixed"] = [expected[code][row] for row, code in enumerate(LANGUAGES)]
    assert translator.translate_lines(SENTENCES, target_prefix=LANGUAGES) == expected["mixed"]
    # scores: log P(tokens </s> | source) with the decoder started from the target language, as transformers'
    labels = tokenizer(text_target=expected[TARGET])["input_ids"]  # tokens </s> [de_DE]
    with torch.no_grad():
        reference_scores = []
        for ids, row in zip(tokenizer(SENTENCES)["input_ids"], labels):
            logits = reference(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([row[-1:] + row[:-2]]))
            log_probs = torch.log_softmax(logits.logits[0].double(), -1)
            reference_scores.append(float(log_probs[torch.arange(len(row) - 1), torch.tensor(row[:-1])].sum()))
    scores = translator.score_lines(SENTENCES, expected[TARGET])
    np.testing.assert_allclose(scores, reference_scores, atol=1e-3, rtol=0)
    for name in ("savedmodel", "ctranslate2", "litert"):
        options = {"jit_compile": False} if name == "savedmodel" else {}
        out = make_exporter(name, **options).export(workdir, tmp_path / name, strategy="greedy", max_extra=MAX_EXTRA)
        exported = load_translator(out)
        assert exported.translate_lines(SENTENCES) == expected["plain"], name
        for code in (TARGET, OTHER):
            assert exported.translate_lines(SENTENCES, target_lang=code) == expected[code], (name, code)
        assert exported.translate_lines(SENTENCES, target_lang="de") == expected[TARGET], name
        assert exported.translate_lines(SENTENCES, target_prefix=LANGUAGES) == expected["mixed"], name
        np.testing.assert_allclose(exported.score_lines(SENTENCES, expected[TARGET]), scores, atol=1e-3, rtol=0)
