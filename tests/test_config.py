"""TransformerConfig: presets, defaults, validation messages, YAML round trips."""

import pytest

from keras_transformer import TransformerConfig
from keras_transformer.config import PRESETS


def test_issue_example_works_with_defaults():
    config = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1)
    assert config.head_dim == 64
    assert config.encoder_layers == config.decoder_layers == 3
    assert config.tie_embeddings == "all" and config.position == "sinusoidal" and not config.norm_first


@pytest.mark.parametrize("name, layers, d_model, d_ff, heads, dropout", [
    ("base", 6, 512, 2048, 8, 0.1), ("big", 6, 1024, 4096, 16, 0.3)])
def test_paper_presets(name, layers, d_model, d_ff, heads, dropout):
    config = TransformerConfig.preset(name, vocab_size=37000)
    assert (config.num_layers, config.d_model, config.d_ff, config.num_heads, config.dropout) == (
        layers, d_model, d_ff, heads, dropout)
    assert config.label_smoothing == 0.1 and config.warmup_steps == 4000
    assert (config.beta_1, config.beta_2, config.epsilon) == (0.9, 0.98, 1e-9)


def test_all_presets_build_and_overrides_apply():
    for name in PRESETS:
        assert TransformerConfig.preset(name, vocab_size=100, dropout=0.2).dropout == 0.2


def test_separate_vocab_and_layer_overrides():
    config = TransformerConfig(vocab_size=100, source_vocab_size=120, target_vocab_size=90, tie_embeddings="decoder",
                               num_layers=2, num_encoder_layers=4, d_model=64, num_heads=4)
    assert (config.src_vocab_size, config.tgt_vocab_size) == (120, 90)
    assert (config.encoder_layers, config.decoder_layers) == (4, 2)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(d_model=100, num_heads=3), "not divisible by num_heads"),
    (dict(d_model=0), "d_model must be a positive integer"),
    (dict(num_layers=-1), "num_layers must be a positive integer"),
    (dict(dropout=1.0), "dropout must be in [0, 1)"),
    (dict(attention_dropout=-0.1), "attention_dropout must be in [0, 1)"),
    (dict(position="rotary"), "position must be one of"),
    (dict(position="relative", max_relative_position=0), "max_relative_position must be a positive integer, got 0"),
    (dict(max_relative_position=2.5), "max_relative_position must be a positive integer, got 2.5"),
    (dict(tie_embeddings="encoder"), "tie_embeddings must be one of"),
    (dict(source_vocab_size=10, target_vocab_size=20), "source_vocab_size=10 != target_vocab_size=20"),
    (dict(pad_id=5, unk_id=5), "special ids must differ"),
    (dict(learning_rate_scale="fast"), "learning_rate_scale must be a number, got 'fast'"),
    (dict(beta_2=None), "beta_2 must be a number, got None"),
])
def test_validation_names_the_problem(overrides, fragment):
    values = dict(vocab_size=100, d_model=64, num_heads=4)
    values.update(overrides)
    with pytest.raises(ValueError) as error:
        TransformerConfig(**values)
    assert fragment in str(error.value)


@pytest.mark.parametrize("values, fragment", [
    (dict(alpha=float("nan")), "decoding.alpha (the length-penalty exponent) must be a finite number >= 0"),
    (dict(length_penalty=-0.1), "got -0.1"),  # the old name, read as alpha
    (dict(early_exit=1), "decoding.early_exit must be true or false, got 1"),
    (dict(strategy="nucleus"), "decoding.strategy must be one of beam, greedy, sample"),
    (dict(beam_size=2, n_best=3), "decoding.n_best=3 is more than decoding.beam_size=2"),
    (dict(top_p=0.9), "decoding.top_p applies to strategy 'sample' only"),
    (dict(strategy="sample", top_p=0.0), "decoding.top_p must be in (0, 1]"),
    (dict(strategy="sample", temperature=0), "decoding.temperature must be a finite number > 0"),
    (dict(strategy="sample", seed=2**31), "decoding.seed must be at most"),
    (dict(length_penalty=1.0, alpha=1.0), "length_penalty is the old name of alpha"),
    (dict(beam=4), "Unknown decoding field(s): beam"),
])
def test_decode_options_name_the_problem(values, fragment):
    from keras_transformer.decoding import DecodeOptions
    from keras_transformer.errors import ConfigError
    with pytest.raises(ConfigError) as error:
        DecodeOptions.from_dict(values)
    assert fragment in str(error.value)


