"""The experiment config (YAML, --set), the history file, checkpoints and the training loop's files."""

import csv
import dataclasses
import json
import shutil

import keras
import numpy as np
import pytest
import yaml
from factories import REPO, SMALL_MODEL, backup_weights, noam_learning_rates
from factories import SMALL_RUN as SMALL
from factories import TINY_EXPERIMENT as TINY

from keras_transformer import cli, files, training
from keras_transformer.config import TransformerConfig
from keras_transformer.data.build import build_data
from keras_transformer.errors import CheckpointError, ConfigError
from keras_transformer.experiment import DataSection, ExperimentConfig, TrainingSection, load_experiment, parse_override
from keras_transformer.model import build_model
from keras_transformer.trainer import backup as trainer_backup
from keras_transformer.trainer import callbacks as trainer_callbacks
from keras_transformer.trainer import loop as trainer_loop
from keras_transformer.trainer.backup import resumed_seed
from keras_transformer.trainer.callbacks import HistoryCSV, LearningRateLogger
from keras_transformer.trainer.precision import (
    cpu_has_amx,
    cpu_has_native_bfloat16,
    progress_verbosity,
    resolve_precision,
)
from keras_transformer.workdir.checkpoints import epoch_checkpoints, load_weights
from keras_transformer.workdir.layout import checkpoint_vocabulary


def _write(path, values):
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


# ------------------------------------------------------------------ config: keys and overrides
@pytest.mark.parametrize("values, key", [
    ({"training": {"epochz": 3}}, "training.epochz"),
    ({"model": {"preset": "tiny", "d_modle": 64}}, "model.d_modle"),
    ({"data": {"kind": "synthetic", "taks": "copy"}}, "data.taks"),
    ({"decoding": {"beam": 4}}, "decoding.beam"),
    ({"optimizer": {"lr": 1}}, "optimizer"),
])
def test_unknown_yaml_key_is_rejected_with_its_name_and_file(tmp_path, values, key):
    path = _write(tmp_path / "bad.yaml", values)
    with pytest.raises(ConfigError) as error:
        load_experiment(path)
    assert key in str(error.value)
    assert str(path) in str(error.value)


def test_close_misspelling_gets_a_suggestion(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean 'training.epochs'"):
        load_experiment(_write(tmp_path / "bad.yaml", {"training": {"epochz": 3}}))


def test_pipeline_key_on_synthetic_data_is_named():
    with pytest.raises(ConfigError, match="data.tokens_per_batch applies to data.kind 'text'"):
        load_experiment(TINY, ["data.tokens_per_batch=4096"])


def test_set_overrides_apply_in_order_and_are_typed():
    experiment = load_experiment(TINY, [
        "training.epochs=2", "training.epochs=5",  # later wins
        "model.dropout=0.25", "training.mixed_precision=mixed_bfloat16", "training.tensorboard=false",
        "training.devices=['/cpu:0', '/cpu:1']", "training.steps_per_epoch=null", "data.task=reverse",
        "training.learning_rate_scale=1e-3"])  # a float, though YAML 1.1 wants a dot
    assert experiment.training.epochs == 5
    assert experiment.model["dropout"] == 0.25
    assert experiment.training.mixed_precision == "mixed_bfloat16"
    assert experiment.training.tensorboard is False
    assert experiment.training.devices == ["/cpu:0", "/cpu:1"]
    assert experiment.training.steps_per_epoch is None
    assert experiment.data.task == "reverse"
    assert experiment.training.learning_rate_scale == 0.001
    # The rest of the file is untouched.
    assert experiment.model["preset"] == "tiny" and experiment.data.train_examples == 2048


def test_later_files_override_earlier_ones_key_by_key(tmp_path):
    override = _write(tmp_path / "more.yaml", {"training": {"epochs": 3}, "model": {"num_layers": 1}})
    experiment = load_experiment([TINY, override], ["training.epochs=4"])
    assert experiment.training.epochs == 4  # --set beats every file
    assert experiment.model["num_layers"] == 1 and experiment.model["preset"] == "tiny"
    assert experiment.training.jit_compile is False  # kept from the first file


@pytest.mark.parametrize("text", ["training.epochs", "epochs=3", "training..epochs=3", "training.epochs=[1,"])
def test_malformed_set_is_rejected(text):
    with pytest.raises(ConfigError, match="--set"):
        load_experiment(TINY, [text])


@pytest.mark.parametrize("values, message", [
    ({"training": {"strategy": "horovod"}}, "training.strategy"),
    ({"training": {"mixed_precision": "fp8"}}, "training.mixed_precision"),
    ({"training": {"epochs": 0}}, "training.epochs"),
    ({"training": {"epochs": 3, "cooldown_epochs": 4}}, "training.cooldown_epochs"),
    ({"training": {"initial_updates": -1}}, "training.initial_updates"),
    # Keras runs whole executions: 3 steps of 2 batches would train 4 updates an epoch, not 3
    ({"training": {"steps_per_epoch": 3, "steps_per_execution": 2}}, "training.steps_per_epoch=3 is not a multiple"),
    ({"training": {"communication": "rnig"}}, "training.communication"),
    ({"data": {"kind": "csv"}}, "data.kind"),
    ({"data": {"kind": "text"}}, "data.train_source"),
    ({"model": {"preset": "huge"}}, "model.preset"),
    ({"decoding": {"early_exit": "yes"}}, "decoding.early_exit"),
])
def test_bad_values_are_rejected_with_the_field_named(tmp_path, values, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_experiment(_write(tmp_path / "bad.yaml", values))


def test_model_section_preset_overrides_vocabulary_and_decoding():
    experiment = load_experiment(TINY, ["decoding.beam_size=5", "model.d_ff=128"])
    config = experiment.model_config(24)
    assert (config.d_model, config.d_ff, config.vocab_size, experiment.decoding.options.beam_size) == (64, 128, 24, 5)
    assert not experiment.decoding.options.early_exit
    assert load_experiment(TINY, ["decoding.early_exit=true"]).decoding.options.early_exit
    with pytest.raises(ConfigError, match=r"model.beam_size is a decoding setting: give it in the decoding "
                                          r"section \(decoding.beam_size\)"):
        load_experiment(TINY, ["model.beam_size=5"])
    with pytest.raises(ConfigError, match="model.vocab_size=10 is smaller"):
        load_experiment(TINY, ["model.vocab_size=10"]).model_config(24)
    # Larger passed, and the model then met a tokenizer of another size: a Translator refuses that pair.
    with pytest.raises(ConfigError, match="model.vocab_size=32 is larger than the data's vocabulary"):
        load_experiment(TINY, ["model.vocab_size=32"]).model_config(24)


def test_model_from_starts_the_section_from_a_model_yaml_of_a_workdir_an_export_or_a_file(tmp_path):
    """`model.from` (an imported model to fine-tune, a run to continue with other settings): the fields of that
    model.yaml, its decoding mapping left out (the decoding section's defaults: test_pretrained.py checks an
    import's), then the section's own keys over them."""
    from keras_transformer.errors import CheckpointNotFoundError
    from keras_transformer.workdir.checkpoints import read_model_file
    shipped = REPO / "saved_models" / "multi30k_en_de"
    config, _ = read_model_file(shipped / "assets.extra" / "model.yaml")
    fields = yaml.safe_load((shipped / "assets.extra" / "model.yaml").read_text(encoding="utf-8"))
    expected = {**{key: value for key, value in fields.items() if key != "decoding"}, "dropout": 0.3}
    for source in (shipped, shipped / "assets.extra" / "model.yaml"):
        experiment = ExperimentConfig.from_dict({"model": {"from": str(source), "dropout": 0.3}}, check_model=False)
        assert experiment.model == expected and "decoding" not in experiment.model
        assert experiment.decoding.options == read_model_file(shipped / "assets.extra" / "model.yaml")[1]
        assert TransformerConfig.from_dict(experiment.model) == dataclasses.replace(config, dropout=0.3)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(shipped / "assets.extra" / "model.yaml", run / "model.yaml")
    experiment = ExperimentConfig.from_dict({"model": {"from": str(run), "norm_first": False}}, check_model=False)
    assert experiment.model_config(config.vocab_size) == dataclasses.replace(config, norm_first=False)
    assert ExperimentConfig.from_dict({"model": {"from": None, "preset": "tiny"}}).model == {"preset": "tiny"}
    (tmp_path / "ensemble" / "assets.extra" / "members").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is an ensemble export: each member has its own model.yaml"):
        ExperimentConfig.from_dict({"model": {"from": str(tmp_path / "ensemble")}})
    with pytest.raises(ConfigError, match="model.from and model.preset both give the model's sizes"):
        ExperimentConfig.from_dict({"model": {"from": str(shipped), "preset": "tiny"}})
    with pytest.raises(CheckpointNotFoundError, match=f"No model.yaml at {tmp_path / 'nowhere'}"):
        ExperimentConfig.from_dict({"model": {"from": str(tmp_path / "nowhere")}})


def test_a_null_preset_is_no_preset(tmp_path):
    """`--set model.preset=null` (docs/config.md: "str or null") drops a config file's preset: the model is the
    defaults with the keys given, as when the key is left out."""
    (tmp_path / "experiment.yaml").write_text("model:\n  preset: tiny\n  d_model: 64\n", encoding="utf-8")
    experiment = load_experiment(tmp_path / "experiment.yaml", ["model.preset=null"])
    assert experiment.model_config(100) == TransformerConfig(vocab_size=100, d_model=64)
    with_preset = load_experiment(tmp_path / "experiment.yaml").model_config(100)
    assert with_preset == TransformerConfig.preset("tiny", vocab_size=100, d_model=64) != experiment.model_config(100)


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_and_resolve(path):
    experiment = load_experiment(path)
    vocabulary = experiment.data.synthetic_vocab_size if experiment.data.kind == "synthetic" else 8000
    config = experiment.model_config(vocabulary)
    assert isinstance(config, TransformerConfig)
    # The resolved config round-trips through YAML, as train() stores it.
    assert ExperimentConfig.from_dict(yaml.safe_load(yaml.safe_dump(experiment.to_dict()))) == experiment


def test_paper_configs_follow_table_3():
    base = load_experiment(REPO / "configs" / "wmt14_en_de_base.yaml").model_config(37000)
    big = load_experiment(REPO / "configs" / "wmt14_en_de_big.yaml").model_config(37000)
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.dropout) == (6, 512, 2048, 8, 0.1)
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads, big.dropout) == (6, 1024, 4096, 16, 0.3)
    for name in ("wmt14_en_de_base.yaml", "wmt14_en_de_big.yaml"):
        settings = load_experiment(REPO / "configs" / name).training
        assert (settings.warmup_steps, settings.label_smoothing) == (4000, 0.1)
        options = load_experiment(REPO / "configs" / name).decoding.options
        assert (options.strategy, options.beam_size, options.alpha) == ("beam", 4, 0.6)


