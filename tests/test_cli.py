"""The keras-transformer command: help, errors that name the problem, the subcommands' wiring, resume after SIGKILL."""

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import sacrebleu

from keras_transformer import cli
from keras_transformer.decoding.options import DecodeOptions

# Its module fixtures are expensive: `make test` (--dist loadgroup) runs the whole file on one worker, so they
# are built once.
pytestmark = pytest.mark.xdist_group("test_cli")

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "tiny_copy.yaml"
SUBCOMMANDS = ("train", "evaluate", "translate", "export", "average", "pack", "train-packed", "distill-targets",
               "serve", "verify")


def test_help_lists_every_subcommand_with_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in text
    assert "keras-transformer train --config configs/tiny_copy.yaml" in text


def test_version_prints_the_package_version_which_setup_cfg_reads(capsys):
    import configparser

    import keras_transformer

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"keras-transformer {keras_transformer.__version__}\n"
    metadata = configparser.ConfigParser()
    metadata.read(REPO / "setup.cfg")
    assert metadata["metadata"]["version"] == "attr: keras_transformer.__version__"
    # "keras-transformer" on PyPI is another project; ours installs the same command under its own name.
    assert metadata["metadata"]["name"] == "keras-transformer-mt"
    assert "keras-transformer = keras_transformer.cli:main" in metadata["options.entry_points"]["console_scripts"]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(capsys, name):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage: keras-transformer " + name in capsys.readouterr().out


def test_refusals_that_need_no_model_answer_before_tensorflow_loads(tmp_path):
    """A refusal that needs no model answers at once, without TensorFlow imported (seconds): `import` into a
    non-empty folder, from a folder without config.json or of a family it does not import; `evaluate` with
    tokenized references but no language; `translate` with a workdir trained on synthetic data (no vocabulary)."""
    source, used, other, synthetic = tmp_path / "opus", tmp_path / "used", tmp_path / "bert", tmp_path / "copy"
    for folder, model_type in ((source, "marian"), (other, "bert")):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
        (folder / "model.safetensors").write_bytes(b"")
    used.mkdir()
    (used / "notes.txt").write_text("mine\n", encoding="utf-8")
    (synthetic / "checkpoints").mkdir(parents=True)
    (synthetic / "model.yaml").write_text("d_model: 64\n", encoding="utf-8")
    (synthetic / "checkpoints" / "ckpt-0001.weights.h5").write_bytes(b"")
    (tmp_path / "src.txt").write_text("a\n", encoding="utf-8")
    cases = [["import", str(source), "--workdir", str(used)],
             ["import", str(tmp_path), "--workdir", str(tmp_path / "new")],
             ["import", str(other), "--workdir", str(tmp_path / "new")],
             ["evaluate", "--model", str(synthetic), "--source", str(tmp_path / "src.txt"), "--reference",
              str(tmp_path / "src.txt"), "--tokenized-reference", str(tmp_path / "src.txt")],
             ["translate", "--model", str(synthetic), "a man"]]
    code = ("import sys, json; from keras_transformer import cli; "
            f"statuses = [cli.main(case) for case in {cases!r}]; "
            "print(json.dumps([statuses, 'tensorflow' in sys.modules, 'keras' in sys.modules]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert json.loads(run.stdout.splitlines()[-1]) == [[2] * 5, False, False], run.stderr[-3000:]
    assert run.stderr.splitlines() == [
        f"keras-transformer import: error: {used} already exists and is not empty; import into a new folder.",
        f"keras-transformer import: error: {tmp_path / 'config.json'} is missing: a Hugging Face checkpoint folder "
        "holds config.json, the weights and the tokenizer's files (save_pretrained writes them).",
        f"keras-transformer import: error: {other / 'config.json'}: model_type 'bert' is not a family "
        "keras-transformer imports; the supported families are: m2m_100, marian, mbart, t5.",
        "keras-transformer evaluate: error: --tokenized-reference (the Multi30k protocol) needs --lang, the target "
        "language.",
        f"keras-transformer translate: error: {synthetic} has no vocabulary (data/vocab): it was trained on "
        "synthetic data, which has no text to translate."], run.stderr
    assert sorted(os.listdir(used)) == ["notes.txt"] and not (tmp_path / "new").exists()


def test_verify_help_gives_the_exit_statuses_verify_returns(tmp_path, capsys):
    """`verify --help` lists each outcome with a status: an export whose files match, one with a damaged file, one
    without a manifest and a missing folder each return the status the help gives them."""
    import re

    from keras_transformer.exports.folder import write_manifest

    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    stated = " ".join(capsys.readouterr().out.split())
    statuses = {int(status): what for status, what in re.findall(r"(\d+) ([^;]+)", stated.split("exit status:")[1])}
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"graph")
    write_manifest(export)
    outcomes = {"every file matches": export}
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "saved_model.pb").write_bytes(b"graph")
    write_manifest(tmp_path / "damaged")
    (tmp_path / "damaged" / "saved_model.pb").write_bytes(b"Graph")
    outcomes["a file is missing or damaged"] = tmp_path / "damaged"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "saved_model.pb").write_bytes(b"graph")
    outcomes["the export has no manifest"] = tmp_path / "old"
    outcomes["no such export"] = tmp_path / "missing"
    for what, folder in outcomes.items():
        status = cli.main(["verify", str(folder)])
        assert what in statuses.get(status, ""), (what, status, stated)


