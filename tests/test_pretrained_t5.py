"""keras-transformer import of T5 / mT5 / MADLAD-400 checkpoints (model_type t5): small random
T5ForConditionalGeneration models (transformers' own classes, the reference), imported and checked against it:
token ids, logits, greedy and beam search; the SavedModel export; faults.

Two shapes, built once for the file: "madlad" (T5 v1.1 / mT5 / MADLAD-400: gated GELU, an untied softmax, two
encoder layers and one decoder layer, d_kv * heads != d_model, MADLAD's `<2xx>` target-language tokens in the
SentencePiece model) and "t5" (the original T5: ReLU, the softmax tied to the shared embedding with the decoder
output rescaled, one encoder layer and two decoder layers, four heads). The SentencePiece models are trained here
on Multi30k lines.
"""

import json
import os
import shutil

import numpy as np
import pytest
from factories import import_references, lines_of, load_imported, until_eos

import keras_transformer as kt
from keras_transformer.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("test_pretrained_t5")

SHAPES = {
    "madlad": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_layers=2, num_decoder_layers=1,
                   num_heads=2, d_kv=6),
    "t5": dict(feed_forward_proj="relu", tie_word_embeddings=True, num_layers=1, num_decoder_layers=2, num_heads=4,
               d_kv=4),
}
LANGUAGES = ["<2de>", "<2fr>", "<2en>"]
SENTENCES = ["<2de> A man rides a bike.", "<2fr> Two dogs play in the snow near a house.", "A girl.",
             "<2en> Zwei Männer sitzen auf einer Bank!"]
MAX_EXTRA = 6
EXTRA_IDS = 5


