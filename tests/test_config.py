"""TransformerConfig: presets, defaults, validation messages, YAML round trips."""

import dataclasses

import pytest
from factories import TINY_EXPERIMENT as TINY

from keras_transformer import TransformerConfig
from keras_transformer.config import PRESETS, TRAINING_FIELDS
from keras_transformer.errors import ConfigError


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
    (dict(layer_norm_epsilon="small"), "layer_norm_epsilon must be a number, got 'small'"),
    (dict(layer_norm_epsilon=0.0), "layer_norm_epsilon must be > 0, got 0.0"),
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
    path.write_text("vocab_size: 100\nd_model: 64\nnum_heads: 4\nlayer_norm_epsilon: 1e-9\ndropout: 5E-1\n")
    config = TransformerConfig.from_yaml(path)
    assert config.layer_norm_epsilon == 1e-9 and config.dropout == 0.5


def test_yaml_with_bad_key_names_it(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("vocab_size: 100\nnum_haeds: 4\n")
    with pytest.raises(ValueError, match="num_haeds"):
        TransformerConfig.from_yaml(path)


# The training settings that left TransformerConfig, each with a value it took there.
MOVED = {"label_smoothing": 0.2, "warmup_steps": 400, "learning_rate_scale": 0.5, "beta_1": 0.8, "beta_2": 0.99,
         "epsilon": 1e-6}


def test_no_training_setting_is_a_field_of_the_model_config():
    from keras_transformer.experiment import TrainingSection
    fields = {field.name for field in dataclasses.fields(TransformerConfig)}
    training = {field.name for field in dataclasses.fields(TrainingSection)}
    assert set(TRAINING_FIELDS) == set(MOVED) and set(MOVED) <= training and not set(MOVED) & fields
    assert not {"clipnorm", "cooldown_epochs", "gradient_accumulation_steps"} & fields


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_training_setting_given_to_the_model_config_is_refused_with_its_new_place(name, tmp_path):
    """`TransformerConfig(...)`, `from_dict`, `preset` and `from_yaml` (a workdir's or an export's model.yaml) name
    the key and where it goes now, in one line."""
    message = f"{name} is a training setting now: write it as training.{name} (experiment.TrainingSection)."
    for make in (lambda: TransformerConfig(vocab_size=100, **{name: MOVED[name]}),
                 lambda: TransformerConfig.from_dict({"vocab_size": 100, name: MOVED[name]}),
                 lambda: TransformerConfig.preset("tiny", vocab_size=100, **{name: MOVED[name]})):
        with pytest.raises(ConfigError) as error:
            make()
        assert str(error.value) == message
    path = tmp_path / "model.yaml"
    path.write_text(f"vocab_size: 100\nd_model: 64\nnum_heads: 4\n{name}: {MOVED[name]}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        TransformerConfig.from_yaml(path)
    assert str(error.value) == (f"{path}: {name} is a training setting now, not the model's: remove it from this "
                                f"file (an experiment gives it as training.{name}).")


@pytest.mark.parametrize("name", sorted(MOVED))
def test_an_experiment_that_puts_a_training_setting_under_model_is_refused_by_name(name, tmp_path, capsys):
    """In an experiment file (the file named), through `--set` (the command's one line), in `model.from`'s
    model.yaml and in a workdir's experiment.yaml from before the move (resuming it)."""
    import yaml

    from keras_transformer import cli
    from keras_transformer.experiment import changed_experiment, load_experiment
    expected = f"model.{name} is a training setting now: write it as training.{name}."
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "tiny", name: MOVED[name]}}), encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_experiment(path)
    assert str(error.value) == f"{path}: {expected}"
    with pytest.raises(ConfigError) as error:
        load_experiment(TINY, [f"model.{name}={MOVED[name]}"])
    assert str(error.value) == expected
    assert cli.main(["train", "--config", str(TINY), "--set", f"model.{name}={MOVED[name]}", "--workdir",
                     str(tmp_path / "run"), "--dry-run"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"error: {expected}"), lines
    assert load_experiment(TINY, [f"training.{name}={MOVED[name]}"]).training == dataclasses.replace(
        load_experiment(TINY).training, **{name: MOVED[name]})  # where it belongs
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.yaml").write_text(f"vocab_size: 100\n{name}: {MOVED[name]}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^model.from: {old / 'model.yaml'}: {name} is a training setting now"):
        load_experiment(TINY, ["model.preset=null", f"model.from={old}"])
    (old / "experiment.yaml").write_text(yaml.safe_dump({"model": {name: MOVED[name]}, "data": {}}), encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        changed_experiment(old / "experiment.yaml", {"model": {}, "data": {}})
    assert str(error.value) == f"{old / 'experiment.yaml'}: {expected}"


def test_a_preset_trains_with_the_warmup_it_had_unless_the_training_section_gives_one():
    """Before the move each preset carried a warm-up (tiny 400, the others 4000): a config that names a preset
    and no warm-up still trains with it, and `train --dry-run` prints it; a given one wins; no preset: 4000."""
    from keras_transformer.experiment import ExperimentConfig, TrainingSection, load_experiment
    before = {"tiny": 400, "small": 4000, "base": 4000, "big": 4000}  # PRESETS' warmup_steps until the move
    for preset, warmup in before.items():
        experiment = ExperimentConfig.from_dict({"model": {"preset": preset}})
        assert experiment.training.warmup_steps == warmup
        assert experiment.resolved()["training"]["warmup_steps"] == warmup
        assert f"  warmup_steps: {warmup}\n" in experiment.dry_run()
        assert ExperimentConfig.from_dict(experiment.to_dict()) == experiment  # experiment.yaml holds the number
        given = ExperimentConfig.from_dict({"model": {"preset": preset}, "training": {"warmup_steps": 7}})
        assert given.training.warmup_steps == 7
    assert ExperimentConfig.from_dict({"model": {"d_model": 64, "num_heads": 4}}).training.warmup_steps == 4000
    assert ExperimentConfig(model={"preset": "tiny"}).training.warmup_steps == 400  # built directly, too
    assert TrainingSection().warmup_steps is None  # the section alone: the preset decides
    # a later --set of the preset, or of null, decides as the file's would
    assert load_experiment(TINY, ["model.preset=base", "training.warmup_steps=null"]).training.warmup_steps == 4000
    assert load_experiment(TINY, ["training.warmup_steps=null"]).training.warmup_steps == 400


@pytest.mark.parametrize("values, fragment", [
    ({"label_smoothing": 1.0}, "training.label_smoothing must be in [0, 1), got 1.0"),
    ({"warmup_steps": 0}, "training.warmup_steps must be a positive integer or null, got 0"),
    ({"learning_rate_scale": "fast"}, "training.learning_rate_scale must be a number > 0, got 'fast'"),
    ({"epsilon": 0}, "training.epsilon must be a number > 0, got 0"),
    ({"beta_2": None}, "training.beta_2 must be a number in [0, 1), got None"),
    ({"beta_1": 1.0}, "training.beta_1 must be a number in [0, 1), got 1.0"),
])
def test_the_training_section_checks_its_optimizer_settings(values, fragment):
    from keras_transformer.experiment import ExperimentConfig
    with pytest.raises(ConfigError) as error:
        ExperimentConfig.from_dict({"model": {"preset": "tiny"}, "training": values})
    assert fragment in str(error.value)