def test_decoding_fields_moved_out_of_the_model_config_and_old_model_files_are_refused_by_name(tmp_path):
    """A model.yaml of the layout before the move (decoding fields among the architecture's; no release wrote it)
    is refused in one line naming the fields and where they go; TransformerConfig itself refuses them by name; the
    decoding: mapping round-trips."""
    from keras_transformer.decoding import DecodeOptions
    from keras_transformer.errors import ConfigError
    from keras_transformer.workdir.checkpoints import read_model_file, write_model_file
    with pytest.raises(ValueError, match="beam_size: decoding settings are not part of TransformerConfig"):
        TransformerConfig.from_dict(dict(vocab_size=100, beam_size=5))
    old = tmp_path / "old.yaml"
    old.write_text("vocab_size: 100\nd_model: 64\nnum_heads: 4\nbeam_size: 5\nlength_penalty: 1.0\n"
                   "max_decode_extra: 20\nearly_exit: true\n")
    with pytest.raises(ConfigError, match=r"old.yaml: beam_size, length_penalty, max_decode_extra, early_exit "
                                          r"among the architecture's fields .* move them under decoding: "
                                          r"\(length_penalty as alpha, max_decode_extra as max_extra\)"):
        read_model_file(old)
    config = TransformerConfig(vocab_size=100, d_model=64, num_heads=4)
    options = DecodeOptions(beam_size=5, alpha=1.0, max_extra=20, early_exit=True)
    new = tmp_path / "new.yaml"
    write_model_file(new, config, options.replace(strategy="sample", top_p=0.9, seed=3))
    assert read_model_file(new) == (config, DecodeOptions(strategy="sample", beam_size=5, alpha=1.0, max_extra=20,
                                                          early_exit=True, top_p=0.9, seed=3))
    assert TransformerConfig.from_yaml(new) == config


def test_unknown_preset_and_unknown_field():
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        TransformerConfig.preset("huge")
    with pytest.raises(ValueError, match="d_modle"):
        TransformerConfig.from_dict({"d_modle": 512})


def test_bool_tie_embeddings_is_normalised():
    assert TransformerConfig(vocab_size=50, d_model=8, num_heads=2, tie_embeddings=False).tie_embeddings == "none"
    assert TransformerConfig(vocab_size=50, d_model=8, num_heads=2, tie_embeddings=True).tie_embeddings == "all"


def test_yaml_round_trip(tmp_path):
    config = TransformerConfig.preset("small", vocab_size=8000, norm_first=True, position="learned")
    path = tmp_path / "config.yaml"
    config.save_yaml(path)
    assert TransformerConfig.from_yaml(path) == config


def test_yaml_exponents_without_a_dot_are_floats(tmp_path):
    """PyYAML (YAML 1.1) would read `1e-9` as a string; a config author means the number."""
    path = tmp_path / "config.yaml"
    path.write_text("vocab_size: 100\nd_model: 64\nnum_heads: 4\nepsilon: 1e-9\nlearning_rate_scale: 5E-1\n")
    config = TransformerConfig.from_yaml(path)
    assert config.epsilon == 1e-9 and config.learning_rate_scale == 0.5


def test_yaml_with_bad_key_names_it(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("vocab_size: 100\nnum_haeds: 4\n")
    with pytest.raises(ValueError, match="num_haeds"):
        TransformerConfig.from_yaml(path)