def _generate(reference, ids, **options):
    """transformers' generate, without the decoder's start token (its caches grown layer by layer: the one it
    sizes from the config has num_layers layers, fewer than a deeper decoder's)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    with torch.no_grad():
        output = reference.generate(torch.tensor([ids]), max_new_tokens=len(ids) + MAX_EXTRA, do_sample=False,
                                    past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()), **options)
    return output[0].tolist()[1:]


def build_reference(folder, seed=0, **shape):
    """A random T5ForConditionalGeneration with its tokenizer's files as save_pretrained saves them, and
    spiece.model beside them (as the Hub folders hold it)."""
    import sentencepiece
    folder.mkdir(parents=True)
    with open(folder / "spiece.model", "wb") as handle:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines_of("train.en.gz", 300) + lines_of("train.de.gz", 300)), model_writer=handle,
            vocab_size=200, model_type="unigram", character_coverage=1.0, minloglevel=2, num_threads=1,
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, user_defined_symbols=LANGUAGES)
    tokenizer = transformers.T5Tokenizer.from_pretrained(str(folder), extra_ids=EXTRA_IDS)
    config = transformers.T5Config(
        vocab_size=len(tokenizer) + 3, d_model=16, d_ff=24, dropout_rate=0.0, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, **shape)
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(config).eval()
    tied = shape["tie_word_embeddings"]
    if not tied:  # a softmax of its own (transformers 5 ties it to the shared matrix when it builds a model)
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0, 1.0 if "relative_attention_bias" in name else 0.3)
            if "layer_norm" in name:
                parameter.add_(1.0)
    model.generation_config.bad_words_ids = [[config.pad_token_id]]  # the package never produces pad
    # eos's output row moved towards the decoder's mean output until some greedy translation ends before its limit
    # (a random model's translations otherwise all run to it): the finished hypotheses are compared too.
    sources = tokenizer(SENTENCES)["input_ids"]
    head = model.shared.weight if tied else model.lm_head.weight
    row = head[1].detach().clone()
    with torch.no_grad():
        batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
        hidden = model(**batch, decoder_input_ids=torch.zeros((len(SENTENCES), 4), dtype=torch.long),
                       output_hidden_states=True, use_cache=False).decoder_hidden_states[-1].mean((0, 1))
    for step in np.arange(0.0, 16.0, 0.5):
        with torch.no_grad():
            head[1].copy_(row + float(step) * hidden / hidden.norm())
        if any(1 in _generate(model, ids) for ids in sources):
            break
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if not tied:  # as T5 v1.1, mT5 and MADLAD-400 are published: lm_head.weight in the file, tie_word_embeddings false
        from safetensors.numpy import load_file, save_file
        tensors = load_file(folder / "model.safetensors")
        tensors["lm_head.weight"] = model.lm_head.weight.detach().numpy()
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        settings = json.loads((folder / "config.json").read_text())
        settings.pop("scale_decoder_outputs", None)
        (folder / "config.json").write_text(json.dumps({**settings, "tie_word_embeddings": False}, indent=2))
    return folder


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """name -> (checkpoint folder, imported workdir, the transformers model, its tokenizer)."""
    root = tmp_path_factory.mktemp("pretrained_t5")
    return import_references(root, SHAPES, build_reference, transformers.T5ForConditionalGeneration)


@pytest.mark.parametrize("name", SHAPES)
def test_token_ids_equal_t5_tokenizers(references, name):
    """SentencePiece's ids as they are and </s> last, as T5Tokenizer gives them, a leading `<2xx>` as one token;
    the added tokens (`<2xx>`, </s>, the sentinels) cut out of the text wherever they stand, glued to a word too,
    and the text around them segmented as sentences of their own, in the tokenizer's graph and in the
    CTranslate2 / LiteRT engines' Python (`mapped_pieces`); decoding drops pad, </s> and the sentinels as
    `batch_decode(skip_special_tokens=True)` does."""
    import sentencepiece
    import tensorflow as tf

    from keras_transformer.engines.subwords import mapped_pieces
    _, workdir, _, reference = references[name]
    _, config, source, target = load_imported(workdir)
    assert source.languages == tuple(LANGUAGES) and not target.languages
    glued = ["<2de>A man", "<2de>Hello", "A man</s>rides </s> on", "A<extra_id_0>man <extra_id_4>", "</s>",
             "<2de><2fr>A", "A <2de>dog<2fr>", "  <2de>  A", ">>de<< A", "<2xx> A", "<pad>A<unk>"]
    lines = lines_of("val.en.gz", 40) + lines_of("val.de.gz", 20) + SENTENCES + ["", "  spaces", "<2de>   A dog."]
    expected = reference(lines + glued)["input_ids"]
    assert [ids + [config.eos_id] for ids in source.tokenize(lines + glued).to_list()] == expected
    processor = sentencepiece.SentencePieceProcessor(
        model_file=str(workdir / "data" / "vocab" / "source" / "sentencepiece.model"))
    assert [[source.tokens.index(piece) for piece in mapped_pieces(processor, line, source.tokens, "<unk>",
                                                                   source.languages, None, source.split_tokens)]
            + [config.eos_id] for line in glued] == expected[len(lines):]
    targets = lines_of("val.de.gz", 20) + ["A girl.", "Ein Mann</s>x", "<extra_id_1>Hund", ">>de<< A"]
    assert [ids + [config.eos_id] for ids in target.tokenize(targets).to_list()] == \
        reference(text_target=targets)["input_ids"]
    sentinel = reference.convert_tokens_to_ids("<extra_id_0>")
    assert sentinel == len(reference) - 1
    rows = [[config.bos_id] + ids + [sentinel, config.eos_id, config.pad_id]
            for ids in reference(lines_of("val.de.gz", 20), add_special_tokens=False)["input_ids"]]
    assert [text.decode() for text in target.detokenize(tf.ragged.constant(rows)).numpy()] == \
        reference.batch_decode(rows, skip_special_tokens=True)


def test_a_folder_with_spiece_model_alone_splits_the_same_tokens(references, tmp_path):
    """Without tokenizer.json the added tokens are spiece.model's special and user-defined pieces and the
    sentinels, as T5Tokenizer builds them from spiece.model alone."""
    from keras_transformer.imports.checkpoint import read_checkpoint
    from keras_transformer.imports.t5 import T5Family
    folder, workdir, _, _ = references["madlad"]
    shutil.copytree(folder, tmp_path / "checkpoint", ignore=shutil.ignore_patterns("tokenizer.json"))
    reference = transformers.T5Tokenizer.from_pretrained(str(tmp_path / "checkpoint"))
    _, config, _, _ = load_imported(workdir)
    source, _ = T5Family().tokenizers(read_checkpoint(tmp_path / "checkpoint"), config)
    lines = ["<2de>A man", "A man</s>rides", "A<extra_id_0>man <extra_id_4>", "<pad>A<unk>", "<2fr> Two dogs."]
    assert [ids + [config.eos_id] for ids in source.tokenize(lines).to_list()] == reference(lines)["input_ids"]


@pytest.mark.parametrize("name", SHAPES)
def test_logits_equal_the_reference_on_a_padded_batch(references, name):
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    assert (config.bos_id, config.pad_id, config.eos_id) == (0, 0, 1)
    assert config.tie_embeddings == ("all" if name == "t5" else "embeddings")
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # padded rows
    rng = np.random.default_rng(0)
    decoder_input = np.zeros((len(SENTENCES), 25), "int64")  # starts from pad, as T5's decoder; longer than the
    decoder_input[:, 1:] = rng.integers(3, config.vocab_size, size=(len(SENTENCES), 24))  # exact buckets
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             decoder_input_ids=torch.tensor(decoder_input)).logits.numpy()
    ours = np.asarray(model({"source": batch["input_ids"].numpy().astype("int32"),
                             "target": decoder_input.astype("int32")}))
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)


def test_the_buckets_are_t5s():
    """`relative_position_bucket` is transformers' `T5Attention._relative_position_bucket` for every distance,
    both directions, beyond the maximum distance too."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from keras_transformer.layers.position import relative_position_bucket
    distances = np.arange(-300, 301)
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20), (6, 7)):
            expected = T5Attention._relative_position_bucket(torch.tensor(distances), bidirectional, buckets,
                                                             distance).numpy()
            ours = np.asarray(relative_position_bucket(distances, bidirectional, buckets, distance))
            np.testing.assert_array_equal(ours, expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHAPES)
