"""Faults end in one line of ours and a documented exit status; impossible configs are refused before anything is
written, and a workdir that never trained takes another config. (A full disk and SIGTERM while training:
tests/test_crash_safety.py; a full disk while exporting: tests/test_export.py.)"""

import errno
import os
import pathlib
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf
from factories import SMALL_RUN, TINY_EXPERIMENT, make_workdir, tiny_config

from keras_transformer import cli, training
from keras_transformer.config import TransformerConfig
from keras_transformer.data.tokenizers import load_tokenizers
from keras_transformer.errors import EXIT_CODES, ConfigError, CorruptFileError, describe_fault
from keras_transformer.experiment import load_experiment
from keras_transformer.model import build_model
from keras_transformer.trainer import footprint
from keras_transformer.workdir.checkpoints import read_model_file

REPO = pathlib.Path(__file__).resolve().parents[1]


def _error_lines(text, command):
    return [line for line in text.splitlines() if line.startswith(f"keras-transformer {command}: error:")]


# ------------------------------------------------------------------ one line, one exit status
def test_help_lists_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "exit statuses:" in text
    for code, meaning in EXIT_CODES.items():
        assert f"  {code:<4} {meaning}" in text


@pytest.mark.parametrize("error, status, words", [
    (OSError(errno.ENOSPC, "No space left on device"), 4, ["out of disk space writing", "free there",
                                                            "nothing was lost", "run the same command again"]),
    (PermissionError(errno.EACCES, "Permission denied", "/data/runs/x"), 5, ["permission denied: /data/runs/x"]),
    (MemoryError(), 6, ["out of memory", "data.tokens_per_batch"]),
    (tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[1000000000,64]"), 6,
     ["out of memory (OOM when allocating tensor"]),
    (tf.errors.ResourceExhaustedError(None, None, "runs/x/variables/variables.data-00000-of-00001.tempstate; "
                                                  "No space left on device"), 4, ["out of disk space"]),
    (CorruptFileError("runs/x/model.yaml is not valid YAML"), 3, ["runs/x/model.yaml is not valid YAML"]),
])
def test_each_fault_ends_in_one_line_and_its_exit_status(tmp_path, monkeypatch, capsys, error, status, words):
    """Whatever raises it deep in a command, a fault is one line of ours (no traceback) and its status."""
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(training, "train_and_evaluate", fail)
    workdir = tmp_path / "run"
    assert cli.main(["train", "--config", str(TINY_EXPERIMENT), "--workdir", str(workdir)]) == status
    err = capsys.readouterr().err
    lines = _error_lines(err, "train")
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0]
    if status == 4:  # the error named no file: the command's folder is named, and the space left on its disk
        assert f"writing {workdir} (" in lines[0]


def test_sigterm_before_training_starts_ends_in_one_line_and_status_143(tmp_path, monkeypatch, capsys):
    """SIGTERM while a command is not training (learning a vocabulary, importing, translating): one line, 143."""
    def terminated(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)  # as `kill PID` does
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(training, "train_and_evaluate", terminated)
    assert cli.main(["train", "--config", str(TINY_EXPERIMENT), "--workdir", str(tmp_path / "run")]) == 143
    err = capsys.readouterr().err
    assert _error_lines(err, "train") == [
        "keras-transformer train: error: stopped by SIGTERM; run the same command again to resume."], err
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back


def test_an_unexpected_error_is_not_dressed_up_as_a_fault():
    assert describe_fault(KeyError("x")) == (None, 1)


def test_an_invalid_model_yaml_of_a_workdir_or_an_export_is_named(tmp_path, capsys):
    """Not YAML, in a training workdir or an export: the file is named, with what to do, and status 3."""
    workdir = tmp_path / "run"
    make_workdir(workdir, tiny_config(vocab_size=40), seed=0, vocab_files={"sentencepiece.model": b""})
    export = tmp_path / "export"  # the shipped export, linked file by file, with its model.yaml broken (and no
    # manifest: with one, the loader's size check names the changed file before the YAML is read)
    shutil.copytree(REPO / "saved_models" / "multi30k_en_de", export, copy_function=os.symlink,
                    ignore=shutil.ignore_patterns("manifest.json"))
    (export / "assets.extra" / "model.yaml").unlink()
    for folder in (workdir, export / "assets.extra"):
        (folder / "model.yaml").write_text("d_model: [64\nnum_heads: 4\n", encoding="utf-8")
    for model in (workdir, export):
        assert cli.main(["translate", "--model", str(model), "A man."]) == 3
        err = capsys.readouterr().err
        lines = _error_lines(err, "translate")
        assert len(lines) == 1 and "Traceback" not in err, err
        assert "model.yaml is not valid YAML" in lines[0] and "restore it" in lines[0]
    (workdir / "model.yaml").write_text("- a list\n", encoding="utf-8")
    with pytest.raises(CorruptFileError, match="does not hold a mapping"):
        read_model_file(workdir / "model.yaml")


