"""Attention maps, schedule and positional-encoding pictures; restricted self-attention in a whole model."""

import os
import struct

import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import load_translator
from keras_transformer.attention import plotting
from keras_transformer.decoding import greedy_decode
from keras_transformer.engines.tensorflow import Translator
from keras_transformer.model import decode, encode

# Its module fixtures and traced translators are shared by its tests: `make test` (--dist loadgroup) runs the
# whole file on one worker, so they are built once.
pytestmark = pytest.mark.xdist_group("test_plotting")

SENTENCES = ["A man rides a bike.", "A dog runs in the snow.", "Two women sing on a stage.",
             "Ein Mann fährt Fahrrad.", "Ein Hund läuft im Schnee.", "Zwei Frauen singen auf einer Bühne."]
SOURCE = "A dog rides a bike."
TARGET = "Ein Hund fährt Fahrrad."


@pytest.fixture(scope="module")
def tokenizer():
    from keras_transformer.data.tokenizers import SubwordTokenizer

    return SubwordTokenizer.train(SENTENCES * 10, vocab_size=320)


@pytest.fixture(scope="module")
def model(tokenizer):
    import keras

    keras.utils.set_random_seed(0)
    return kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_length=64))


@pytest.fixture(scope="module")
def translator(model, tokenizer):
    return Translator(model, tokenizer)


@pytest.fixture(scope="module")
def maps(translator):
    return translator.attention(SOURCE, TARGET)


def png_size(path):
    """(width, height) from the PNG header, checking the signature on the way."""
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


def pieces(tokenizer, text):
    ids = tokenizer.tokenize([text])[0].numpy()
    return [p.decode("utf-8") for p in tokenizer.id_to_piece(ids).numpy()]


# ------------------------------------------------------------------ tokens and weights
def test_axis_tokens_are_the_subwords_of_source_and_translation(maps, tokenizer):
    assert maps.source_tokens == pieces(tokenizer, SOURCE) + ["</s>"]
    assert maps.target_inputs == ["<s>"] + pieces(tokenizer, TARGET)
    assert maps.target_outputs == pieces(tokenizer, TARGET) + ["</s>"]
    # The pieces spell the sentence again (SentencePiece marks word starts with U+2581).
    assert "".join(maps.source_tokens[:-1]).replace("\u2581", " ").strip() == SOURCE
    assert maps.translation == TARGET


def test_weights_have_one_row_per_query_and_decoder_self_attention_is_causal(maps):
    source_length, target_length = len(maps.source_tokens), len(maps.target_inputs)
    assert len(maps.encoder_self) == len(maps.decoder_self) == len(maps.cross) == 2
    for weights in maps.encoder_self:
        assert weights.shape == (4, source_length, source_length)
    for self_weights, cross_weights in zip(maps.decoder_self, maps.cross):
        assert self_weights.shape == (4, target_length, target_length)
        assert cross_weights.shape == (4, target_length, source_length)
        future = np.triu(np.ones((target_length, target_length), bool), k=1)
        assert np.all(self_weights[:, future] == 0.0)
    for weights in maps.encoder_self + maps.decoder_self + maps.cross:
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow  # a translation decoded and drawn (8 CPU s)
def test_decoded_translation_is_the_greedy_output(model, tokenizer):
    """The translation drawn is the one the translator serves: here a greedy one."""
    source_ids = np.append(tokenizer.tokenize([SOURCE])[0].numpy(), tokenizer.eos_id)[None]
    tokens, _ = greedy_decode(model, source_ids, max_extra=3)
    tokens = np.asarray(tokens)[0].tolist()
    expected = tokens[: tokens.index(3)] if 3 in tokens else tokens
    translator = Translator(model, tokenizer, strategy="greedy", max_extra=3)
    maps = translator.attention(SOURCE)
    assert maps.translation == translator(SOURCE)
    decoded = [p.decode("utf-8") for p in tokenizer.id_to_piece(np.array(expected, "int32")).numpy()]
    assert maps.target_outputs == decoded + ["</s>"]
    assert maps.cross[0].shape[1] == len(expected) + 1


def test_a_model_with_relative_positions_gives_its_attention_maps(tokenizer, tmp_path):
    """Relative positions (Shaw et al.) change the weights, not their layout: one row per query summing to 1, the
    decoder's self-attention causal, and the maps draw."""
    import keras

    keras.utils.set_random_seed(2)
    model = kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_length=64,
                                                       num_layers=1, position="relative", max_relative_position=2))
    maps = Translator(model, tokenizer).attention(SOURCE, TARGET)
    source_length, target_length = len(maps.source_tokens), len(maps.target_inputs)
    assert maps.encoder_self[0].shape == (4, source_length, source_length) and source_length > 5
    assert maps.cross[0].shape == (4, target_length, source_length)
    assert np.all(maps.decoder_self[0][:, np.triu(np.ones((target_length, target_length), bool), k=1)] == 0.0)
    for weights in maps.encoder_self + maps.decoder_self + maps.cross:
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert len(plotting.plot_attention_maps(maps, tmp_path, kinds=("encoder_self",), dpi=40)) == 1