def test_train_requires_config_and_workdir(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--workdir", "x"])
    assert exit_info.value.code == 2
    assert "--config" in capsys.readouterr().err


@pytest.mark.parametrize("command, flag, value, message", [
    (["translate", "--model", "m", "a"], "--batch-size", "0", "must be at least 1, got 0"),  # was a range() error
    (["evaluate", "--model", "m", "--source", "s", "--reference", "r"], "--batch-size", "-1", "at least 1"),  # crashed
    (["translate", "--model", "m", "a"], "--average", "0", "at least 1"),  # was ignored: the last checkpoint alone
    (["translate", "--model", "m", "a"], "--max-extra", "-5", "at least 0"),  # cut every translation short
    (["translate", "--model", "m", "a"], "--beam-size", "two", "expected an integer, got 'two'"),
    (["average", "--workdir", "w"], "--last", "0", "at least 1"),
    (["export", "--workdir", "w", "--out", "o"], "--beam-size", "0", "at least 1"),
    (["translate", "--model", "m", "a"], "--alpha", "nan", "expected a finite number, got 'nan'"),  # printed ""
    (["evaluate", "--model", "m", "--source", "s", "--reference", "r"], "--alpha", "inf", "finite number"),
    (["translate", "--model", "m", "a"], "--alpha", "-0.5", "must be at least 0, got -0.5"),
    (["export", "--workdir", "w", "--out", "o"], "--alpha", "NaN", "finite number"),  # baked into the graph
    (["translate", "--model", "m", "a"], "--alpha", "much", "expected a number, got 'much'"),
])
def test_counts_out_of_range_exit_2_naming_the_flag(capsys, command, flag, value, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(command + [flag, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {flag}" in error and message in error


def test_alpha_zero_and_other_finite_values_parse():
    for value, expected in (("0", 0.0), ("0.6", 0.6), ("1e-1", 0.1)):
        assert cli.build_parser().parse_args(["translate", "--model", "m", "--alpha", value, "a"]).alpha == expected


def test_early_exit_flag_reaches_the_translator_and_the_export(monkeypatch, capsys, tmp_path):
    from keras_transformer import inference  # noqa: F401 (imported before the loader is patched: it binds it)
    from keras_transformer.engines import loader
    from keras_transformer.exports import savedmodel
    monkeypatch.chdir(tmp_path)
    for folder in ("m", "w"):  # model folders as far as the checks before TensorFlow can tell
        (tmp_path / folder / "data" / "vocab").mkdir(parents=True)
        (tmp_path / folder / "model.yaml").write_text("d_model: 64\n", encoding="utf-8")
    seen = []
    nothing = type("Translator", (), {"translate_lines": lambda self, chunk, batch_size: [],
                                      "options": DecodeOptions()})()
    monkeypatch.setattr(loader, "load_translator", lambda model, checkpoint, average, checked, **options: seen.append(
        options["early_exit"]) or nothing)
    monkeypatch.setattr(savedmodel, "export", lambda workdir, out, **options: seen.append(options.get("early_exit"))
                        or out)
    for argv in (["translate", "--model", "m", "a"], ["translate", "--model", "m", "--early-exit", "a"],
                 ["export", "--workdir", "w", "--out", "o"],
                 ["export", "--workdir", "w", "--out", "o", "--early-exit"]):
        assert cli.main(argv) == 0
    assert seen == [None, True, None, True]  # None: the model config's


def test_decoding_arguments_reach_translate_evaluate_and_export_as_options(monkeypatch, capsys, tmp_path):
    """One set of decoding arguments for the three commands: the sampling ones (alone, they mean --strategy sample)
    arrive as DecodeOptions fields, and a combination that cannot go together is refused before TensorFlow loads."""
    from keras_transformer import inference
    from keras_transformer.engines import loader
    from keras_transformer.exports import savedmodel
    monkeypatch.chdir(tmp_path)
    for folder in ("m", "w"):
        (tmp_path / folder / "data" / "vocab").mkdir(parents=True)
        (tmp_path / folder / "model.yaml").write_text("d_model: 64\n", encoding="utf-8")
    (tmp_path / "s.txt").write_text("a\n", encoding="utf-8")
    seen = []
    nothing = type("Translator", (), {"translate_lines": lambda self, chunk, batch_size: [],
                                      "n_best_detailed": lambda self, chunk, batch_size: [],
                                      "options": DecodeOptions()})()
    monkeypatch.setattr(loader, "load_translator", lambda model, checkpoint, average, checked, **options: seen.append(
        {k: v for k, v in options.items() if v is not None}) or nothing)
    monkeypatch.setattr(inference, "evaluate", lambda *args, **options: seen.append(
        {k: v for k, v in options.items() if k in ("strategy", "top_k", "top_p", "temperature", "seed")
         and v is not None}) or ({}, {}))
    monkeypatch.setattr(savedmodel, "export", lambda workdir, out, **options: seen.append(
        {k: v for k, v in options.items() if k in ("strategy", "top_k", "seed")}) or out)
    sampling = ["--sampling-topk", "5", "--sampling-topp", "0.9", "--sampling-temperature", "0.7", "--seed", "3"]
    assert cli.main(["translate", "--model", "m", *sampling, "a"]) == 0
    assert cli.main(["evaluate", "--model", "m", "--source", "s.txt", "--reference", "s.txt", "--json",
                     "--strategy", "sample", "--seed", "4"]) == 0
    assert cli.main(["export", "--workdir", "w", "--out", "o", "--strategy", "sample", "--sampling-topk", "5"]) == 0
    assert seen == [{"top_k": 5, "top_p": 0.9, "temperature": 0.7, "seed": 3},
                    {"strategy": "sample", "seed": 4}, {"strategy": "sample", "top_k": 5}]
    capsys.readouterr()
    assert cli.main(["translate", "--model", "m", "--strategy", "beam", "--sampling-topp", "0.9", "a"]) == 2
    assert "--sampling-topp belongs to strategy 'sample' and --strategy is 'beam'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # argparse's own refusal
        cli.main(["translate", "--model", "m", "--sampling-topp", "1.5", "a"])
    assert stopped.value.code == 2 and "--sampling-topp: must be in (0, 1]" in capsys.readouterr().err
    assert len(seen) == 3  # refused before any loading
    # Sampling without --seed: a fresh seed each time, printed so that the samples can be drawn again.
    drawn = []
    for _ in range(2):
        assert cli.main(["translate", "--model", "m", "--strategy", "sample", "--n-best", "2", "a"]) == 0
        drawn.append(seen[-1]["seed"])
        assert f"Sampling with seed {drawn[-1]} (--seed {drawn[-1]} " in capsys.readouterr().err
        assert seen[-1]["n_best"] == 2
    assert drawn[0] != drawn[1]  # one chance in 2**31 to fail
    assert cli.main(["translate", "--model", "m", "--beam-size", "2", "a"]) == 0  # no sampling: no seed drawn
    assert "seed" not in seen[-1] and "Sampling" not in capsys.readouterr().err


def test_packed_commands_refuse_counts_out_of_range(capsys):
    for argv, flag in ((["train-packed", "w", "--average-last", "-1"], "--average-last"),  # 0: no average
                       (["train-packed", "w", "--cooldown-epochs", "-1"], "--cooldown-epochs"),
                       (["train-packed", "w", "--evaluate", "s", "r", "--alpha", "nan"], "--alpha"),
                       (["train-packed", "w", "--evaluate", "s", "r", "--sampling-topp", "1.5"], "--sampling-topp"),
                       (["distill-targets", "w", "--member", "a", "b", "--top-k", "0"], "--top-k")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_bad_key_exits_2_and_names_it(tmp_path, capsys):
    status = cli.main(["train", "--config", str(TINY), "--set", "training.epochz=3", "--workdir", str(tmp_path)])
    assert status == 2
    assert "Unknown config key 'training.epochz'" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()


def test_dry_run_shows_the_overrides_later_ones_winning(tmp_path, capsys):
    import yaml
    status = cli.main(["train", "--config", str(TINY), "--set", "training.epochs=3", "--set", "model.dropout=0.2",
                       "--set", "training.epochs=4", "--workdir", str(tmp_path), "--dry-run"])
    assert status == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["training"]["epochs"] == 4 and resolved["model"]["dropout"] == 0.2


def test_dry_run_expands_the_preset_and_fills_in_every_default(tmp_path, capsys):
    """`preset: tiny` is printed as the sizes it stands for, and every key of every section is there with the value
    train uses (the model's vocabulary is the synthetic task's); printed back into --dry-run, it gives itself."""
    import dataclasses

    import yaml

    from keras_transformer.config import PRESETS, TransformerConfig
    from keras_transformer.decoding import DecodeOptions
    from keras_transformer.experiment import TrainingSection
    assert cli.main(["train", "--config", str(TINY), "--workdir", str(tmp_path), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    resolved = yaml.safe_load(printed)
    model = resolved["model"]
    assert "preset" not in model and list(model) == [f.name for f in dataclasses.fields(TransformerConfig)]
    assert {key: model[key] for key in PRESETS["tiny"] if key not in ("dropout", "max_length")} \
        == {"num_layers": 2, "d_model": 64, "num_heads": 4, "d_ff": 256}
    # configs/tiny_copy.yaml's own values win over the preset's; the vocabulary is the data's
    assert (model["dropout"], model["max_length"], model["vocab_size"]) == (0.0, 32, 24)
    assert (resolved["training"]["warmup_steps"], resolved["training"]["label_smoothing"]) == (100, 0.0)
    assert "# model: preset 'tiny' expanded" in printed
    assert resolved["data"] == {"kind": "synthetic", "vocab_size": 24, "max_length": 10, "seed": 1234,
                                "task": "copy", "train_examples": 2048, "val_examples": 256, "min_length": 3,
                                "batch_size": 64, "shuffle": True}
    assert list(resolved["training"]) == [f.name for f in dataclasses.fields(TrainingSection)]
    assert resolved["training"]["steps_per_execution"] == 1 and resolved["training"]["clipnorm"] == 1.0
    assert list(resolved["decoding"]) == [f.name for f in dataclasses.fields(DecodeOptions)] + ["batch_size",
                                                                                               "average_last"]
    assert resolved["decoding"]["max_extra"] == 50  # DecodeOptions' default
    again = tmp_path / "resolved.yaml"
    again.write_text(printed, encoding="utf-8")
    assert cli.main(["train", "--config", str(again), "--workdir", str(tmp_path), "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == resolved


def _text_config(folder, lines):
    """A text experiment over files of the given line counts, `{key: lines}` (train_source.gz is gzip)."""
    import gzip

    import yaml
    data = {"kind": "text", "vocab_size": 100}
    for key, count in lines.items():
        path = folder / (key + (".gz" if key == "train_source" else ""))
        text = "".join(f"sentence {i}\n" for i in range(count)).encode()
        path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
        data[key] = str(path)
    config = folder / "text.yaml"
    config.write_text(yaml.safe_dump({"model": {"preset": "tiny"}, "data": data}), encoding="utf-8")
    return config


@pytest.mark.parametrize("output_bias", [False, True])
def test_dry_run_counts_the_parameters_of_the_model_train_builds(tmp_path, capsys, output_bias):
    """The count `--dry-run` prints is `count_params()` of the model built from the resolved config (a bias on the
    logits, Marian's final_logits_bias, included)."""
    import re

    import yaml

    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model

    assert cli.main(["train", "--config", str(TINY), "--set", f"model.output_bias={str(output_bias).lower()}",
                     "--workdir", str(tmp_path), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    counted = int(re.search(r"# model: (\d+) parameters;", printed)[1])
    config = TransformerConfig.from_dict(yaml.safe_load(printed)["model"])
    assert config.output_bias is output_bias and counted == build_model(config).count_params()


def test_dry_run_checks_that_each_split_s_files_have_as_many_lines(tmp_path, capsys):
    import yaml
    lines = {"train_source": 30, "train_target": 30, "valid_source": 4, "valid_target": 4, "test_source": 5,
             "test_target": 5, "test_tokenized_target": 5}
    config = _text_config(tmp_path, lines)
    assert cli.main(["train", "--config", str(config), "--workdir", str(tmp_path / "run"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "# data files: train 30 lines, valid 4 lines, test 5 lines" in printed
    data = yaml.safe_load(printed)["data"]
    # DataConfig's, training's
    assert (data["tokens_per_batch"], data["model_type"], data["seed"]) == (4096, "bpe", 1234)
    assert data["tokenizer_dir"] == str(tmp_path / "run" / "data" / "vocab")  # where train keeps it
    for key, other in (("train_target", "train_source"), ("valid_target", "valid_source"),
                       ("test_tokenized_target", "test_source")):
        config = _text_config(tmp_path, {**lines, key: lines[key] - 1})
        assert cli.main(["train", "--config", str(config), "--workdir", str(tmp_path / "run"), "--dry-run"]) == 2
        error = capsys.readouterr().err
        assert (f"data.{other} ({tmp_path / other}{'.gz' if other == 'train_source' else ''}) has {lines[key]} "
                f"lines but data.{key} ({tmp_path / key}) has {lines[key] - 1}") in error
    assert not (tmp_path / "run").exists()


def test_train_help_points_to_the_config_reference(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "docs/config.md lists every key" in text and "keras_transformer/training.py" not in text
    assert (REPO / "docs" / "config.md").is_file()


def test_export_of_a_workdir_without_checkpoints_fails_clearly(tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    status = cli.main(["export", "--workdir", str(missing), "--out", str(tmp_path / "out")])
    assert status == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "out" / "saved_model.pb").exists()


@pytest.fixture(scope="module")
def tiny_workdir(tmp_path_factory):
    """A workdir as `train` writes it (model.yaml, data/vocab, two checkpoints), without training."""
    from factories import make_workdir, tiny_config

    from keras_transformer.data.tokenizers import train_tokenizers

    workdir = tmp_path_factory.mktemp("workdir")
    tokenizers = train_tokenizers(["a man rides a bike", "two dogs play"] * 20, ["ein mann", "zwei hunde"] * 20,
                                  vocab_size=300)
    make_workdir(workdir, tiny_config(vocab_size=tokenizers[0].vocab_size, max_length=32), epochs=(1, 2),
                 tokenizers=tokenizers)
    return workdir


_LOADED = {}


@pytest.fixture
def load_once():
    """Has `translate` and `evaluate` load each (model, checkpoint, average, decoding options) translator once
    for the module (the first call loads it for real), for the tests whose point is what the command does with
    the translations: every load builds the model and traces its search again (seconds). Its own MonkeyPatch,
    so that a test's `monkeypatch.undo()` leaves it in place."""
    from keras_transformer import inference
    from keras_transformer.engines import loader

    real = loader.load_translator

    def load_translator(model, checkpoint=None, average=None, **options):
        paths = tuple(map(str, model)) if isinstance(model, (list, tuple)) else str(model)
        key = (paths, checkpoint, average, tuple(sorted((k, v) for k, v in options.items() if v is not None)))
        if key not in _LOADED:
            _LOADED[key] = real(model, checkpoint, average, **options)
        return _LOADED[key]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inference, "load_translator", load_translator)  # evaluate's
        patch.setattr(loader, "load_translator", load_translator)  # translate's and serve's
        yield


def test_average_writes_the_mean_of_the_last_checkpoints(tiny_workdir, capsys):
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model

    assert cli.main(["average", "--workdir", str(tiny_workdir), "--last", "2"]) == 0
    assert "Averaged 2 checkpoint(s)" in capsys.readouterr().out
    config = TransformerConfig.from_yaml(tiny_workdir / "model.yaml")
    models = [build_model(config) for _ in range(3)]
    for model, name in zip(models, ("ckpt-0001", "ckpt-0002")):
        model.load_weights(str(tiny_workdir / "checkpoints" / f"{name}.weights.h5"))
    models[2].load_weights(str(tiny_workdir / "averaged.weights.h5"))
    for a, b, mean in zip(*(model.get_weights() for model in models)):
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-6, atol=1e-7)


def test_average_takes_weights_files_from_anywhere(tiny_workdir, tmp_path, capsys):
    """--checkpoint files (e.g. an average and that of a continued run elsewhere) instead of the last N."""
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model

    first, second = (tiny_workdir / "checkpoints" / f"ckpt-000{n}.weights.h5" for n in (1, 2))
    elsewhere = tmp_path / "continued.weights.h5"
    elsewhere.write_bytes(second.read_bytes())
    output = tmp_path / "mean.weights.h5"
    assert cli.main(["average", "--workdir", str(tiny_workdir), "--checkpoint", str(first), "--checkpoint",
                     str(elsewhere), "--output", str(output)]) == 0
    assert "Averaged 2 checkpoint(s) (ckpt-0001.weights.h5 .. continued.weights.h5)" in capsys.readouterr().out
    config = TransformerConfig.from_yaml(tiny_workdir / "model.yaml")
    models = [build_model(config) for _ in range(3)]
    for model, path in zip(models, (first, second, output)):
        model.load_weights(str(path))
    for a, b, mean in zip(*(model.get_weights() for model in models)):
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-6, atol=1e-7)
    missing = tmp_path / "nope.weights.h5"
    assert cli.main(["average", "--workdir", str(tiny_workdir), "--checkpoint", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert cli.main(["average", "--workdir", str(tiny_workdir), "--last", "2", "--checkpoint", str(first)]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.slow  # examples/tune_alpha.py decodes the workdir once per alpha
def test_tune_alpha_scores_each_alpha_and_marks_the_best(tiny_workdir, tmp_path, load_once):
    """examples/tune_alpha.py decodes a workdir once per alpha, scores each against the references and marks the
    best one."""
    import importlib.util

    from keras_transformer import evaluation
    spec = importlib.util.spec_from_file_location("tune_alpha", REPO / "examples" / "tune_alpha.py")
    tune_alpha = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune_alpha)
    (tmp_path / "src.txt").write_text("a man rides a bike\ntwo dogs play\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("ein mann\nzwei hunde\n", encoding="utf-8")
    rows = tune_alpha.tune(str(tiny_workdir), str(tmp_path / "src.txt"), str(tmp_path / "ref.txt"), [0.0, 3.0],
                           beam_size=2, output_prefix=str(tmp_path / "hyp-"))
    assert [row["alpha"] for row in rows] == [0.0, 3.0]
    for row in rows:  # each row scores the translations it wrote
        hypotheses = evaluation.read_lines(tmp_path / f"hyp-{row['alpha']}.txt")
        expected = evaluation.evaluate_translations(hypotheses, ["ein mann", "zwei hunde"])
        assert row["bleu"] == pytest.approx(expected["bleu"], abs=0.01)
        assert row["length_ratio"] == pytest.approx(expected["length_ratio"], abs=1e-4)
    made_up = [{"alpha": 0.6, "bleu": 30.0, "bleu_lowercase": 31.0, "length_ratio": 0.95},
               {"alpha": 1.0, "bleu": 30.5, "bleu_lowercase": 31.2, "length_ratio": 0.99}]
    lines = tune_alpha.table(made_up).splitlines()
    assert lines[0] == "| alpha | bleu | bleu_lowercase | length_ratio |"
    assert lines[2] == "| 0.6 | 30 | 31 | 0.9500 |" and lines[3] == "| 1 | **30.5** | 31.2 | 0.9900 |"


@pytest.mark.slow  # the bench script runs its timed rounds (6 CPU s)
def test_translate_throughput_bench_times_what_translate_prints(tiny_workdir, tmp_path, capsys, load_once):
    """bench/translate_throughput.py times the translations `translate` prints: the same lines, and a table of
    sentences per second."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("translate_throughput", REPO / "bench" / "translate_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    (tmp_path / "src.txt").write_text("a man rides a bike\ntwo dogs play\na man\n", encoding="utf-8")
    assert bench.main([str(tiny_workdir), "--source", str(tmp_path / "src.txt"), "--sentences", "2",
                       "--beam-size", "2", "--max-extra", "3", "--repeats", "2", "--output",
                       str(tmp_path / "hyp.txt")]) == 0
    table = dict(line.split("  ", 1) for line in capsys.readouterr().out.splitlines())
    assert table["sentences, batch size, beam, alpha, max extra"].strip() == "2, 64, 2, 1, 3"
    assert table["models"].strip() == "1"
    assert len(table["passes (s)"].split(",")) == 2
    assert cli.main(["translate", "--model", str(tiny_workdir), "--beam-size", "2", "--alpha", "1.0",
                     "--max-extra", "3", "a man rides a bike", "two dogs play"]) == 0
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == capsys.readouterr().out.splitlines()


def test_translate_names_a_missing_checkpoint(tiny_workdir, capsys):
    missing = tiny_workdir / "checkpoints" / "ckpt-0009.weights.h5"
    status = cli.main(["translate", "--model", str(tiny_workdir), "--checkpoint", str(missing), "a man"])
    assert status == 2
    assert str(missing) in capsys.readouterr().err


def test_translate_names_a_corrupt_checkpoint(tiny_workdir, tmp_path, capsys):
    corrupt = tmp_path / "ckpt-0003.weights.h5"
    corrupt.write_bytes(b"\x89HDF\r\n\x1a\n broken")
    status = cli.main(["translate", "--model", str(tiny_workdir), "--checkpoint", str(corrupt), "a man"])
    assert status == 2
    assert str(corrupt) in capsys.readouterr().err


@pytest.mark.slow  # translate and evaluate decode a workdir end to end (5 CPU s)
def test_translate_and_evaluate_run_on_a_workdir(tiny_workdir, tmp_path, capsys, load_once):
    """`translate` and `evaluate` on a training workdir: one output line per input, and a BLEU report against the
    references."""
    import json
    assert cli.main(["translate", "--model", str(tiny_workdir), "--beam-size", "1", "--max-extra", "3",
                     "a man rides a bike", "two dogs play"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    (tmp_path / "src.txt").write_text("a man rides a bike\ntwo dogs play\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("ein mann\nzwei hunde\n", encoding="utf-8")
    command = ["evaluate", "--model", str(tiny_workdir), "--source", str(tmp_path / "src.txt"), "--reference",
               str(tmp_path / "ref.txt"), "--beam-size", "1", "--max-extra", "3", "--output", str(tmp_path / "hyp.txt")]
    assert cli.main(command + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(report) == {"bleu", "bleu_lowercase", "chrf", "length_ratio", "signatures", "models", "decoding",
                           "sentences", "seconds"} and 0 <= report["bleu"] <= 100
    assert report["signatures"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    hypotheses = (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()
    assert report["chrf"] == round(sacrebleu.CHRF().corpus_score(hypotheses, [["ein mann", "zwei hunde"]]).score, 2)
    assert report["signatures"]["chrf"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
    assert report["models"] == [{"model": str(tiny_workdir),
                                 "weights": [str(tiny_workdir / "checkpoints" / "ckpt-0002.weights.h5")]}]
    assert report["decoding"]["beam_size"] == 1 and report["decoding"]["max_extra"] == 3
    assert report["sentences"] == 2 and report["seconds"] >= 0
    assert len((tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()) == 2
    assert cli.main(command + ["--average", "2"]) == 0  # the readable report: what it takes to reproduce a score
    text = capsys.readouterr().out
    averaged = (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()  # the average's own translations
    bleu = sacrebleu.BLEU().corpus_score(averaged, [["ein mann", "zwei hunde"]]).score
    chrf = sacrebleu.CHRF().corpus_score(averaged, [["ein mann", "zwei hunde"]]).score
    for expected in (f"bleu            {bleu:.2f}  nrefs:1|case:mixed", "bleu_lowercase ",
                     f"chrf            {chrf:.2f}  nrefs:1|case:mixed|eff:yes|nc:6",
                     f"{tiny_workdir}: average of ckpt-0001.weights.h5, ckpt-0002.weights.h5", "beam_size 1",
                     "max_extra 3", "sentences       2 in "):
        assert expected in text, (expected, text)


@pytest.mark.slow  # a workdir decoded twice, best and n-best (6 CPU s)
def test_translate_n_best_prints_each_sentence_s_hypotheses_best_first(tiny_workdir, capsys, load_once):
    """`translate --n-best 2` prints each sentence's hypotheses as index, score, mean log-probability and text,
    best first, the first of each the translation `translate` prints."""
    options = ["translate", "--model", str(tiny_workdir), "--beam-size", "3", "--max-extra", "3"]
    sentences = ["a man rides a bike", "two dogs play"]
    assert cli.main(options + sentences) == 0
    best = capsys.readouterr().out.splitlines()
    assert cli.main(options + ["--n-best", "2"] + sentences) == 0
    # The translation is the rest of the line: an under-trained model may emit tabs in it (a CI run's did).
    rows = [line.split("\t", 3) for line in capsys.readouterr().out.splitlines()]
    assert [row[0] for row in rows] == ["0", "0", "1", "1"]
    assert [rows[0][3], rows[2][3]] == best  # the first of each sentence's list is its translation
    assert float(rows[0][1]) >= float(rows[1][1]) and float(rows[2][1]) >= float(rows[3][1])
    # the mean log-probability beside the score: those of n_best_detailed, both negative
    translator = next(t for key, t in _LOADED.items() if {("beam_size", 3), ("n_best", 2)} <= set(key[3]))
    expected = [t for row in translator.n_best_detailed(sentences) for t in row[:2]]
    assert [(row[1], row[2]) for row in rows] == [(f"{t.score:.4f}", f"{t.mean_log_prob:.4f}") for t in expected]
    assert all(float(row[2]) < 0 for row in rows)


@pytest.mark.slow  # an imported model decoded four ways (4 CPU s)
def test_a_strategys_own_flag_chooses_it_on_a_greedy_default_and_translate_says_how_it_decodes(tiny_workdir,
                                                                                               tmp_path, capsys):
    """On a model that decodes greedily by default (an imported checkpoint without num_beams), --beam-size and
    --alpha mean beam search, --n-best with them too; translate says on stderr which decoding it used, and a
    refusal names the flags given."""
    import shutil

    from keras_transformer.workdir.checkpoints import read_model_file, write_model_file

    greedy = tmp_path / "greedy"
    shutil.copytree(tiny_workdir, greedy)
    write_model_file(greedy / "model.yaml", read_model_file(greedy / "model.yaml")[0],
                     DecodeOptions(strategy="greedy", max_extra=3))
    sentences = ["a man rides a bike", "two dogs play"]
    assert cli.main(["translate", "--model", str(greedy), "--beam-size", "3", "--alpha", "0", *sentences]) == 0
    printed = capsys.readouterr()
    assert printed.err.splitlines() == ["Decoding: beam: beam_size 3, alpha 0.0, max_extra 3"]
    assert cli.main(["translate", "--model", str(greedy), "--n-best", "3", "--beam-size", "3", "--alpha", "0",
                     *sentences]) == 0
    rows = [line.split("\t", 3) for line in capsys.readouterr().out.splitlines()]
    assert [row[0] for row in rows] == ["0", "0", "0", "1", "1", "1"]  # beam search's 3 hypotheses per sentence
    assert [rows[0][3], rows[3][3]] == printed.out.splitlines()  # the first is the translation
    assert cli.main(["translate", "--model", str(greedy), *sentences]) == 0
    assert capsys.readouterr().err.splitlines() == ["Decoding: greedy: max_extra 3"]
    assert cli.main(["translate", "--model", str(greedy), "--n-best", "3", *sentences]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "keras-transformer translate: error: --n-best must be 1 with strategy 'greedy' (one hypothesis), got 3: "
        "beam search returns several (strategy 'beam', --beam-size >= 3)."]
    assert cli.main(["translate", "--model", str(greedy), "--strategy", "greedy", "--alpha", "0", *sentences]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "keras-transformer translate: error: --alpha belongs to strategy 'beam' and --strategy is 'greedy': give "
        "one or the other."]


def test_translate_reads_stdin_bytes_that_are_not_utf8_as_replacement_characters(tiny_workdir, capsys,
                                                                                    monkeypatch, load_once):
    """Whatever error handler the locale gives stdin (strict here), bad bytes translate as U+FFFD, like bad bytes
    in an argument (which Python hands over as lone surrogates)."""
    import io
    raw = b"a man \xff rides\r\ntwo dogs \xc3\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="strict"))
    options = ["translate", "--model", str(tiny_workdir), "--beam-size", "1", "--max-extra", "3"]
    assert cli.main(options) == 0
    from_stdin = capsys.readouterr().out
    assert cli.main(options + ["a man \ufffd rides", b"two dogs \xc3".decode("utf-8", "surrogateescape")]) == 0
    assert capsys.readouterr().out == from_stdin and len(from_stdin.splitlines()) == 2


@pytest.mark.slow  # a stream of several chunks decoded (6 CPU s)
def test_translate_streams_stdin_in_chunks_with_the_output_of_one_call(tiny_workdir, capsys, monkeypatch,
                                                                      load_once):
    """stdin is translated a chunk (32 batches) at a time: the first chunk's lines are out before the rest of stdin is
    read, and the lines are those of one call on all the sentences (a translation never depends on its batch)."""
    import io
    sentences = [f"{'a man' if i % 3 else 'two dogs'} {'rides a bike ' * (i % 4)}play".strip() for i in range(40)]
    out = io.StringIO()
    lines_out_when_read = {}

    class Stdin:  # the binary stream under sys.stdin, noting how much was printed when each line is read
        def __iter__(self):
            for number, sentence in enumerate(sentences, start=1):
                lines_out_when_read[number] = out.getvalue().count("\n")
                yield sentence.encode("utf-8") + b"\n"

    monkeypatch.setattr(sys, "stdin", type("TextStdin", (), {"buffer": Stdin()})())
    monkeypatch.setattr(sys, "stdout", out)
    options = ["translate", "--model", str(tiny_workdir), "--beam-size", "1", "--max-extra", "3", "--batch-size", "1"]
    assert cli.main(options) == 0  # chunks of 1 x 32 lines: 32, then 8
    assert lines_out_when_read[32] == 0 and lines_out_when_read[33] == 32
    monkeypatch.undo()
    assert cli.main(options[:-2] + sentences) == 0  # all 40 as arguments: one call, batches of 64
    assert out.getvalue() == capsys.readouterr().out and len(out.getvalue().splitlines()) == 40


def test_line_breaks_inside_translations_keep_one_output_line_per_sentence(tiny_workdir, tmp_path, capsys,
                                                                          monkeypatch):
    """An under-trained or byte-fallback model can emit line-break characters; the line-oriented outputs still give
    one line per source sentence, and evaluate scores the file it writes."""
    import json

    from keras_transformer import evaluation, inference
    from keras_transformer.engines import loader
    emitted = ["ein\x0bmann", "zwei\n\nhunde\u2028", ""]
    emitting = type("Translator", (), {"translate_lines": lambda self, chunk, batch_size: list(emitted),
                                       "options": DecodeOptions()})()
    monkeypatch.setattr(loader, "load_translator", lambda *args, **kwargs: emitting)  # translate's
    monkeypatch.setattr(inference, "translate", lambda *args, **kwargs: list(emitted))  # evaluate's
    assert cli.main(["translate", "--model", str(tiny_workdir), "a", "b", "c"]) == 0
    assert capsys.readouterr().out.split("\n") == ["ein mann", "zwei hunde ", "", ""]
    (tmp_path / "src.txt").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("ein mann\nzwei hunde\nx\n", encoding="utf-8")
    assert cli.main(["evaluate", "--model", str(tiny_workdir), "--source", str(tmp_path / "src.txt"),
                     "--reference", str(tmp_path / "ref.txt"), "--output", str(tmp_path / "hyp.txt"), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out.splitlines()[-1])
    written = evaluation.read_lines(tmp_path / "hyp.txt")
    assert written == ["ein mann", "zwei hunde ", ""]
    expected = evaluation.evaluate_translations(written, ["ein mann", "zwei hunde", "x"])
    assert {k: scores[k] for k in expected} == {k: round(v, 4 if k == "length_ratio" else 2)
                                                for k, v in expected.items()}


@pytest.fixture(scope="module")
def second_workdir(tiny_workdir, tmp_path_factory):
    """Another run on tiny_workdir's vocabulary: a model of another shape (d_model 32), one checkpoint."""
    import shutil

    from factories import make_workdir, tiny_config

    from keras_transformer.config import TransformerConfig

    workdir = tmp_path_factory.mktemp("second")
    first = TransformerConfig.from_yaml(tiny_workdir / "model.yaml")
    make_workdir(workdir, tiny_config(vocab_size=first.vocab_size, d_model=32, d_ff=64, max_length=32))
    shutil.copytree(tiny_workdir / "data", workdir / "data")
    return workdir


@pytest.mark.slow
def test_repeated_model_decodes_an_ensemble_and_exports_it(tiny_workdir, second_workdir, tmp_path, capsys,
                                                           monkeypatch):
    """`--model A --model B` translates with the mean of both models' distributions, as built here by hand."""
    import tensorflow as tf

    from keras_transformer import decoding, evaluation, inference

    sentences = ["a man rides a bike", "two dogs play"]
    options = ["--beam-size", "2", "--alpha", "0.6", "--max-extra", "4"]
    assert cli.main(["translate", "--model", str(tiny_workdir), "--model", str(second_workdir), *options,
                     *sentences]) == 0
    printed = capsys.readouterr().out.splitlines()
    members = [inference.load_translator(w, beam_size=2, alpha=0.6, max_extra=4)
               for w in (tiny_workdir, second_workdir)]
    source = members[0].encode_sources(tf.constant(sentences))
    tokens, _ = decoding.beam_search([m.model for m in members], source, beam_size=2, alpha=0.6, max_extra=4)
    by_hand = [t.decode("utf-8") for t in members[0].target_tokenizer.detokenize(tokens[:, 0]).numpy()]
    expected = [evaluation.one_line(t) for t in by_hand]  # an under-trained model may emit line breaks
    assert printed == expected

    assert cli.main(["export", "--workdir", str(tiny_workdir), "--workdir", str(second_workdir),
                     "--out", str(tmp_path / "both"), *options]) == 0
    assert b"_XlaMustCompile" in (tmp_path / "both" / "saved_model.pb").read_bytes()  # exports compile with XLA
    capsys.readouterr()
    assert cli.main(["translate", "--model", str(tmp_path / "both"), *options, *sentences]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    # --no-xla exports an uncompiled Translator; tests/test_export.py exports those (no XLA op in their graph) and
    # serves them alike.
    from keras_transformer.exports import savedmodel
    exported = []
    monkeypatch.setattr(savedmodel, "export_translator", lambda translator, out, **kwargs: exported.append(
        translator.jit_compile) or pathlib.Path(out))
    assert cli.main(["export", "--workdir", str(tiny_workdir), "--out", str(tmp_path / "plain"), "--no-xla"]) == 0
    assert exported == [False]


def test_ensemble_errors_name_the_problem(tiny_workdir, second_workdir, tmp_path, capsys):
    import shutil

    from keras_transformer.data.tokenizers import train_tokenizers

    other = tmp_path / "other_vocab"
    shutil.copytree(second_workdir, other)
    shutil.rmtree(other / "data" / "vocab")
    train_tokenizers(["a cat sleeps on a sofa", "three birds sing"] * 20, ["eine katze", "drei vögel"] * 20,
                     vocab_size=300, directory=other / "data" / "vocab")
    status = cli.main(["translate", "--model", str(tiny_workdir), "--model", str(other), "a man"])
    assert status == 2
    error = capsys.readouterr().err
    assert str(other) in error and "different vocabulary" in error
    checkpoint = str(tiny_workdir / "checkpoints" / "ckpt-0001.weights.h5")
    status = cli.main(["translate", "--model", str(tiny_workdir), "--model", str(second_workdir),
                       "--checkpoint", checkpoint, "a man"])
    assert status == 2
    assert "one checkpoint per model" in capsys.readouterr().err
    status = cli.main(["translate", "--model", str(tiny_workdir), "--checkpoint", checkpoint,
                       "--checkpoint", checkpoint, "a man"])
    assert status == 2
    assert "One --model takes one --checkpoint, got 2" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["translate", "evaluate", "export", "plot-attention", "serve"])
def test_checkpoint_and_average_together_are_refused_by_every_command(tiny_workdir, tmp_path, capsys, command):
    """`--checkpoint` used to win silently; `average` already refused --last N with --checkpoint files."""
    checkpoint = str(tiny_workdir / "checkpoints" / "ckpt-0001.weights.h5")
    (tmp_path / "src.txt").write_text("a man\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("ein mann\n", encoding="utf-8")
    flag = "--workdir" if command == "export" else "--model"
    argv = {"translate": ["a man"], "evaluate": ["--source", str(tmp_path / "src.txt"), "--reference",
                                                 str(tmp_path / "ref.txt")],
            "export": ["--out", str(tmp_path / "out")], "plot-attention": ["a man", "--out", str(tmp_path / "out")],
            "serve": []}
    status = cli.main([command, flag, str(tiny_workdir), "--checkpoint", checkpoint, "--average", "2",
                       *argv[command]])
    assert status == 2
    assert "Give --checkpoint FILE or --average N (the last N epoch checkpoints), not both." in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    from keras_transformer import inference
    from keras_transformer.errors import ConfigError
    with pytest.raises(ConfigError, match="not both"):
        inference.load_translator(tiny_workdir, checkpoint, 2)


def test_a_missing_model_folder_is_named_as_missing(tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    for command in (["translate", "--model", str(missing), "a man"],
                    ["plot-attention", "--model", str(missing), "a man", "--out", str(tmp_path / "out")],
                    ["serve", "--model", str(missing)]):
        assert cli.main(command) == 2
        assert f"Model folder not found: {missing}" in capsys.readouterr().err


def test_evaluate_checks_its_output_and_references_before_decoding(tiny_workdir, tmp_path, capsys, monkeypatch):
    """Decoding a whole test set takes minutes: a wrong --output or a short reference file is refused first."""
    from keras_transformer import inference

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded before checking")
    monkeypatch.setattr(inference, "translate", no_decoding)
    (tmp_path / "src.txt").write_text("a man\ntwo dogs\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("ein mann\nzwei hunde\n", encoding="utf-8")
    (tmp_path / "tok.txt").write_text("ein mann\n", encoding="utf-8")
    (tmp_path / "short.txt").write_text("ein mann\n", encoding="utf-8")
    base = ["evaluate", "--model", str(tiny_workdir), "--source", str(tmp_path / "src.txt"), "--reference",
            str(tmp_path / "ref.txt")]
    missing = tmp_path / "no_such_folder" / "hyp.txt"
    assert cli.main(base + ["--output", str(missing)]) == 2
    assert f"the folder {missing.parent} does not exist" in capsys.readouterr().err
    assert cli.main(base + ["--output", str(tmp_path)]) == 2
    assert f"{tmp_path}: it is a directory" in capsys.readouterr().err
    assert cli.main(base + ["--tokenized-reference", str(tmp_path / "tok.txt"), "--lang", "de"]) == 2
    assert (f"2 source sentences in {tmp_path / 'src.txt'} but 1 tokenized references in {tmp_path / 'tok.txt'}"
            in capsys.readouterr().err)
    assert cli.main(base[:-1] + [str(tmp_path / "short.txt")]) == 2
    assert (f"2 source sentences in {tmp_path / 'src.txt'} but 1 references in {tmp_path / 'short.txt'}"
            in capsys.readouterr().err)
    assert cli.main(["evaluate", "--model", str(tiny_workdir), "--source", str(tmp_path), "--reference",
                     str(tmp_path / "ref.txt")]) == 2
    assert f"{tmp_path} is a directory, not a file." in capsys.readouterr().err


def test_translate_decompresses_gzip_on_stdin(tiny_workdir, capsys, monkeypatch, load_once):
    """`translate < test.en.gz` translates the sentences, as evaluate and train read gzip files (not the bytes)."""
    import gzip
    import io
    sentences = ["a man rides a bike", "two dogs play"]
    packed = gzip.compress("".join(s + "\n" for s in sentences).encode("utf-8"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(packed), encoding="utf-8", errors="strict"))
    options = ["translate", "--model", str(tiny_workdir), "--beam-size", "1", "--max-extra", "3"]
    assert cli.main(options) == 0
    from_stdin = capsys.readouterr().out
    assert cli.main(options + sentences) == 0
    assert from_stdin == capsys.readouterr().out and len(from_stdin.splitlines()) == 2


def test_gzip_from_a_pipe_is_decompressed_as_it_arrives():
    """Streaming stays: the first line is out before the writer sends the rest."""
    import threading
    import zlib

    from keras_transformer.data import textfile
    read_end, write_end = os.pipe()
    first_line_read = threading.Event()
    in_time = []

    def write():
        compressor = zlib.compressobj(wbits=31)  # the gzip format
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(compressor.compress(b"one\n") + compressor.flush(zlib.Z_SYNC_FLUSH))
            pipe.flush()
            in_time.append(first_line_read.wait(timeout=20))
            pipe.write(compressor.compress(b"two\n") + compressor.flush())

    writer = threading.Thread(target=write)
    writer.start()
    with os.fdopen(read_end, "rb") as stdin:
        lines = textfile.iter_stream(textfile.open_stream(stdin), "stdin")
        assert next(lines) == ("one", False)
        first_line_read.set()
        assert list(lines) == [("two", False)]
    writer.join()
    assert in_time == [True]


def test_export_help_names_its_own_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "with several --workdir, one --checkpoint per workdir" in help_text
    assert "--model" not in help_text


# ------------------------------------------------------------------ kill -9, then the same command again
def _history_epochs(path):
    with open(path, newline="", encoding="utf-8") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


@pytest.mark.slow
def test_train_killed_with_sigkill_resumes_with_the_same_command(tmp_path):
    """Slow: a real `train` process is killed with SIGKILL mid-run and resumed; only a separate process can be."""
    workdir = tmp_path / "run"
    command = [sys.executable, "-m", "keras_transformer.cli", "train", "--config", str(TINY), "--workdir",
               str(workdir), "--set", "training.verbose=2", "--set", "training.tensorboard=false"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TF_CONFIG", None)
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second_checkpoint = workdir / "checkpoints" / "ckpt-0002.weights.h5"
    from keras_transformer.files import lock_holder

    # A second `train` on the same workdir while the first holds it: refused at once, naming the first.
    deadline = time.time() + 120
    while lock_holder(workdir).get("pid") != first.pid and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run([command[0], "-c", "import sys; sys.modules['tensorflow'] = None; "  # refused before
                             "from keras_transformer.cli import main; sys.exit(main(sys.argv[1:]))",   # TensorFlow
                             *command[3:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"in use by process {first.pid} on host " in second.stderr and "(train, started" in second.stderr
    assert "Epoch 1/8" not in second.stdout
    assert first.poll() is None  # the first goes on

    def two_epochs_done():  # the epoch-2 checkpoint is written before its history row: wait for both
        try:
            return second_checkpoint.exists() and len(_history_epochs(workdir / "history.csv")) >= 2
        except (OSError, ValueError, KeyError, TypeError):  # not there yet, or a row half written
            return False

    deadline = time.time() + 240
    try:
        while not two_epochs_done() and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL, first.stdout.read().decode()[-3000:]
    killed_at = _history_epochs(workdir / "history.csv")
    assert 2 <= len(killed_at) < 8  # killed mid-run, after its first checkpoints
    first_checkpoint_time = (workdir / "checkpoints" / "ckpt-0001.weights.h5").stat().st_mtime_ns

    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:]  # the killed process's lock went with it
    assert "Epoch 1/8" not in second.stdout  # it resumed instead of starting over
    epochs = _history_epochs(workdir / "history.csv")
    assert epochs == list(range(1, 9))  # one row per epoch, never going back
    assert sorted(p.name for p in (workdir / "checkpoints").glob("ckpt-*")) == [
        f"ckpt-{epoch:04d}.weights.h5" for epoch in range(1, 9)]
    assert (workdir / "checkpoints" / "ckpt-0001.weights.h5").stat().st_mtime_ns == first_checkpoint_time
    with open(workdir / "history.csv", newline="", encoding="utf-8") as f:
        last = list(csv.DictReader(f))[-1]
    assert int(last["step"]) == 8 * 32  # the optimizer's step count carried over the kill
    assert float(last["val_masked_accuracy"]) > 0.95  # configs/tiny_copy.yaml learns the copy task


def test_outputs_that_would_overwrite_inputs_are_refused(tiny_workdir, tmp_path, capsys):
    checkpoints = tiny_workdir / "checkpoints"
    before = {path.name: path.read_bytes() for path in checkpoints.iterdir()}
    for output in (checkpoints / "ckpt-0002.weights.h5", checkpoints / "ckpt-0003.weights.h5"):  # an input; the
        assert cli.main(["average", "--workdir", str(tiny_workdir), "--last", "2",       # next "latest"
                         "--output", str(output)]) == 2
        assert f"lies in {checkpoints}" in capsys.readouterr().err
    mine = tmp_path / "mine.weights.h5"
    mine.write_bytes(before["ckpt-0001.weights.h5"])
    assert cli.main(["average", "--workdir", str(tiny_workdir), "--checkpoint", str(mine), "--checkpoint",
                     str(checkpoints / "ckpt-0002.weights.h5"), "--output", str(mine)]) == 2
    assert "is one of this command's input files" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in checkpoints.iterdir()} == before
    assert mine.read_bytes() == before["ckpt-0001.weights.h5"]

    source, reference = tmp_path / "test.en", tmp_path / "test.de"
    source.write_text("a man rides a bike\n", encoding="utf-8")
    reference.write_text("ein mann\n", encoding="utf-8")
    for output in (reference, tmp_path / "." / "test.en"):
        assert cli.main(["evaluate", "--model", str(tiny_workdir), "--source", str(source), "--reference",
                         str(reference), "--output", str(output)]) == 2
        assert "is one of this command's input files" in capsys.readouterr().err
    assert reference.read_text(encoding="utf-8") == "ein mann\n" and source.read_text(encoding="utf-8") == \
        "a man rides a bike\n"


def test_export_refuses_an_out_folder_in_a_training_workdir(tiny_workdir, capsys):
    before = sorted(path.name for path in tiny_workdir.iterdir())
    for out in (tiny_workdir, tiny_workdir / "export"):
        for format_ in ("savedmodel", "ctranslate2"):
            assert cli.main(["export", "--workdir", str(tiny_workdir), "--format", format_, "--out", str(out)]) == 2
            assert f"training workdir {tiny_workdir}" in capsys.readouterr().err
    assert sorted(path.name for path in tiny_workdir.iterdir()) == before


@pytest.mark.slow  # a CTranslate2 export written and decoded (5 CPU s)
def test_export_to_ctranslate2_then_translate_and_evaluate_read_the_folder(tiny_workdir, tmp_path, capsys):
    """`export --format ctranslate2` writes a folder that `translate --model` and `evaluate --model` load, and the
    greedy translations are the Keras model's."""
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    assert cli.main(["export", "--workdir", str(tiny_workdir), "--format", "ctranslate2", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == str(out)  # the path alone on stdout; what went into it on stderr
    assert f"Exported {tiny_workdir}: {tiny_workdir / 'checkpoints' / 'ckpt-0002.weights.h5'}" in printed.err
    assert "Decoding baked in: beam: beam_size " in printed.err and ", alpha " in printed.err
    sentences = ["a man rides a bike", "two dogs play", ""]
    expected = []
    for model in (tiny_workdir, out):
        assert cli.main(["translate", "--model", str(model), "--beam-size", "1", "--alpha", "0", *sentences]) == 0
        expected.append(capsys.readouterr().out.splitlines())
    assert expected[0] == expected[1] and len(expected[1]) == 3
    # A CTranslate2 export translates in a process that never imports TensorFlow (it cost 4 s at every start).
    code = "import sys; from keras_transformer import cli; cli.main(sys.argv[1:]); print('tensorflow' in sys.modules)"
    alone = subprocess.run([sys.executable, "-c", code, "translate", "--model", str(out), "--beam-size", "1",
                            "--alpha", "0", sentences[1]], capture_output=True, text=True, check=True)
    assert alone.stdout.splitlines() == [expected[1][1], "False"]
    (tmp_path / "src.txt").write_text("a man rides a bike\ntwo dogs play\n", encoding="utf-8")
    assert cli.main(["evaluate", "--model", str(out), "--source", str(tmp_path / "src.txt"), "--reference",
                     str(tmp_path / "src.txt")]) == 0
    assert "bleu" in capsys.readouterr().out
    # Options that cannot apply are refused by name.
    assert cli.main(["translate", "--model", str(out), "--average", "2", "a man"]) == 2
    assert "CTranslate2 export" in capsys.readouterr().err
    assert cli.main(["export", "--workdir", str(tiny_workdir), "--quantization", "int8",
                     "--out", str(tmp_path / "sm")]) == 2
    assert "--quantization applies to --format ctranslate2" in capsys.readouterr().err
    assert cli.main(["export", "--workdir", str(tiny_workdir), "--format", "ctranslate2", "--no-xla",
                     "--out", str(tmp_path / "ct2_no_xla")]) == 2
    assert "--no-xla applies to --format savedmodel" in capsys.readouterr().err


NO_TENSORFLOW = """
import contextlib, io, json, sys
sys.modules["tensorflow"] = None  # importing it now fails: whatever answers below answered before it
from keras_transformer.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(argv)
    results.append([status, err.getvalue()])
print(json.dumps(results))
"""


def test_config_and_path_mistakes_are_reported_before_tensorflow_is_imported(tmp_path, tiny_workdir):
    """A typo in a key, a missing file or folder, an --out in a workdir: each is answered by checks that need no
    TensorFlow, whose import takes seconds (the process below cannot import it at all)."""
    missing = tmp_path / "missing"
    (tmp_path / "src.txt").write_text("a\n", encoding="utf-8")
    cases = [
        (["train", "--config", str(TINY), "--set", "training.epochz=3", "--workdir", str(tmp_path / "run")],
         "Unknown config key 'training.epochz'"),
        (["train", "--config", str(TINY), "--set", "data.kind=text", "--set", f"data.train_source={missing}",
          "--set", f"data.train_target={missing}", "--workdir", str(tmp_path / "run")], str(missing)),
        (["translate", "--model", str(missing), "a man"], f"Model folder not found: {missing}"),
        (["translate", "--model", str(tmp_path), "a man"], f"{tmp_path} is not a model folder"),
        (["evaluate", "--model", str(tiny_workdir), "--source", str(missing), "--reference", str(missing)],
         f"File not found: {missing}"),
        (["evaluate", "--model", str(tiny_workdir), "--source", str(tmp_path / "src.txt"), "--reference",
          str(tmp_path / "src.txt"), "--output", str(tmp_path / "src.txt")], "is one of this command's input files"),
        (["export", "--workdir", str(tiny_workdir), "--out", str(tiny_workdir / "export")], "training workdir"),
        (["average", "--workdir", str(tmp_path)], f"{tmp_path} is not a training workdir"),
        (["train", "--config", str(REPO / "configs" / "multi30k_en_de.yaml"), "--workdir", str(tmp_path / "run"),
          "--dry-run"], None),  # the whole resolved config, the corpus line counts checked: no TensorFlow either
    ]
    run = subprocess.run([sys.executable, "-c", NO_TENSORFLOW, json.dumps([argv for argv, _ in cases])], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    for (argv, expected), (status, err) in zip(cases, json.loads(run.stdout.splitlines()[-1])):
        if expected is None:
            assert status == 0, (argv, err)
        else:
            assert status == 2 and expected in err and "Traceback" not in err, (argv, err)