def test_a_truncated_sentencepiece_model_is_named(multi30k_tokenizer_dir, tmp_path):
    vocab = tmp_path / "vocab"
    shutil.copytree(multi30k_tokenizer_dir, vocab)
    broken = next(path for path in vocab.rglob("sentencepiece.model"))
    broken.write_bytes(broken.read_bytes()[:broken.stat().st_size // 3])
    with pytest.raises(CorruptFileError) as error:
        load_tokenizers(vocab)
    assert str(broken) in str(error.value) and "truncated" in str(error.value)
    assert describe_fault(error.value)[1] == 3


# ------------------------------------------------------------------ impossible configs
@pytest.mark.parametrize("config", [
    TransformerConfig.preset("base", vocab_size=1000, num_layers=2),
    TransformerConfig.preset("small", vocab_size=300),
    tiny_config(vocab_size=50, tie_embeddings="none", source_vocab_size=40, target_vocab_size=60),
    tiny_config(vocab_size=50, tie_embeddings="decoder", source_vocab_size=40, target_vocab_size=60,
                position="learned", embedding_norm=True),
    tiny_config(vocab_size=50, position="relative", use_rezero=True, norm_first=True, key_dim=8, value_dim=12,
                num_encoder_layers=3),
    tiny_config(vocab_size=50, position="relative_bias", normalization="rms", gated_feed_forward=True, use_bias=False,
                norm_first=True, key_dim=6, tie_embeddings="embeddings", num_decoder_layers=3),
], ids=["base", "small", "untied", "tied-decoder-learned-positions-embedding-norm", "relative-rezero-prenorm-dk-dv",
        "t5"])
def test_the_parameter_count_from_the_config_is_keras_count(config):
    assert footprint.parameter_count(config) == build_model(config).count_params()


def test_training_memory_counts_weights_adam_and_gradients_by_the_variables_dtype():
    config = tiny_config(vocab_size=50)
    count = build_model(config).count_params()
    full = footprint.training_memory(config, 256, "float32")
    mixed = footprint.training_memory(config, 256, "mixed_bfloat16")
    assert full["weights"] == mixed["weights"] == 4 * count  # mixed policies keep float32 variables
    assert full["optimizer"] == 3 * 4 * count  # two moments and the gradients
    assert footprint.training_memory(config, 256, "bfloat16")["weights"] == 2 * count
    assert mixed["activations"] < full["activations"]
    assert footprint.training_memory(config, 512, "float32")["activations"] > full["activations"]


def test_an_impossible_model_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """`model.d_model: 1000000000` is refused by `train` and `--dry-run` with the estimate and the memory, before
    the workdir exists; a model that fits the machine passes, and `--dry-run` reports its estimate."""
    workdir = tmp_path / "run"
    huge = ["--set", "model.d_model=1000000000", "--set", "model.num_heads=1"]
    for extra in ([], ["--dry-run"]):
        assert cli.main(["train", "--config", str(TINY_EXPERIMENT), "--workdir", str(workdir), *huge, *extra]) == 2
        lines = _error_lines(capsys.readouterr().err, "train")
        assert len(lines) == 1 and "too large to train here" in lines[0], lines
        assert "G parameters; training needs about" in lines[0] and "of memory available" in lines[0]
    with pytest.raises(ConfigError, match="too large to train here"):
        training.train(load_experiment(TINY_EXPERIMENT, ["model.d_model=1000000000", "model.num_heads=1"]), workdir)
    assert not workdir.exists()

    assert cli.main(["train", "--config", str(TINY_EXPERIMENT), "--workdir", str(workdir), "--dry-run"]) == 0
    assert "parameters; training needs about" in capsys.readouterr().out
    # The check compares with the machine's memory: the tiny model, on a machine of 1 MiB.
    monkeypatch.setattr(footprint, "available_memory", lambda: 2**20)
    with pytest.raises(ConfigError, match=r"this machine has 1\.0 MiB of memory available"):
        load_experiment(TINY_EXPERIMENT).check_memory()
    monkeypatch.setenv(footprint.MEMORY_CHECK_VARIABLE, "0")
    load_experiment(TINY_EXPERIMENT).check_memory()


class _Stopped(Exception):
    pass


@pytest.mark.slow
def test_a_workdir_that_never_trained_takes_another_config(tmp_path, monkeypatch):
    """A run that wrote its config and data but stopped before any update was saved is replaced by the next
    command with another model and data config (model.yaml, experiment.yaml and the data built again); once a
    run has trained, another config is refused as before."""
    workdir = tmp_path / "run"

    def stop(*args, **kwargs):
        raise _Stopped()

    monkeypatch.setattr(training, "fit_experiment", stop)  # out of memory in the first step, say
    with pytest.raises(_Stopped):
        training.train(load_experiment(TINY_EXPERIMENT, SMALL_RUN), workdir)
    monkeypatch.undo()
    assert TransformerConfig.from_yaml(workdir / "model.yaml").d_ff == 256
    assert len(np.load(workdir / "data" / "synthetic.npz")["train_source"]) == 64

    changed = SMALL_RUN + ["model.d_ff=32", "data.train_examples=96"]
    result = training.train(load_experiment(TINY_EXPERIMENT, changed), workdir)
    assert result.model_config.d_ff == 32 and TransformerConfig.from_yaml(workdir / "model.yaml").d_ff == 32
    assert len(np.load(workdir / "data" / "synthetic.npz")["train_source"]) == 96
    assert sorted(path.name for path in workdir.iterdir() if path.name.startswith(".data")) == []
    with pytest.raises(ConfigError, match="holds a run with another model or data config"):
        training.train(load_experiment(TINY_EXPERIMENT, changed + ["model.d_ff=16"]), workdir)