# ------------------------------------------------------------------ figures and files
def test_figure_labels_and_pixels_are_the_tokens_and_weights(maps):
    weights, rows, columns = maps.axes("cross")
    figure = plotting.attention_figure(weights[1], rows, columns, title="cross, layer 2")
    heads = [axes for axes in figure.axes if axes.images and axes.get_title().startswith("head")]
    assert [axes.get_title() for axes in heads] == ["head 1", "head 2", "head 3", "head 4"]
    for head, axes in enumerate(heads):
        assert [label.get_text() for label in axes.get_xticklabels()] == maps.source_tokens
        assert [label.get_text() for label in axes.get_yticklabels()] == maps.target_outputs
        np.testing.assert_array_equal(np.asarray(axes.images[0].get_array()), weights[1][head])
    with pytest.raises(ValueError, match="do not match"):
        plotting.attention_figure(weights[0], rows[:-1], columns)
    # A longer sentence gets a larger figure, so cells stay readable.
    short = plotting.attention_figure(np.full((4, 5, 5), 0.2), ["x"] * 5, ["y"] * 5).get_size_inches()
    long = plotting.attention_figure(np.full((4, 30, 30), 1 / 30), ["x"] * 30, ["y"] * 30).get_size_inches()
    assert long[0] > short[0] and long[1] > short[1]


@pytest.mark.slow
def test_grid_layout_writes_one_png_per_kind_and_layer(maps, tmp_path):
    """Slow: renders six figures with matplotlib; the files are the behaviour checked."""
    paths = plotting.plot_attention_maps(maps, tmp_path, dpi=60)
    names = [os.path.basename(p) for p in paths]
    assert names == ["encoder_self_layer1.png", "encoder_self_layer2.png", "decoder_self_layer1.png",
                     "decoder_self_layer2.png", "cross_layer1.png", "cross_layer2.png"]
    for path in paths:
        width, height = png_size(path)
        # Four heads in a row of panels of at least 1.6 inches at 60 dpi; never absurdly large.
        assert 4 * 1.6 * 60 <= width <= 3000 and 100 <= height <= 1500
        assert os.path.getsize(path) > 5_000


def test_heads_layout_writes_one_png_per_layer_and_head(maps, tmp_path):
    paths = plotting.plot_attention_maps(maps, tmp_path, kinds=("cross",), layout="heads", dpi=60)
    assert sorted(os.path.basename(p) for p in paths) == sorted(
        f"cross_layer{layer}_head{head}.png" for layer in (1, 2) for head in (1, 2, 3, 4))
    for path in paths:
        width, height = png_size(path)
        assert 80 <= width <= 1500 and 80 <= height <= 1500
    with pytest.raises(ValueError, match="layout"):
        plotting.plot_attention_maps(maps, tmp_path, layout="mosaic")


@pytest.mark.slow  # a workdir written, loaded and drawn (4 CPU s)
def test_plot_attention_for_a_training_workdir(model, tokenizer, tmp_path):
    """`plot-attention` on a training workdir loads its weights as written and draws one map per layer of the
    kinds asked, with the translation beside them; a folder without model.yaml is not a model."""
    from factories import make_workdir

    workdir = tmp_path / "run"
    make_workdir(workdir, kt.TransformerConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_length=64),
                 models=[model], tokenizers=(tokenizer, tokenizer))

    loaded = load_translator(workdir).model
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The command runs plot_attention_for_path on the workdir.
    from keras_transformer import cli
    assert cli.main(["plot-attention", "--model", str(workdir), SOURCE, "--out", str(tmp_path / "out"),
                     "--translation", TARGET, "--kinds", "cross"]) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["cross_layer1.png", "cross_layer2.png", "translation.txt"]
    assert "Ein Hund" in (tmp_path / "out" / "translation.txt").read_text(encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="model.yaml"):
        load_translator(tmp_path / "out")