@pytest.mark.parametrize("override", [
    "training.epochs=true", "training.steps_per_epoch=true", "training.bleu_beam_size=true", "training.seed=true",
    "training.verbose=true", "training.jit_compile=1", "training.mixed_precision=1", "data.seed=true",
    "decoding.max_extra=true"])
def test_booleans_are_not_counts(override):
    """YAML's `true` is an int to Python (`True == 1`): it was taken as epochs=1, a seed of 1, and so on."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=key.split(".")[-1]):
        load_experiment(TINY, [override])


def test_a_section_that_is_not_a_mapping_is_named_with_its_file(tmp_path):
    path = tmp_path / "model5.yaml"
    path.write_text("model: 5\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_experiment(path)  # was TypeError: 'int' object is not iterable
    assert str(error.value) == f"{path}: Section 'model' must be a mapping, got 5."


def test_a_folder_given_as_config_file_is_named_as_a_folder(tmp_path):
    with pytest.raises(ConfigError, match=f"Config file {tmp_path} is a directory"):
        load_experiment(tmp_path)


def _text_experiment(folder, **data):
    """A text-data experiment on two-line files in `folder` (never trained: these tests stop before the data)."""
    for name in ("train.en", "train.de", "val.en", "val.de"):
        (folder / name).write_text("a man\ntwo dogs\n", encoding="utf-8")
    files = {key: str(folder / name) for key, name in (("train_source", "train.en"), ("train_target", "train.de"),
                                                      ("valid_source", "val.en"), ("valid_target", "val.de"))}
    return {"model": {"preset": "tiny"}, "data": {"kind": "text", "vocab_size": 100, **files, **data},
            "training": {"epochs": 1}}


@pytest.mark.parametrize("overrides, message", [
    (["model.d_model=60", "model.num_heads=7"], "d_model=60 is not divisible by num_heads=7"),
    (["model.d_model=abc"], "d_model must be a positive integer, got 'abc'"),
    (["model.num_layers=-1"], "num_layers must be a positive integer, got -1"),
    (["model.dropout=2"], r"dropout must be in \[0, 1\), got 2"),
])
def test_a_bad_model_section_fails_before_any_data_work(tmp_path, overrides, message):
    """load_experiment (and so --dry-run) and train refuse it: train used to learn the vocabulary first."""
    config = _write(tmp_path / "text.yaml", _text_experiment(tmp_path))
    with pytest.raises(ConfigError, match="model: .*" + message):
        load_experiment(config, overrides)
    values = _text_experiment(tmp_path)
    for override in overrides:
        keys, value = parse_override(override)
        values["model"][keys[1]] = value
    experiment = ExperimentConfig(model=values["model"],
                                           data=DataSection.from_dict(values["data"]))
    with pytest.raises(ConfigError, match=message):
        training.train(experiment, tmp_path / "run")
    assert not (tmp_path / "run" / "data").exists()


def test_a_model_section_completed_by_a_later_file_or_set_is_accepted(tmp_path):
    """Each file alone is checked for keys, not for model sizes that a later file or --set may complete."""
    base = _write(tmp_path / "base.yaml", {"model": {"preset": "tiny", "d_model": 66}})  # 66 % 4 heads != 0
    assert load_experiment(base, ["model.num_heads=6"]).model_config(24).head_dim == 11
    more = _write(tmp_path / "more.yaml", {"model": {"num_heads": 3}})
    assert load_experiment([base, more]).model_config(24).num_heads == 3
    with pytest.raises(ConfigError, match="d_model=66 is not divisible by num_heads=4"):
        load_experiment(base)


@pytest.mark.parametrize("key", ["train_source", "valid_target", "valid_tokenized_target", "test_source"])
def test_missing_data_files_are_named_before_any_data_work(tmp_path, key, capsys):
    """A wrong path (even the test set's, read after training) fails at once, in --dry-run too, with its key."""
    from keras_transformer import cli
    values = _text_experiment(tmp_path, test_source=str(tmp_path / "val.en"), test_target=str(tmp_path / "val.de"))
    values["data"][key] = str(tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match=f"data.{key}: file not found: .*missing.txt"):
        training.train(values, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    values["data"][key] = str(tmp_path)  # a folder
    with pytest.raises(ConfigError, match=f"data.{key}: {tmp_path} is a directory, not a file"):
        training.pack_arrays(values, tmp_path / "packed")
    assert not (tmp_path / "packed" / "data").exists()
    config = _write(tmp_path / "text.yaml", values)
    assert cli.main(["train", "--config", str(config), "--workdir", str(tmp_path / "run"), "--dry-run"]) == 2
    assert f"data.{key}: {tmp_path} is a directory" in capsys.readouterr().err


# ------------------------------------------------------------------ history.csv
def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_history_csv_drops_rows_of_epochs_that_run_again(tmp_path):
    # A run killed after writing epoch 3's row but before its backup resumes at epoch index 2:
    # the stale row 3 goes, the new one comes, and the epochs never go back.
    path = tmp_path / "history.csv"
    path.write_text("epoch,loss\n1,3.0\n2,2.0\n3,1.5\n", encoding="utf-8")
    history = HistoryCSV(path)
    history.on_epoch_begin(2)
    history.on_epoch_end(2, {"loss": 1.25, "val_loss": 1.5})
    history.on_epoch_begin(3)
    history.on_epoch_end(3, {"loss": 1.0, "val_loss": 1.25})
    rows = _rows(path)
    assert [row["epoch"] for row in rows] == ["1", "2", "3", "4"]
    assert rows[2]["loss"] == "1.25" and rows[0]["val_loss"] == ""
    assert list(rows[0])[0] == "epoch"


# ------------------------------------------------------------------ checkpoints
@pytest.fixture(scope="module")
def tiny_model():
    return build_model(TransformerConfig.preset("tiny", vocab_size=24))


def test_missing_checkpoint_error_names_the_file(tiny_model, tmp_path):
    path = tmp_path / "checkpoints" / "ckpt-0003.weights.h5"
    with pytest.raises(CheckpointError, match=f"Checkpoint not found: {path}"):
        load_weights(tiny_model, path)


@pytest.mark.parametrize("corruption", ["garbage", "truncated"])
def test_corrupt_checkpoint_error_names_the_file(tiny_model, tmp_path, corruption):
    path = tmp_path / "ckpt-0001.weights.h5"
    if corruption == "garbage":
        path.write_bytes(b"not an HDF5 file")
    else:
        tiny_model.save_weights(str(path))
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupt") as error:
        load_weights(tiny_model, path)
    assert str(path) in str(error.value)


def test_checkpoint_of_another_model_is_named(tiny_model, tmp_path):
    other = build_model(TransformerConfig.preset("tiny", vocab_size=24, d_ff=128))
    path = tmp_path / "other.weights.h5"
    other.save_weights(str(path))
    with pytest.raises(CheckpointError, match="does not match this model") as error:
        load_weights(tiny_model, path)
    assert str(path) in str(error.value)


def test_train_with_missing_init_checkpoint_names_it_before_any_work(tmp_path, capsys):
    missing = tmp_path / "pretrained.weights.h5"
    with pytest.raises(CheckpointError, match=f"training.init_checkpoint: Checkpoint not found: {missing}"):
        training.train(load_experiment(TINY, SMALL + [f"training.init_checkpoint={missing}"]),
                       tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the workdir, the data or the model
    with pytest.raises(CheckpointError, match="is a directory, not a weights file"):
        training.train(load_experiment(TINY, SMALL + [f"training.init_checkpoint={tmp_path}"]),
                       tmp_path / "run")
    assert cli.main(["train", "--config", str(TINY), "--set", f"training.init_checkpoint={missing}",
                     "--workdir", str(tmp_path / "run"), "--dry-run"]) != 0
    assert f"Checkpoint not found: {missing}" in capsys.readouterr().err


def test_corrupt_backup_stops_resume_with_the_file_named(tmp_path):
    workdir = tmp_path / "run"
    (workdir / "backup").mkdir(parents=True)
    (workdir / "backup" / "latest.weights.h5").write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    digest = files.file_digest(workdir / "backup" / "latest.weights.h5")  # the file the record describes
    (workdir / "backup" / "training_metadata.json").write_text(json.dumps(
        {"epoch": 1, "batches_done": 0, "gradient_accumulation_steps": 1, "weights_blake2b": digest}))
    with pytest.raises(CheckpointError) as error:
        training.train(load_experiment(TINY, SMALL), workdir)
    assert str(workdir / "backup" / "latest.weights.h5") in str(error.value)
    assert "corrupt" in str(error.value)


def _dropout_states(model):
    """Where each dropout generator's stream of masks stands."""
    return [np.asarray(v).tolist() for v in model.variables if v.path.endswith("seed_generator_state")]


@pytest.mark.slow
def test_a_resumed_run_draws_new_dropout_masks_and_a_fresh_run_repeats_its_own(tmp_path):
    """Keras does not save the dropout generators: reseeded as the first run, a resumed epoch would apply the
    masks of the first run's first epoch, example for example."""
    settings = SMALL + ["model.dropout=0.3", "training.validation=false"]
    first = training.train(load_experiment(TINY, settings), tmp_path / "run")
    after_first_epoch = _dropout_states(first.model)
    assert len(after_first_epoch) == 7  # one generator per embedding and per sublayer (2 encoder, 3 decoder)
    assert trainer_backup.backup_position(tmp_path / "run" / "backup") == (1, 0)
    resumed = training.train(load_experiment(TINY, settings + ["training.epochs=2"]), tmp_path / "run")
    assert len(resumed.history["loss"]) == 1  # one epoch ran, from the backup
    resumed_states = _dropout_states(resumed.model)
    assert all(a != b for a, b in zip(resumed_states, after_first_epoch))
    again = training.train(load_experiment(TINY, settings), tmp_path / "again")
    assert _dropout_states(again.model) == after_first_epoch  # a fresh run stays reproducible from its seed


def test_resume_position_is_read_from_the_backup(tmp_path):
    backup = tmp_path / "backup"
    assert trainer_backup.backup_position(backup) == (0, 0)  # nothing to resume: a fresh run
    backup.mkdir()
    (backup / "training_metadata.json").write_text('{"epoch": 7, "batch": 30}')
    with pytest.raises(CheckpointError, match="latest.weights.h5 is missing"):
        trainer_backup.backup_position(backup)  # metadata without weights: not a backup to start afresh beside
    (backup / "latest.weights.h5").write_bytes(b"weights")
    # Keras' own record (the last batch's zero-based index), which versions before 0.2.0 could leave: named, refused
    with pytest.raises(CheckpointError, match="records no batches_done, weights_blake2b, gradient_accumulation_steps"
                                              ": a backup of another program or an earlier version"):
        trainer_backup.backup_position(backup)
    digest = files.file_digest(backup / "latest.weights.h5")
    record = {"epoch": 7, "batches_done": 2, "gradient_accumulation_steps": 1, "weights_blake2b": digest}
    (backup / "training_metadata.json").write_text(json.dumps(record))
    assert trainer_backup.backup_position(backup) == (7, 2)
    (backup / "training_metadata.json").write_text(json.dumps({**record, "batches_done": 0}))
    assert trainer_backup.backup_position(backup) == (7, 0)  # an epoch boundary
    (backup / "latest.weights.h5").write_bytes(b"weightz")  # not the file the metadata describes
    with pytest.raises(CheckpointError, match="latest.weights.h5 is not the file"):
        trainer_backup.backup_position(backup)
    (backup / "training_metadata.json").write_text('{"epoch": 7, "ba')  # cut short: named
    with pytest.raises(CheckpointError, match="training_metadata.json is not JSON"):
        trainer_backup.backup_position(backup)
    assert len({resumed_seed(1234, 6), resumed_seed(1234, 7), resumed_seed(1234, 7, 30),
                1234}) == 4


def _data_of_unknown_length(monkeypatch):
    """Makes `train` build a training dataset whose number of batches tf.data cannot tell."""
    real_build_data = build_data

    def unknown_length(*args, **kwargs):
        data = real_build_data(*args, **kwargs)
        # cardinality becomes UNKNOWN, so the loop is not told the number of batches
        return dataclasses.replace(data, train=data.train.filter(lambda features, labels: True), num_batches=None)
    monkeypatch.setattr(training, "build_data", unknown_length)


class _Interrupted(Exception):
    pass


def _interrupt_at(monkeypatch, update=None, seen=None):
    """Makes the next `train` stop, as a killed process would, once the optimizer has made `update` updates (None:
    never); with a list `seen`, it also appends the model's trainable weights after every update to it."""
    class Stop(LearningRateLogger):
        def on_train_batch_end(self, batch, logs=None):
            if seen is not None:
                seen.append([weights.astype(np.float64) for weights in _trainable(self.model)])
            if int(self.model.optimizer.iterations) == update:
                raise _Interrupted()

    monkeypatch.setattr(trainer_loop, "LearningRateLogger", Stop)  # the first callback the loop makes


def _trainable(model):
    return [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]


def _assert_close(got, expected):
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_an_epoch_interrupted_between_backups_resumes_at_its_batch(tmp_path, monkeypatch):
    """With training.backup_every_steps a run stopped inside an epoch trains only the batches that epoch had
    left: the run ends with the updates of an uninterrupted one, and its epochs keep their numbers even when the
    resumed epoch is interrupted again.

    With training.ema_decay on, each backup restores the raw weights and their moving averages as they stood: the
    weights each process trained from its backup on, spliced, are the run's raw trajectory, and every epoch
    checkpoint (and the model `train` returns) holds numpy's EMA of it, the first update copying the weights; the
    backup keeps the raw weights beside the averages; the last epoch's val_loss is the averaged weights'; and
    turning the average off in the run half way is refused by name, as is another gradient accumulation."""
    decay = 0.8
    settings = SMALL_MODEL + ["data.train_examples=256", "data.val_examples=32", "data.batch_size=32",
                              "training.epochs=3", "training.verbose=0", "training.tensorboard=false",
                              "training.backup_every_steps=2", f"training.ema_decay={decay}"]
    experiment = load_experiment(TINY, settings)
    workdir = tmp_path / "run"
    positions, trajectory = [], []
    # 8 batches an epoch: inside the second epoch, inside its resumed rest, after the last batch of the third
    for update in (13, 15, 24):
        seen = []
        _interrupt_at(monkeypatch, update, seen)
        with pytest.raises(_Interrupted):
            training.train(experiment, workdir)
        positions.append(trainer_backup.backup_position(workdir / "backup"))
        epoch, done = positions[-1]
        trajectory = (trajectory + seen)[:epoch * 8 + done]  # what this process trained up to the backup it left
    assert positions == [(1, 4), (1, 6), (2, 6)]  # backups every 2 batches, and at each epoch's end instead
    seen = []
    _interrupt_at(monkeypatch, seen=seen)
    result = training.train(experiment, workdir)
    trajectory += seen
    monkeypatch.undo()
    assert int(result.model.optimizer.iterations) == len(trajectory) == 3 * 8
    with open(workdir / "history.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(row["epoch"], float(row["step"])) for row in rows] == [("1", 8), ("2", 16), ("3", 24)]
    assert [path.name for path in epoch_checkpoints(workdir)] == [
        f"ckpt-{n:04d}.weights.h5" for n in (1, 2, 3)]
    assert trainer_backup.backup_position(workdir / "backup") == (3, 0)  # each epoch ends with a backup

    averages = [trajectory[0]]
    for weights in trajectory[1:]:
        averages.append([decay * a + (1 - decay) * w for a, w in zip(averages[-1], weights)])
    model = build_model(result.model_config)
    for checkpoint, updates in zip(epoch_checkpoints(workdir), (8, 16, 24), strict=True):
        load_weights(model, checkpoint)
        _assert_close(_trainable(model), averages[updates - 1])
    _assert_close(_trainable(result.model), averages[-1])
    raw, average = backup_weights(workdir, decay)
    _assert_close(raw, trajectory[-1])
    _assert_close(average, averages[-1])
    assert not np.allclose(average[0], raw[0], atol=1e-4)  # the average is not the raw weights
    data = build_data(experiment.data, workdir / "data", seed=experiment.training.seed)
    assert float(rows[-1]["val_loss"]) == pytest.approx(
        result.model.evaluate(data.validation, verbose=0, return_dict=True)["loss"], rel=1e-5)

    off = load_experiment(TINY, settings + ["training.ema_decay=null", "training.epochs=4"])
    with pytest.raises(CheckpointError, match="training.ema_decay is off now but was on"):
        training.train(off, workdir)
    # Nor another gradient accumulation: Keras would drop the optimizer state (its variables differ in number),
    # and the update count would start over.
    accumulating = load_experiment(TINY, settings + ["training.gradient_accumulation_steps=2", "training.epochs=4"])
    with pytest.raises(CheckpointError, match="training.gradient_accumulation_steps is 2 now but was 1"):
        training.train(accumulating, workdir)
    assert trainer_backup.backup_position(workdir / "backup") == (3, 0)


@pytest.mark.slow
def test_the_history_row_of_an_interrupted_epoch_averages_all_its_batches(tmp_path, monkeypatch, caplog):
    """The resumed process trains the epoch's last 4 batches; its history row still averages all 8, the 4 the
    killed process trained included (their mean is what that process reported)."""
    settings = SMALL_MODEL + ["data.train_examples=256", "data.val_examples=32", "data.batch_size=32",
                              "training.epochs=2", "training.verbose=0", "training.tensorboard=false",
                              "training.backup_every_steps=2", "training.validation=false"]
    experiment = load_experiment(TINY, settings)
    seen = []  # (process, epoch, batch, reported running loss, loss tracker total, count)

    def spy(process, stop_at=None):
        class Spy(LearningRateLogger):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                tracker = self.model._loss_tracker
                seen.append((process, self.epoch, batch, float(logs["loss"]), float(tracker.total.numpy()),
                             float(tracker.count.numpy())))
                if int(self.model.optimizer.iterations) == stop_at:
                    raise _Interrupted()
        monkeypatch.setattr(trainer_loop, "LearningRateLogger", Spy)

    spy("first", stop_at=13)  # inside the second epoch; the last backup came after its 4th batch
    with pytest.raises(_Interrupted):
        training.train(experiment, tmp_path / "run")
    assert trainer_backup.backup_position(tmp_path / "run" / "backup") == (1, 4)
    spy("resumed")
    training.train(experiment, tmp_path / "run")
    first_four = [row for row in seen if row[:2] == ("first", 1)][:4]
    resumed = [row for row in seen if row[0] == "resumed"]
    assert len(resumed) == 4
    # The first process's 4 batches join the tracker after the first resumed batch (Keras builds the compiled
    # metrics there), whose reported loss is its own; each later batch adds its loss times its 32 examples.
    assert [row[5] for row in resumed] == [5 * 32, 6 * 32, 7 * 32, 8 * 32]
    resumed_losses = [resumed[0][3]] + [(b[4] - a[4]) / 32 for a, b in zip(resumed, resumed[1:])]
    expected = (first_four[-1][3] * 4 + sum(resumed_losses)) / 8
    row = _rows(tmp_path / "run" / "history.csv")[1]
    assert row["epoch"] == "2"
    assert float(row["loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(row["loss"]) != pytest.approx(np.mean(resumed_losses), rel=1e-3)  # the 4 resumed ones alone
    assert "average only the batches" not in caplog.text


@pytest.mark.slow
def test_a_text_run_killed_inside_an_epoch_resumes_at_its_place_in_the_stream(packed, tmp_path, monkeypatch,
                                                                               caplog):
    """Text data streams in windows (here 100 lines, four a pass): a run stopped inside an epoch resumes at its
    window, reading none of the windows before it (their lines are skipped, not tokenized) and skipping the
    window's batches it trained, and trains the batches the uninterrupted run trained: without dropout, the
    weights after every update equal the uninterrupted run's. (Before, a resumed run shuffled anew: other
    batches.)"""
    folder = packed[2]
    config = _write(tmp_path / "text.yaml", {
        "model": {"preset": "tiny", "num_layers": 1, "dropout": 0.0},
        "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                 "vocab_size": 600, "tokens_per_batch": 512, "max_length": 64, "window": 100},
        "training": {"warmup_steps": 20, "epochs": 2, "verbose": 0, "tensorboard": False, "validation": False,
                     "backup_every_steps": 2, "seed": 5}})
    experiment = load_experiment(config)
    for run in ("whole", "broken"):  # the packed fixture's vocabulary, not one learned again
        shutil.copytree(packed[0] / "data" / "vocab", tmp_path / run / "data" / "vocab")
    whole = []
    _interrupt_at(monkeypatch, seen=whole)
    training.train(experiment, tmp_path / "whole")
    per_epoch = len(whole) // 2
    stop = 2 * per_epoch - 2  # inside the second epoch's last window (read, and the pass ended, before the stop)
    broken = []
    _interrupt_at(monkeypatch, stop, broken)
    with pytest.raises(_Interrupted):
        training.train(experiment, tmp_path / "broken")
    epoch, done = trainer_backup.backup_position(tmp_path / "broken" / "backup")
    assert epoch == 1 and stop - per_epoch - 3 < done < stop - per_epoch  # the last backups before the stop
    position = trainer_backup.backup_stream(tmp_path / "broken" / "backup")
    assert (position["pass_number"], position["window"], position["batch"]) == (1, 3, done) and position["skip"] > 0
    rest = []
    _interrupt_at(monkeypatch, seen=rest)
    caplog.clear()
    with caplog.at_level("INFO"):
        training.train(experiment, tmp_path / "broken")
    monkeypatch.undo()
    assert f"(pass 2, window {position['window'] + 1}" in caplog.text  # it started reading at its window
    trained = broken[:per_epoch + done] + rest  # what the backup kept, then what the resumed process trained
    assert len(trained) == len(whole)
    for got, expected in zip(trained, whole, strict=True):
        _assert_close(got, expected)


@pytest.mark.slow
def test_an_interrupted_epoch_of_unknown_length_trains_again_and_says_so(tmp_path, monkeypatch, caplog):
    """Slow: a training run interrupted inside an epoch and resumed; the epoch has to be trained to be interrupted."""
    _data_of_unknown_length(monkeypatch)
    experiment = load_experiment(TINY, SMALL_MODEL + [
        "data.train_examples=256", "data.val_examples=32", "data.batch_size=32", "training.epochs=2",
        "training.verbose=0", "training.tensorboard=false", "training.backup_every_steps=2",
        "training.validation=false"])
    _interrupt_at(monkeypatch, 13)
    with pytest.raises(_Interrupted):
        training.train(experiment, tmp_path / "run")
    monkeypatch.undo()  # no more interruptions: the data keeps its unknown length
    _data_of_unknown_length(monkeypatch)
    result = training.train(experiment, tmp_path / "run")
    assert "does not tell its number of batches per epoch" in caplog.text
    assert int(result.model.optimizer.iterations) == 2 * 8 + 4  # the 4 batches backed up, then the whole epoch


def _steps(workdir):
    return [int(float(row["step"])) for row in _rows(workdir / "history.csv")]


@pytest.mark.slow
def test_steps_per_epoch_below_one_pass_trains_that_many_updates_every_epoch_and_after_a_resume(tmp_path,
                                                                                               monkeypatch):
    """8 batches a pass, 3 an epoch: every epoch trains 3 updates, the third one across the end of the first pass
    (before, it stopped there after 2 and was saved as a whole epoch: steps 3, 6, 8, 11). A run stopped inside
    the fourth epoch resumes and ends with the updates of the uninterrupted run."""
    settings = SMALL_MODEL + ["data.train_examples=256", "data.val_examples=32", "data.batch_size=32",
                              "training.epochs=4", "training.steps_per_epoch=3", "training.verbose=0",
                              "training.tensorboard=false", "training.validation=false",
                              "training.backup_every_steps=1"]
    experiment = load_experiment(TINY, settings)
    whole = training.train(experiment, tmp_path / "whole")
    assert _steps(tmp_path / "whole") == [3, 6, 9, 12] and int(whole.model.optimizer.iterations) == 12
    _interrupt_at(monkeypatch, 11)  # the second batch of the fourth epoch, in the second pass
    with pytest.raises(_Interrupted):
        training.train(experiment, tmp_path / "broken")
    monkeypatch.undo()
    assert trainer_backup.backup_position(tmp_path / "broken" / "backup") == (3, 1)
    resumed = training.train(experiment, tmp_path / "broken")
    assert resumed.history["step"] == [12]  # the epoch's 2 batches left, and no more
    assert _steps(tmp_path / "broken") == [3, 6, 9, 12] and int(resumed.model.optimizer.iterations) == 12


def _data_section(kind, packed, tmp_path, tokens_per_batch, synthetic=()):
    """The data section of a tiny run of `kind`: "synthetic" (TINY with SMALL and `synthetic` overrides), "text" (the
    packed fixture's files, a 600-piece vocabulary) or "text with BPE-dropout" (the same with subword dropout 0.1)."""
    if kind == "synthetic":
        return load_experiment(TINY, SMALL + list(synthetic)).data
    folder = packed[2]
    dropout = {"subword_dropout": 0.1} if "BPE" in kind else {}
    return load_experiment(_write(tmp_path / "text.yaml", {
        "model": {"preset": "tiny"},
        "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                 "vocab_size": 600, "tokens_per_batch": tokens_per_batch, "max_length": 64, **dropout}})).data


@pytest.mark.parametrize("kind", ["synthetic", "text", "text with BPE-dropout"])
def test_with_steps_per_epoch_the_training_data_is_an_endless_stream_of_fresh_passes(packed, tmp_path, kind):
    """An epoch of `steps_per_epoch` batches takes them from an unbroken stream of passes: each pass holds every
    pair once, in an order of its own; a second iterator (the `fit` after a resumed epoch's rest) goes on with
    new passes instead of replaying the first iterator's batches."""
    section = _data_section(kind, packed, tmp_path, tokens_per_batch=1024,
                            synthetic=["data.train_examples=96"])  # synthetic: 3 batches of 32
    data = build_data(section, tmp_path / "data", seed=1234, steps_per_epoch=2)
    assert int(data.train.cardinality()) in (-1, -2)  # tf.data.INFINITE_CARDINALITY, or UNKNOWN for a stream

    def pairs(batches):  # the pairs of `batches`, as (source ids, target ids), sorted
        return sorted((tuple(s[s != 0]), tuple(t[t != 0])) for inputs, _ in batches
                      for s, t in zip(inputs["source"].numpy(), inputs["target"].numpy()))

    def sources(batches):
        return [inputs["source"].numpy().tolist() for inputs, _ in batches]

    if kind == "synthetic":
        passes = data.num_batches  # one pass's batches, as before; the stream itself has no end
    else:  # the stream's first window (the whole corpus here) tells one pass's batches once it is planned
        cursor = data.callbacks[0]
        list(data.train.take(1))
        passes = cursor.text.records[(0, 0)][0]
        cursor.on_train_begin()
        cursor.on_epoch_begin(0)  # a `fit` from epoch 0
    assert passes > 2
    stream = list(data.train.take(3 * passes))  # the batches of one `fit`'s first 3 * passes updates
    # BPE-dropout cuts each pass's batches by its own sampled lengths: the second pass may hold more or fewer.
    second_pass = passes if kind == "synthetic" else cursor.text.records[(1, 0)][0]
    first, second = stream[:passes], stream[passes:passes + second_pass]
    if "BPE" in kind:  # sampled segmentations differ from pass to pass: count the pairs
        assert len(pairs(first)) == len(pairs(second))
    else:
        assert pairs(first) == pairs(second)  # every pair once a pass
    assert sources(first) != sources(second)  # each pass shuffled anew
    if kind == "synthetic":
        assert sources(data.train.take(passes)) not in (sources(first), sources(second))  # a new iterator: new passes
    else:  # a new `fit` from epoch 2 (2 batches an epoch) goes on with the batches the stream had there
        cursor.on_train_begin()
        cursor.on_epoch_begin(2)
        assert sources(data.train.take(passes)) == sources(stream[4:4 + passes])


@pytest.mark.slow
def test_a_resumed_run_keeps_the_best_bleu_weights_of_its_earlier_epochs(packed, tmp_path):
    """best.weights.h5 holds the weights of the best validation BLEU of the whole run: a resumed run does not
    replace them with its first scored epoch unless that one scores higher."""
    folder = packed[2]
    config = _write(tmp_path / "text.yaml", {
        "model": {"preset": "tiny", "num_layers": 1},
        "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                 "valid_source": str(folder / "val.en"), "valid_target": str(folder / "val.de"),
                 "vocab_size": 600, "tokens_per_batch": 2048, "max_length": 64},
        "training": {"epochs": 1, "bleu_every_epochs": 1, "bleu_max_sentences": 8, "verbose": 0,
                     "tensorboard": False},
        # A model of one epoch rarely ends a sentence: 8 tokens past the source keep its BLEU decoding short.
        "decoding": {"max_extra": 8}})
    workdir = tmp_path / "run"
    training.train(load_experiment(config), workdir)
    best = workdir / "checkpoints" / "best.weights.h5"
    first = best.read_bytes()
    with open(workdir / "history.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["val_bleu"]) < 100
    assert trainer_callbacks.best_logged(workdir / "history.csv", "val_bleu", 1) == float(rows[0]["val_bleu"])
    rows[0]["val_bleu"] = "100"  # as if the first epoch had scored what no later one can beat
    with open(workdir / "history.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    training.train(load_experiment(config, ["training.epochs=2"]), workdir)
    assert best.read_bytes() == first
    assert trainer_callbacks.best_logged(workdir / "history.csv", "val_bleu", 1) == 100
    assert trainer_callbacks.best_logged(workdir / "history.csv", "val_bleu", 0) == -np.inf


@pytest.mark.slow  # three short training runs (4-6 CPU s)
@pytest.mark.parametrize("kind", ["synthetic", "text", "text with BPE-dropout"])
def test_a_resumed_run_shuffles_in_a_new_order_and_a_fresh_run_in_the_same_one(packed, tmp_path, kind):
    """A seeded tf.data shuffle restarts its orders in every process: the resume position picks new ones
    (and, with BPE-dropout, new segmentations)."""
    section = _data_section(kind, packed, tmp_path, tokens_per_batch=512)

    def first_epoch(resumed_at):
        data = build_data(section, tmp_path / "data", seed=1234, resumed_at=resumed_at)
        return [inputs["source"].numpy().tolist() for inputs, _ in data.train]

    fresh = first_epoch((0, 0))
    assert first_epoch((0, 0)) == fresh
    resumed = first_epoch((3, 0))
    assert resumed != fresh
    assert first_epoch((3, 0)) == resumed  # the same resume point gives the same order
    if "BPE" in kind:  # sampled segmentations: more tokens than the vocabulary's own segmentation
        plain = build_data(dataclasses.replace(section, pipeline={**section.pipeline, "subword_dropout": 0.0}),
                                    tmp_path / "data", seed=1234)
        tokens = [sum(np.count_nonzero(np.array(batch)) for batch in epoch)
                  for epoch in (fresh, [inputs["source"].numpy().tolist() for inputs, _ in plain.train])]
        assert tokens[0] > 1.1 * tokens[1], tokens


@pytest.mark.slow
def test_a_run_with_bpe_dropout_trains_its_epochs_and_resumes(packed, tmp_path):
    """With BPE-dropout the number of batches changes every epoch (unknown to Keras beforehand); training, the
    history and resuming still count epochs, and the learning-rate schedule counts every update."""
    folder = packed[2]
    config = _write(tmp_path / "text.yaml", {
        "model": {"preset": "tiny", "num_layers": 1},
        "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                 "vocab_size": 600, "tokens_per_batch": 2048, "max_length": 64, "subword_dropout": 0.1},
        "training": {"epochs": 2, "verbose": 0, "tensorboard": False}})
    workdir = tmp_path / "run"
    training.train(load_experiment(config), workdir)
    training.train(load_experiment(config, ["training.epochs=3"]), workdir)
    with open(workdir / "history.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["epoch"]) for row in rows] == [1, 2, 3]
    assert all(np.isfinite(float(row["loss"])) for row in rows)
    assert sorted(p.name for p in (workdir / "checkpoints").glob("ckpt-*.weights.h5"))[-1] == "ckpt-0003.weights.h5"


def test_synthetic_and_packed_batches_run_without_tf_data_autotuning(packed, tmp_path):
    """The synthetic and the packed training data, like the text stream (tests/test_pipeline.py), run without
    tf.data's model-based autotuning: they have nothing for it to tune, and deleting a tuned iterator waits for its
    tuning thread's sleep. An exception out of `fit` (a full disk, a NaN) leaves the iterator to the garbage
    collector, held by the traceback, and on a busy machine that collection stalled for tens of seconds."""
    from keras_transformer.packed.training import packed_data
    experiment = load_experiment(TINY, SMALL)
    synthetic = build_data(experiment.data, tmp_path / "data", seed=1)
    arrays, _ = packed_data(packed[0], load_experiment(packed[0] / "experiment.yaml"))
    for dataset in (synthetic.train, synthetic.validation, arrays.train, arrays.validation):
        assert dataset.options().autotune.enabled is False


@pytest.mark.slow
def test_fine_tuning_takes_the_weights_the_vocabulary_and_the_update_count_of_the_run_it_starts_from(
        packed, tmp_path):
    """training.init_checkpoint: the new workdir copies the vocabulary of the run that wrote the weights (its own
    data section asks for another size, which would learn other ids), starts from those weights, and with
    training.initial_updates goes on with that run's learning-rate schedule."""
    folder = packed[2]
    base = {"model": {"preset": "tiny", "num_layers": 1, "dropout": 0.0},
            "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                     "valid_source": str(folder / "val.en"), "valid_target": str(folder / "val.de"),
                     "vocab_size": 600, "tokens_per_batch": 2048, "max_length": 64},
            "training": {"warmup_steps": 20, "epochs": 1, "verbose": 0, "tensorboard": False}}
    config = _write(tmp_path / "text.yaml", base)
    first = training.train(load_experiment(config), tmp_path / "first")
    updates = _rows(tmp_path / "first" / "history.csv")[0]["step"]
    checkpoint = tmp_path / "first" / "checkpoints" / "ckpt-0001.weights.h5"
    scale = 1e-9  # a learning rate too small to move the weights: the second run must end where it started
    tuned = training.train(load_experiment(config, [
        "data.vocab_size=300", f"training.init_checkpoint={checkpoint}", f"training.initial_updates={updates}",
        f"training.learning_rate_scale={scale}"]), tmp_path / "tuned")
    vocab = [sorted((run / "data" / "vocab").iterdir()) for run in (tmp_path / "first", tmp_path / "tuned")]
    assert [p.read_bytes() for p in vocab[0]] == [p.read_bytes() for p in vocab[1]]
    assert tuned.model_config.vocab_size == first.model_config.vocab_size == 600
    for start, end in zip(first.model.get_weights(), tuned.model.get_weights()):
        np.testing.assert_allclose(end, start, atol=1e-5)
    row = _rows(tmp_path / "tuned" / "history.csv")[0]
    step = int(row["step"])
    assert step == 2 * int(updates)  # the same batches again, counted on from the first run's updates
    d_model, warmup = first.model_config.d_model, 20
    expected = scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    assert float(row["learning_rate"]) == pytest.approx(expected, rel=1e-5)

    # A workdir whose vocabulary is not the checkpoint's is refused, both named.
    (tmp_path / "other" / "data").mkdir(parents=True)
    import shutil
    shutil.copytree(tmp_path / "first" / "data" / "vocab", tmp_path / "other" / "data" / "vocab")
    (tmp_path / "other" / "data" / "vocab" / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match="this workdir's .*vocab differs") as error:
        training.train(load_experiment(config, [f"training.init_checkpoint={checkpoint}"]),
                       tmp_path / "other")
    assert str(tmp_path / "first" / "data" / "vocab") in str(error.value)


@pytest.mark.slow  # two `train` calls
def test_accumulating_two_half_batches_is_one_whole_batch_update_for_update(tmp_path):
    """With training.gradient_accumulation_steps: 2, two batches of 16 pairs make the update one batch of the same 32
    makes, at the same point of the schedule: the same `step` and `learning_rate` after every update (the Noam rate
    at that update, cooldown included) and the same weights. Keras would read the schedule at its count of batches,
    twice the updates. The run starts at update 10 (training.initial_updates), so that count is set as well; the
    pairs all have 8 tokens, so both halves hold as many labels and the mean of their mean losses is the whole
    batch's (the loss is a mean over tokens); dropout is off. Adam's epsilon is 1e-6, not 1e-9: the key biases'
    gradients are zero but for rounding, which an epsilon of 1e-9 would turn into moves of a whole learning rate."""
    def run(name, batch_size, accumulation):
        experiment = load_experiment(TINY, SMALL + [
            "training.epsilon=1e-6", "data.train_examples=32", f"data.batch_size={batch_size}", "training.epochs=3",
            "training.cooldown_epochs=1", "training.initial_updates=10", "training.validation=false",
            f"training.gradient_accumulation_steps={accumulation}"])
        result = training.train(experiment, tmp_path / name)
        return result, experiment.training, _rows(tmp_path / name / "history.csv")

    whole, settings, whole_rows = run("whole", 32, 1)
    halves, _, halves_rows = run("halves", 16, 2)
    config = whole.model_config
    assert config.dropout == config.attention_dropout == config.ffn_dropout == 0
    noam = noam_learning_rates(config, settings, (11, 12)) + [0.0]  # the cooldown reaches 0 at the last update
    for rows in (whole_rows, halves_rows):
        assert [int(row["step"]) for row in rows] == [11, 12, 13]
        np.testing.assert_allclose([float(row["learning_rate"]) for row in rows], noam, rtol=1e-5, atol=1e-12)
    assert int(halves.model.optimizer.iterations) == 13
    for a, b in zip(whole.model.get_weights(), halves.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_the_vocabulary_of_a_checkpoint_is_found_beside_an_export_and_inside_a_workdir():
    export = REPO / "saved_models" / "multi30k_en_de"
    assert checkpoint_vocabulary(export / "assets.extra" / "model.weights.h5") == \
        export / "assets.extra" / "vocab"


@pytest.mark.slow
def test_r_drop_trains_on_pairs_and_reports_the_plain_validation_loss(tmp_path):
    """With training.rdrop_alpha every batch runs twice; validation runs twice too, without dropout, so its
    divergence is zero and val_loss is the plain label-smoothed loss of the trained weights."""
    import keras

    from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy
    settings = SMALL + ["model.dropout=0.3", "training.epochs=2", "training.rdrop_alpha=5"]
    experiment = load_experiment(TINY, settings)
    result = training.train(experiment, tmp_path / "run")
    assert all(np.isfinite(result.history["loss"]))
    data = build_data(experiment.data, tmp_path / "run" / "data", seed=experiment.training.seed)
    plain = build_model(result.model_config)
    plain.compile(loss=LabelSmoothedCrossEntropy(experiment.training.label_smoothing), run_eagerly=True)
    keras.ops.convert_to_numpy(plain(next(iter(data.validation))[0]))
    plain.set_weights(result.model.get_weights())
    assert plain.evaluate(data.validation, verbose=0) == pytest.approx(result.history["val_loss"][-1], rel=1e-4)
    # Without the repeat, validation would pair different examples, and the divergence would add to the loss.
    result.model.compile(loss=result.model.loss, run_eagerly=True)
    unpaired = result.model.evaluate(data.validation, verbose=0, return_dict=True)["loss"]
    assert unpaired > result.history["val_loss"][-1] + 1e-3


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.5, True, "0.999"])
def test_a_bad_ema_decay_is_named(value):
    with pytest.raises(ConfigError, match="training.ema_decay must be a number between 0 and 1"):
        TrainingSection(ema_decay=value).validate()


@pytest.mark.parametrize("value", [-1, "5", True])
def test_a_bad_rdrop_alpha_is_named(value):
    with pytest.raises(ConfigError, match="training.rdrop_alpha must be a number >= 0"):
        TrainingSection(rdrop_alpha=value).validate()


def test_workdir_of_another_model_is_refused(tmp_path):
    """Once a run saved an update (here a step checkpoint); one that never did takes another config
    (tests/test_faults.py)."""
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "checkpoints" / "step-00000010.weights.h5").write_bytes(b"weights")
    experiment = load_experiment(TINY, SMALL)
    resolved = experiment.to_dict()
    resolved["model"] = experiment.model_config(24).replace(d_ff=128).to_dict()
    (workdir / "experiment.yaml").write_text(yaml.safe_dump(resolved), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model.d_ff: 128 -> 256"):
        training.train(experiment, workdir)


def test_cooldown_on_data_of_unknown_length_asks_for_steps_per_epoch(tmp_path, monkeypatch):
    """The cooldown's span needs the batches per epoch: a dataset that cannot tell is refused before training."""
    _data_of_unknown_length(monkeypatch)
    experiment = load_experiment(TINY, SMALL + ["training.epochs=2", "training.cooldown_epochs=1"])
    with pytest.raises(ConfigError, match="set training.steps_per_epoch"):
        training.train(experiment, tmp_path / "run")
    assert not list((tmp_path / "run").glob("checkpoints/*.weights.h5"))


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("setting, tty, expected", [
    ("auto", True, 1), ("auto", False, 2), (0, True, 0), (1, False, 1), (2, True, 2)])
def test_progress_verbosity_draws_a_bar_only_on_a_terminal(setting, tty, expected):
    assert progress_verbosity(setting, _Stream(tty)) == expected


# ------------------------------------------------------------------ a whole (short) run
@pytest.mark.slow
def test_train_writes_the_documented_workdir(tmp_path, capsys, caplog):
    """Slow: two real epochs of `train` write every file of the documented workdir layout."""
    workdir = tmp_path / "run"
    cooldown = ["training.cooldown_epochs=1"]  # the second epoch's learning rate falls linearly to 0
    steady = [option for option in SMALL if not option.startswith("training.verbose")]  # the default progress
    experiment = load_experiment(TINY, steady + ["training.epochs=2", "training.checkpoint_every_steps=1"] + cooldown)
    result = training.train(experiment, workdir)
    # Under `nohup ... > train.log` (stdout not a terminal) the default writes no redrawn progress bar: one line
    # per epoch.
    out = capsys.readouterr().out
    assert "\u2501" not in out and "\r" not in out  # the bar's characters, and its carriage-return redraws
    assert out.count("Epoch 1/2") == 1 and out.count("Epoch 2/2") == 1
    assert len([line for line in out.splitlines() if "val_loss" in line]) == 2
    # history.csv keeps the update count; the progress line leaves it out (Keras would print "step: 2.0000"), and
    # any entry nothing measured this epoch (val_bleu between BLEU passes: NaN).
    assert "step:" not in out and "nan" not in out.lower()
    assert [path.name for path in result.checkpoints] == ["ckpt-0001.weights.h5", "ckpt-0002.weights.h5"]
    assert sorted(p.name for p in (workdir / "checkpoints").glob("step-*")) == [
        "step-00000002.weights.h5", "step-00000003.weights.h5", "step-00000004.weights.h5"]  # keeps the last 3
    rows = _rows(workdir / "history.csv")
    assert [row["epoch"] for row in rows] == ["1", "2"] and {"loss", "val_loss", "step"} <= set(rows[0])
    assert TransformerConfig.from_yaml(workdir / "model.yaml") == result.model_config
    assert yaml.safe_load((workdir / "experiment.yaml").read_text())["training"]["epochs"] == 2
    config, steps = result.model_config, [int(row["step"]) for row in rows]  # 2 batches an epoch: 2, 4
    noam = noam_learning_rates(config, experiment.training, steps)
    assert [float(row["learning_rate"]) for row in rows] == pytest.approx([noam[0], 0.0], rel=1e-5, abs=1e-12)
    assert (workdir / "data" / "synthetic.npz").is_file() and (workdir / "backup").is_dir()
    # An epoch checkpoint holds the weights only, and loads into a fresh model.
    fresh = build_model(result.model_config)
    load_weights(fresh, result.checkpoints[-1])
    for loaded, trained in zip(fresh.get_weights(), result.model.get_weights()):
        np.testing.assert_array_equal(loaded, trained)
    # Running the finished command again trains nothing more, says why, and keeps the history.
    with caplog.at_level("INFO", logger="keras_transformer"):
        again = training.train(load_experiment(TINY, SMALL + ["training.epochs=2"] + cooldown), workdir)
    assert again.history.get("loss", []) == [] and len(_rows(workdir / "history.csv")) == 2
    assert (f"Nothing to train: {workdir} already has 2 epoch(s), and training.epochs is 2; raise "
            "training.epochs to train further.") in caplog.messages
    assert not any(message.startswith("Trained 0 epoch(s)") for message in caplog.messages)


def _native_bfloat16_cpu():
    """Read independently of the code under test: any CPU with AVX512_BF16 or AMX-BF16 in its flags."""
    import subprocess
    flags = subprocess.run(["grep", "-m1", "^flags", "/proc/cpuinfo"], capture_output=True, text=True).stdout.split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


@pytest.mark.parametrize("requested, expected", [
    ("float32", "float32"), (False, "float32"), ("mixed_bfloat16", "mixed_bfloat16"),
    ("auto", None), (True, None),
])
def test_precision_resolution(requested, expected):
    import tensorflow as tf
    if expected is None:  # auto: float16 on GPUs; on CPUs bfloat16 only where the CPU has bfloat16 instructions
        if tf.config.list_physical_devices("GPU"):
            expected = "mixed_float16"
        else:
            expected = "mixed_bfloat16" if _native_bfloat16_cpu() else "float32"
    assert resolve_precision(requested) == expected


@pytest.mark.parametrize("cpuinfo, native", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile\n", True),  # Cooper Lake+, Zen 4
    ("flags\t\t: fpu avx2 amx_bf16 amx_tile\n", True),  # Sapphire Rapids
    ("flags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n", False),  # AVX-512 without bfloat16
    ("flags\t\t: fpu sse2 avx2 fma\nbugs\t\t: avx512_bf16\n", False),  # only the flags line counts
    ("", False),
])
def test_native_bfloat16_detection(cpuinfo, native):
    assert cpu_has_native_bfloat16(cpuinfo) is native


@pytest.mark.parametrize("cpuinfo, amx", [
    ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n", False),  # Zen 4, Cooper Lake
    ("flags\t\t: fpu avx512_bf16 amx_bf16 amx_tile amx_int8\n", True),  # Sapphire Rapids
    ("flags\t\t: fpu amx_tile amx_int8\n", False),  # tiles without their bfloat16 products
    ("flags\t\t: fpu avx2\nbugs\t\t: amx_bf16\n", False),  # only the flags line counts
    ("", False),
])
def test_amx_detection(cpuinfo, amx):
    assert cpu_has_amx(cpuinfo) is amx


@pytest.mark.slow
def test_mixed_bfloat16_trains_and_restores_the_global_policy(tmp_path):
    """Slow: a real `train` run under mixed bfloat16 (its own traced step) and the policy restored after."""
    import keras
    before = keras.config.dtype_policy().name
    result = training.train(load_experiment(TINY, SMALL + ["training.mixed_precision=mixed_bfloat16"]),
                            tmp_path / "run")
    assert result.model.dtype_policy.name == "mixed_bfloat16"
    assert result.model.get_layer("logits").compute_dtype == "float32"
    assert np.isfinite(result.history["loss"][-1])
    assert keras.config.dtype_policy().name == before


def test_a_resumed_epoch_s_header_counts_to_the_run_s_epochs(capsys):
    """`fit` trains a resumed epoch's rest alone (epochs=3, initial_epoch=2): the header still reads the run's
    total, "Epoch 3/8", not Keras' "Epoch 3/3"."""
    from keras_transformer.trainer.callbacks import ProgressLogger

    for logger, expected in ((ProgressLogger(epochs=8), "Epoch 3/8"), (ProgressLogger(), "Epoch 3/3")):
        logger.set_params({"verbose": 2, "epochs": 3, "steps": 4})
        logger.on_epoch_begin(2)
        assert capsys.readouterr().out.strip() == expected


# ------------------------------------------------------------------ one length limit: the model's
@pytest.mark.parametrize("data", [
    {"kind": "text", "train_source": "a.en", "train_target": "a.de"},
    {"kind": "text", "corpora": [{"name": "a", "source": "a.en", "target": "a.de", "weight": 1},
                                 {"name": "b", "source": "b.en", "target": "b.de", "weight": 3}]},
    {"kind": "tfds", "tfds_name": "wmt14_translate/de-en"}])
def test_the_datas_length_limit_is_the_models_and_never_more(data):
    """The data's limit left out is the model's (preset, model key or TransformerConfig's default), printed by
    --dry-run and read by the pipeline; lower is kept; higher is refused in one line naming both."""
    def experiment(model, **limit):
        return ExperimentConfig.from_dict({"model": model, "data": {**data, **limit}})
    for model, expected in (({"preset": "tiny", "max_length": 64}, 64), ({"preset": "tiny"}, 128),
                            ({"preset": "base"}, 256), ({"d_model": 64, "num_heads": 4}, 256)):
        followed = experiment(model)
        assert followed.data.max_length == followed.data.data_config().max_length == expected
        assert followed.resolved()["data"]["max_length"] == expected
        assert ExperimentConfig.from_dict(followed.to_dict()) == followed  # experiment.yaml holds the number
    assert experiment({"preset": "tiny", "max_length": 64}, max_length=40).data.data_config().max_length == 40
    with pytest.raises(ConfigError) as error:
        experiment({"preset": "tiny", "max_length": 64}, max_length=128)
    assert str(error.value).startswith("data.max_length=128 is more than model.max_length=64: ")
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="data: DataConfig.tokens_per_batch=200 is smaller than max_length=256"):
        experiment({"preset": "base"}, tokens_per_batch=200)  # the model's limit must fit in a batch too
    # a later --set of the model's limit moves the data's with it
    assert load_experiment(REPO / "configs" / "multi30k_en_de.yaml", ["data.max_length=null",
                                                                    "model.max_length=64"]).data.max_length == 64
    with pytest.raises(ConfigError, match="data.max_length=128 is more than model.max_length=64"):
        load_experiment(REPO / "configs" / "multi30k_en_de.yaml", ["model.max_length=64"])


def test_synthetic_sentences_longer_than_the_model_are_refused():
    with pytest.raises(ConfigError, match=r"data.max_length=40 makes synthetic sequences of 41 positions .* more "
                                          r"than model.max_length=32"):
        load_experiment(TINY, ["data.max_length=40"])
    assert load_experiment(TINY, ["data.max_length=31"]).data.synthetic_max_length == 31  # 32 positions: fits


@pytest.mark.slow
def test_pairs_longer_than_the_model_are_dropped_and_counted_and_never_reach_it(packed, tmp_path, caplog):
    """A model of 32 positions trains on Multi30k pairs, many longer, from train_source / train_target and from
    data.corpora: the pass's tally counts as dropped exactly the pairs whose longer side, tokenized by the run's
    vocabulary, needs more than 32 positions with its bos/eos, and no pair reaches the model (a longer one would
    stop the run in the positional encoding's slice, as docs/data.md's weighted example once did at 64). `pack`
    drops the same pairs. A fast test cannot: it takes a run's pipeline and a traced training step."""
    import re

    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.packed.data import ARRAYS_FILE, load_arrays
    folder, limit = packed[2], 32
    files = {"train_source": str(folder / "train.en"), "train_target": str(folder / "train.de")}
    sources = (folder / "train.en").read_text(encoding="utf-8").splitlines()
    targets = (folder / "train.de").read_text(encoding="utf-8").splitlines()

    def too_long(vocab):
        source_tokenizer, target_tokenizer = load_tokenizers(vocab)
        lengths = np.maximum(source_tokenizer.tokenize(sources).row_lengths().numpy(),
                             target_tokenizer.tokenize(targets).row_lengths().numpy())
        return int(np.sum(lengths + 1 > limit))  # + 1: eos after the source and the labels, bos before the target

    model = {"preset": "tiny", "num_layers": 1, "dropout": 0.0, "max_length": limit}
    caplog.set_level("INFO", logger="keras_transformer")
    for name, data in (("plain", files), ("corpora", {"corpora": [{"name": "multi30k", "source": files["train_source"],
                                                                  "target": files["train_target"]}]})):
        caplog.clear()
        result = training.train({"model": model, "data": {"kind": "text", "vocab_size": 600, "tokens_per_batch": 512,
                                                          **data},
                                 "training": {"epochs": 1, "verbose": 0, "tensorboard": False, "validation": False}},
                                tmp_path / name)
        assert result.model_config.max_length == limit and np.isfinite(result.history["loss"][-1])
        expected = too_long(tmp_path / name / "data" / "vocab")
        assert 50 < expected < len(sources) - 50  # many dropped, many kept: the limit matters here
        done = [message for message in caplog.messages if message.startswith("Pass 1 over the training data done")]
        assert len(done) == 1 and re.search(rf"; dropped {expected} over max length {limit}\b", done[0]), done
        resolved = yaml.safe_load((tmp_path / name / "experiment.yaml").read_text(encoding="utf-8"))
        assert resolved["data"]["max_length"] == limit
    counts = training.pack_arrays({"model": model, "data": {"kind": "text", "vocab_size": 600,
                                                            "tokens_per_batch": 512, **files}}, tmp_path / "packed")
    expected = too_long(tmp_path / "packed" / "data" / "vocab")
    assert counts["train_pairs"] == len(sources) - expected
    for side in load_arrays(tmp_path / "packed" / ARRAYS_FILE)["train"]:
        assert max(len(ids) for ids in side) + 1 <= limit