def test_greedy_and_beam_search_equal_generate(references, name):
    """Our searches (cached, a step at a time: the relative position bias of each step against the cached keys)
    and transformers' generate: the same ids, sentence by sentence, from a padded batch."""
    _, workdir, reference, tokenizer = references[name]
    model, config, _, _ = load_imported(workdir)
    special = dict(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)["input_ids"].astype("int32")  # (B, S), padded
    greedy, _ = kt.greedy_decode(model, batch, max_extra=MAX_EXTRA, **special)  # (B, T)
    beam, _ = kt.beam_search(model, batch, beam_size=4, alpha=0.0, max_extra=MAX_EXTRA, **special)  # (B, 1, T)
    ended = 0
    for row, ids in enumerate(tokenizer(SENTENCES)["input_ids"]):
        expected = _generate(reference, ids, num_beams=1)
        assert until_eos(np.asarray(greedy)[row], config) == until_eos(expected, config)
        ended += config.eos_id in expected
        expected = _generate(reference, ids, num_beams=4, length_penalty=0.0, early_stopping=False)
        assert until_eos(np.asarray(beam)[row, 0], config) == until_eos(expected, config)
    assert ended  # some translation ended with eos before its limit


def test_the_workdir_records_the_family_and_the_options(references):
    _, workdir, _, _ = references["madlad"]
    record = json.loads((workdir / "imported.json").read_text())
    assert record["family"] == "t5" and "spiece.model" in record["files"]
    from keras_transformer.workdir.checkpoints import read_model_file
    config, options = read_model_file(workdir / "model.yaml")
    assert (options.strategy, options.beam_size) == ("beam", 4)
    assert (config.position, config.normalization, config.gated_feed_forward, config.use_bias) == \
        ("relative_bias", "rms", True, False)
    assert (config.key_dim, config.activation, config.scale_decoder_output) == (6, "gelu_tanh", False)
    assert kt.TransformerConfig.from_yaml(workdir / "model.yaml") == config