def test_bytes_that_are_not_utf8_are_drawn_as_replacement_characters(translator, tmp_path):
    """As `translate` does: Python hands an argument's undecodable byte over as a lone surrogate (here \\xff),
    which TensorFlow refused to convert."""
    from_argument = translator.attention("A dog \udcff rides.", TARGET)
    replaced = translator.attention("A dog \ufffd rides.", TARGET)
    assert from_argument.source_tokens == replaced.source_tokens
    np.testing.assert_array_equal(from_argument.cross[0], replaced.cross[0])
    as_bytes = translator.attention(b"A dog \xff rides.", TARGET)
    assert as_bytes.source_tokens == replaced.source_tokens
    plotting.plot_attention(translator, "A dog \udcff rides.", tmp_path, translation=TARGET, kinds=("cross",))
    assert "source:       A dog \ufffd rides." in (tmp_path / "translation.txt").read_text(encoding="utf-8")


def test_an_exported_model_refuses_checkpoint_and_average(tmp_path, capsys):
    """Its weights are fixed: `translate` refused these options, plot-attention ignored them."""
    from keras_transformer import cli
    from keras_transformer.errors import ConfigError
    exported = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "saved_models", "multi30k_en_de")
    for options in ({"average": 5}, {"checkpoint": "x.weights.h5"}):
        with pytest.raises(ConfigError, match="is an exported model: --checkpoint and --average apply to "
                                                       "training workdirs"):
            load_translator(exported, **options)
    assert cli.main(["plot-attention", "--model", exported, "--average", "2", "A dog.", "--out",
                     str(tmp_path / "out")]) == 2
    assert "is an exported model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_schedule_and_position_encoding_plots(tmp_path):
    schedule = plotting.plot_learning_rate_schedule(tmp_path / "lr.png", steps=2000)
    position = plotting.plot_position_encoding(tmp_path / "pe.png", length=50, d_model=64)
    for path in (schedule, position):
        width, height = png_size(path)
        assert 600 <= width <= 1200 and 300 <= height <= 800
        assert os.path.getsize(path) > 10_000


# ------------------------------------------------------------------ restricted self-attention, model level
@pytest.mark.slow  # attention maps of a model built and run (5 CPU s)
def test_model_with_attention_window_is_local_in_the_encoder_and_causal_in_the_decoder():
    """With an attention window of r, each encoder position attends to at most r positions on either side and the
    decoder's self-attention is causal within its window, as the drawn maps show."""
    import keras

    keras.utils.set_random_seed(1)
    r = 2
    config = kt.TransformerConfig.preset("tiny", vocab_size=40, attention_window=r)
    model = kt.build_model(config)
    rng = np.random.default_rng(0)
    source = rng.integers(4, 40, size=(1, 12)).astype("int32")
    source[0, -2:] = 0  # two padded positions: zero weight even inside the window
    target = rng.integers(4, 40, size=(1, 9)).astype("int32")

    memory, source_padding, encoder_weights = encode(model, source, return_attention_scores=True)
    distance = np.abs(np.arange(12)[:, None] - np.arange(12)[None])
    for weights in encoder_weights:  # (1, H, S, S)
        weights = np.asarray(weights)[0]
        assert np.all(weights[:, distance > r] == 0.0)
        assert np.all(weights[:, :, 10:] == 0.0)
        assert np.all(weights[:, :10, :10][:, distance[:10, :10] <= r] > 0.0)

    # Behaviour: with N layers of window r, a source token reaches only outputs within N * r positions.
    changed = source.copy()
    changed[0, 0] = 4 if source[0, 0] != 4 else 5
    other, _ = encode(model, changed)
    moved = np.abs(np.asarray(other) - np.asarray(memory)).max(-1)[0]  # (S,)
    reach = config.encoder_layers * r
    assert np.all(moved[reach + 1:10] == 0.0) and np.all(moved[: reach + 1] > 0.0)

    logits, decoder_weights = decode(model, target, memory, source_padding, return_attention_scores=True)
    steps = np.arange(9)[:, None] - np.arange(9)[None]  # i - j
    for layer in decoder_weights:
        weights = np.asarray(layer["self"])[0]  # (H, T, T)
        assert np.all(weights[:, steps < 0] == 0.0)  # causal
        assert np.all(weights[:, steps > r] == 0.0)  # windowed
        assert np.all(weights[:, (steps >= 0) & (steps <= r)] > 0.0)
    # Causal: a later target token never changes an earlier output.
    later = target.copy()
    later[0, 6] = 4 if target[0, 6] != 4 else 5
    np.testing.assert_array_equal(np.asarray(decode(model, later, memory, source_padding))[:, :6],
                                  np.asarray(logits)[:, :6])
    # The cached step-by-step decoder applies the same window.
    cached, _ = greedy_decode(model, source, max_extra=4, use_cache=True)
    full, _ = greedy_decode(model, source, max_extra=4, use_cache=False)
    np.testing.assert_array_equal(np.asarray(cached), np.asarray(full))