@pytest.mark.parametrize("fault, named", [
    ("per_layer_bias", "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight: a relative attention "
                       "bias per layer"),
    ("projection", "feed_forward_proj 'gated-tanhshrink': the activation 'tanhshrink' is not one"),
])
def test_a_t5_variant_the_model_cannot_hold_is_refused_by_name_and_nothing_is_written(references, tmp_path, capsys,
                                                                                      fault, named):
    from safetensors.numpy import load_file, save_file
    folder = tmp_path / "checkpoint"
    shutil.copytree(references["madlad"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    if fault == "per_layer_bias":  # UMT5's layout under T5's name
        tensors = load_file(folder / "model.safetensors")
        tensors["encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"] = \
            tensors["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    else:
        config["feed_forward_proj"] = "gated-tanhshrink"
    (folder / "config.json").write_text(json.dumps(config))
    workdir = tmp_path / "workdir"
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        kt.import_checkpoint(folder, workdir)
    assert not workdir.exists() and sorted(os.listdir(tmp_path)) == ["checkpoint"]
    from keras_transformer.cli import main
    assert main(["import", str(folder), "--workdir", str(workdir)]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and lines[0].startswith("keras-transformer import: error:")
    assert not workdir.exists()


@pytest.mark.slow
def test_the_savedmodel_export_translates_as_the_workdir(references, tmp_path):
    """The SavedModel export of an imported MADLAD-shape workdir gives the workdir's translations, greedy, strings
    in and strings out, with a `<2xx>` token opening the source, given in the text or as `target_lang` (the
    search's cached steps inside the graph add the relative position biases of each step); the workdir's is
    transformers' generate, detokenized as T5Tokenizer does."""
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, reference, tokenizer = references["madlad"]
    translator = load_translator(workdir, strategy="greedy")
    expected = translator.translate_lines(SENTENCES)
    assert len(set(expected)) > 1
    ids = _generate(reference, tokenizer(SENTENCES[0])["input_ids"])
    assert expected[0] == tokenizer.decode(ids, skip_special_tokens=True)
    # --target-lang de: `<2de>` opens the source (MADLAD's target language is the source's first token)
    tagged = [(line.split()[0][2:-1], line.split(" ", 1)[1], translation)
              for line, translation in zip(SENTENCES, expected) if line.startswith("<2")]  # (de, "A man...", ...)
    by_code = [translator.translate_lines([text, ""], target_lang=code) for code, text, _ in tagged]
    assert by_code == [[translation, ""] for _, _, translation in tagged]
    untagged = translator.translate_lines([text for _, text, _ in tagged])
    assert untagged != [translation for _, _, translation in tagged]
    assert translator.target_prefixes(2, target_lang="de") is None and translator.target_languages == ()
    with pytest.raises(ConfigError, match=r"unknown target language 'es'; this model's target languages \(3\): "
                                          r"<2de>, <2en>, <2fr>"):
        translator.translate_lines(["A dog."], target_lang="es")
    with pytest.raises(ConfigError, match="source language 'en': this model's language tokens name the target "
                                          "language"):  # <2en> means "into English"
        translator.with_source_lang(["A dog."], "en")
    out = make_exporter("savedmodel", jit_compile=False).export(workdir, tmp_path / "savedmodel", strategy="greedy")
    exported = load_translator(out)
    assert exported.translate_lines(SENTENCES) == expected
    glued = ["<2de>A man rides a bike.", "Two dogs</s>play."]  # the graph cuts out the added tokens as T5Tokenizer
    assert translator.translate_lines(glued) == exported.translate_lines(glued)
    assert translator.translate_lines(glued[:1]) == expected[:1]
    assert [exported.translate_lines([text, ""], target_lang=code) for code, text, _ in tagged] == by_code


@pytest.mark.slow
def test_the_server_translates_with_a_per_request_target_lang_as_the_translator(references):
    """`/translate` on a served MADLAD-shape import: each request's `target_lang` (a code or the token itself)
    opens the source with its `<2xx>` token, giving the Python translator's translations; an unknown language and
    a source language (MADLAD's tokens name the target) are that request's 400, naming them. Slow: a server
    (uvicorn, on a thread of this process) loads and warms up the model."""
    from test_serve_parts import serving

    from keras_transformer.engines.loader import load_translator
    from keras_transformer.serving import ServeSettings, build_app
    _, workdir, _, _ = references["madlad"]
    lines = ["Zwei Männer sitzen auf einer Bank!", "A man rides a bike."]  # (a random model: the second is "")
    translator = load_translator(workdir, strategy="greedy")
    expected = {code: translator.translate_lines(lines, target_lang=code) for code in ("de", "fr")}
    expected[None] = translator.translate_lines(lines)
    assert len({tuple(value) for value in expected.values()}) == 3
    app = build_app(lambda: load_translator(workdir, strategy="greedy"), "madlad", ServeSettings(max_batch=4))
    with serving(app) as call:
        for given, code in (("de", "de"), ("fr", "fr"), ("<2fr>", "fr"), (None, None)):
            body = {"sentences": lines, **({} if given is None else {"target_lang": given})}
            status, answer = call("/translate", body)
            assert status == 200 and json.loads(answer)["translations"] == expected[code], given
        status, answer = call("/translate", {"sentences": lines, "target_lang": "es"})
        assert status == 400 and "unknown target language 'es'" in json.loads(answer)["error"]
        status, answer = call("/translate", {"sentences": lines, "source_lang": "en"})
        assert status == 400 and "source language 'en'" in json.loads(answer)["error"]


@pytest.mark.slow
def test_three_fine_tuning_updates_from_an_import_raise_the_likelihood_and_keep_its_defaults_and_record(references,
                                                                                                     tmp_path):
    """train with `model.from` a MADLAD-shape import and training.init_checkpoint (sources opening with `<2de>`,
    the decoder starting from pad): the import's vocabulary is taken as it is, three updates raise
    log P(targets | sources) of the training pairs, the tuned run keeps the import's architecture, decoding
    defaults (beam 4 from its generation config) and import record, and its CTranslate2 export names the source.
    Slow: it trains."""
    from keras_transformer import training
    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    from keras_transformer.workdir.checkpoints import load_models, read_model_file
    _, workdir, _, _ = references["madlad"]
    sources, targets = ["<2de> " + line for line in lines_of("val.en.gz", 48)], lines_of("val.de.gz", 48)
    for name, lines in (("train.en", sources), ("train.de", targets)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    experiment = {
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
    (config, options), (imported, imported_options) = (read_model_file(w / "model.yaml") for w in (tuned, workdir))
    assert config == imported.replace(dropout=0.0) and options == imported_options
    assert (options.strategy, options.beam_size) == ("beam", 4)
    source_tokenizer, target_tokenizer = load_tokenizers(tuned / "data" / "vocab")

    def padded(rows):  # tokens then eos, padded
        rows = [row[:30] + [config.eos_id] for row in rows]
        width = max(len(row) for row in rows)
        return np.array([row + [config.pad_id] * (width - len(row)) for row in rows], "int32")

    source_ids = padded(source_tokenizer.tokenize(sources).to_list())
    assert set(source_ids[:, 0]) == {source_tokenizer.tokens.index("<2de>")}
    target_ids = padded(target_tokenizer.tokenize(targets).to_list())
    before, after = (np.mean(np.asarray(kt.score(load_models(w).models[0], source_ids, target_ids,
                                                 pad_id=config.pad_id, bos_id=config.bos_id)))
                     for w in (workdir, tuned))
    assert after > before
    record = json.loads((tuned / "imported.json").read_text())
    assert record["source"] == json.loads((workdir / "imported.json").read_text())["source"]
    assert record["family"] == "t5" and record["fine_tuned"]["weights"]
    out = make_exporter("ctranslate2").export(tuned, tmp_path / "export", strategy="greedy", max_extra=MAX_EXTRA)
    assert json.loads(open(os.path.join(out, "manifest.json")).read())["provenance"]["source"] == record["source"]
    lines = [sentence.split("> ", 1)[-1] for sentence in SENTENCES]
    translator, exported = load_translator(tuned, strategy="greedy", max_extra=MAX_EXTRA), load_translator(out)
    expected = translator.translate_lines(lines, target_lang="de")
    assert exported.translate_lines(lines, target_lang="de") == expected
    # three updates may teach a model this small to end at once: the export also scores real pairs as the workdir
    scores = exported.score_lines(sources[:4], targets[:4])
    np.testing.assert_allclose(scores, translator.score_lines(sources[:4], targets[:4]), atol=1e-3, rtol=0)
    assert len(set(np.round(scores, 3))) == 4


@pytest.mark.slow
@pytest.mark.parametrize("name, options", [("madlad", {"strategy": "beam", "beam_size": 4, "alpha": 0.0}),
                                           ("t5", {"strategy": "greedy"})])
def test_the_ctranslate2_export_translates_as_the_workdir(references, name, options, tmp_path):
    """The CTranslate2 export (its own T5 layers: RMS norm, gated FFN, relative attention bias, the decoder's
    rescaling) gives the workdir's translations, tokens and log-probabilities (beam 4 for one shape, greedy for the
    other) and, for MADLAD, takes `target_lang` as the source's `<2xx>` token."""
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, _, _ = references[name]
    out = make_exporter("ctranslate2").export(workdir, tmp_path / "ct2")
    ours, theirs = load_translator(workdir, **options), load_translator(out, **options)
    expected = ours.translate_detailed(SENTENCES)
    assert len({(d.tokens, round(d.mean_log_prob, 3)) for d in expected}) > 1  # (a random model: texts may be "")
    assert [(d.text, d.tokens, round(d.mean_log_prob, 3)) for d in theirs.translate_detailed(SENTENCES)] == \
        [(d.text, d.tokens, round(d.mean_log_prob, 3)) for d in expected]
    if name == "madlad":
        german = theirs.translate_detailed(["A man rides a bike."], target_lang="de")[0]
        assert (german.text, german.tokens, round(german.mean_log_prob, 3)) == \
            (expected[0].text, expected[0].tokens, round(expected[0].mean_log_prob, 3))
        glued = theirs.translate_detailed(["<2de>A man rides a bike."])[0]  # the added token glued to the text
        assert (glued.text, glued.tokens) == (expected[0].text, expected[0].tokens)

@pytest.mark.slow
def test_the_litert_export_translates_as_the_workdir(references, tmp_path):
    """A LiteRT export of the MADLAD-shaped import (RMS norm, gated FFN, the relative attention bias inside the
    converted search loop, its own softmax) gives the workdir's beam hypotheses and scores, with `target_lang` as
    the source's `<2xx>` token and without. Slow: it converts a model."""
    pytest.importorskip("ai_edge_litert")
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter
    _, workdir, _, _ = references["madlad"]
    lines = [sentence.split("> ", 1)[-1] for sentence in SENTENCES]
    ours = load_translator(workdir, strategy="beam", jit_compile=False)
    theirs = load_translator(make_exporter("litert").export(workdir, tmp_path / "litert", strategy="beam"))
    for forced in ({}, {"target_lang": "de"}):
        expected, found = ours.n_best_detailed(lines, **forced), theirs.n_best_detailed(lines, **forced)
        assert len({round(row[0].score, 3) for row in expected}) > 1  # (a random model: texts may be "")
        assert [[(h.text, h.tokens) for h in row] for row in found] == \
            [[(h.text, h.tokens) for h in row] for row in expected]
        np.testing.assert_allclose([[h.score for h in row] for row in found],
                                   [[h.score for h in row] for row in expected], atol=1e-4)


@pytest.mark.parametrize("written, tie, scale", [
    ({"tie_word_embeddings": False}, "embeddings", False),  # T5 v1.1, mT5, MADLAD-400 as published
    ({"tie_word_embeddings": True, "scale_decoder_outputs": False}, "embeddings", False),  # transformers 5's
    ({"tie_word_embeddings": True}, "embeddings", True),  # a file of its own lm_head under the original T5's config
])
def test_the_softmax_and_its_rescaling_follow_the_file_and_either_transformers_configs(references, tmp_path, written,
                                                                                       tie, scale):
    """transformers 5 writes tie_word_embeddings true for every T5 (scale_decoder_outputs says whether the decoder's
    output is rescaled); before it, tie_word_embeddings false meant an own softmax and no rescaling. A file with an
    lm_head.weight other than the shared matrix has a softmax of its own either way."""
    from keras_transformer.imports.checkpoint import read_checkpoint
    from keras_transformer.imports.family import WeightSource
    from keras_transformer.imports.t5 import T5Family
    folder = tmp_path / "checkpoint"
    shutil.copytree(references["madlad"][0], folder)
    settings = json.loads((folder / "config.json").read_text())
    settings = {key: value for key, value in settings.items() if key not in ("tie_word_embeddings",
                                                                             "scale_decoder_outputs")}
    (folder / "config.json").write_text(json.dumps({**settings, **written}))
    checkpoint = read_checkpoint(folder)
    config = T5Family().config(checkpoint, WeightSource(checkpoint.tensors(), checkpoint.weights_file))
    assert (config.tie_embeddings, config.scale_decoder_output) == (tie, scale)
