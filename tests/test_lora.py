"""LoRA fine-tuning (`training.lora`): only the adapters train, checkpoints hold them and the base's digest, a killed
run resumes, and every loader (translate, export, average: `load_models`) merges them into plain weights."""

import hashlib
import pathlib
import shutil

import h5py
import keras
import numpy as np
import pytest
from factories import SMALL_RUN, TINY_EXPERIMENT, tiny_config

from keras_transformer import training
from keras_transformer.errors import CheckpointError, ConfigError
from keras_transformer.experiment import TrainingSection, load_experiment
from keras_transformer.experiment.validation import LORA_TARGETS
from keras_transformer.layers.lora import TARGETS, enable_lora
from keras_transformer.model import build_model
from keras_transformer.trainer import backup as trainer_backup
from keras_transformer.workdir import adapters
from keras_transformer.workdir.checkpoints import average_workdir, load_models, load_weights, save_weights

pytestmark = pytest.mark.xdist_group("test_lora")

BASE_RUN = SMALL_RUN + ["data.shuffle=false"]
# Logits of the merged model against the adapted one: float32 rounding of W + (alpha / r) A B against
# x W + (alpha / r) (x A) B, a few ulps of logits of size ~10.
TOLERANCE = 1e-4


def _lora_run(base, extra=()):
    # the loss a vocabulary block at a time (on by default from 32,768 ids, as LoRA of large models has it)
    return BASE_RUN + ["training.epochs=2", "training.learning_rate_scale=20", f"training.init_checkpoint={base}",
                       "training.lora={rank: 4, alpha: 8, targets: [attention, feed_forward]}",
                       "training.chunked_loss=true", *extra]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """`(workdir, its epoch checkpoint)`: the base model, one epoch of BASE_RUN."""
    workdir = tmp_path_factory.mktemp("lora") / "base"
    result = training.train(load_experiment(TINY_EXPERIMENT, BASE_RUN), workdir)
    return workdir, result.checkpoints[-1], result.history


@pytest.fixture(scope="module")
def lora_run(base_run, tmp_path_factory):
    """The `TrainingResult` of two LoRA epochs on the base."""
    return training.train(load_experiment(TINY_EXPERIMENT, _lora_run(base_run[1])),
                          tmp_path_factory.mktemp("lora") / "adapted")


def _batch(config, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, config.vocab_size, (3, 8)).astype("int32")
    target = rng.integers(4, config.vocab_size, (3, 8)).astype("int32")
    return source, target


def _logits(model, batch):
    return keras.ops.convert_to_numpy(model(list(batch), training=False))


def test_bad_lora_settings_are_refused_in_one_line_naming_the_key():
    assert LORA_TARGETS == TARGETS  # the config's names are the layers'
    for lora, key in [({"rank": 0}, "training.lora.rank"), ({"rank": 4, "targets": ["ffn"]}, "training.lora.targets"),
                      ({"rank": 4, "alpha": -1}, "training.lora.alpha"), ({"rank": 4, "dropout": 0.1},
                                                                          "training.lora.dropout")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as error:
            TrainingSection(lora=lora, init_checkpoint="base.weights.h5").validate()
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="training.init_checkpoint"):
        TrainingSection(lora={"rank": 4}).validate()


def test_an_adapted_layer_computes_its_merged_kernel_s_product_and_its_gradients_reach_only_the_adapters():
    """An adapted layer computes x W + (alpha / r) (x A) B + b without merging W + (alpha / r) A B (the merged
    matrix, held for the backward pass, cost a training step a copy of every adapted kernel): its output is x times
    `merged_kernel` (float64, here), and the loss's gradients are those of A and B only (the kernel is frozen)."""
    import tensorflow as tf

    from keras_transformer.layers.lora import AdaptedDense, merged_kernel
    rng = np.random.default_rng(0)
    layer = AdaptedDense(6, name="proj")
    layer.build((None, 5))
    layer.enable_lora(2, lora_alpha=4.0)
    layer.lora_kernel_b.assign(rng.standard_normal((2, 6)))
    layer.bias.assign(rng.standard_normal(6))
    layer.bias.trainable = False  # as `enable_lora` leaves every weight but the adapters
    x = rng.standard_normal((3, 5)).astype("float32")
    merged = merged_kernel(layer._kernel.numpy(), layer.lora_kernel_a.numpy(), layer.lora_kernel_b.numpy(), 2, 4.0)
    expected = x.astype("float64") @ merged.astype("float64") + layer.bias.numpy()
    with tf.GradientTape() as tape:
        out = layer(x)
        loss = keras.ops.sum(out ** 2)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)
    assert [w.path for w in layer.trainable_weights] == ["proj/lora_kernel_a", "proj/lora_kernel_b"]
    gradients = tape.gradient(loss, layer.trainable_weights)
    assert all(g is not None and np.abs(np.asarray(g)).sum() > 0 for g in gradients)


@pytest.mark.slow
def test_adapters_train_alone_and_the_merged_kernels_compute_the_adapted_model(tmp_path):
    """The adapted model starts as the base (B = 0), trains only A and B, and a checkpoint of random adapters loads
    into a plain model as kernels that give the adapted logits; a changed base is refused in one line. (Three model
    builds and their first calls: about 2 s.)"""
    config = tiny_config(vocab_size=24)
    model = build_model(config)
    base = save_weights(model, tmp_path / "base.weights.h5")
    batch = _batch(config)
    before = _logits(model, batch)
    layers = enable_lora(model, 4, 8.0, ["attention", "feed_forward"])
    assert np.array_equal(_logits(model, batch), before)
    assert {v.path.rsplit("/", 1)[-1] for v in model.trainable_weights} == {"lora_kernel_a", "lora_kernel_b"}
    assert len(model.trainable_weights) == 2 * len(layers) == 2 * (2 + 3 + 2 + 2 + 2)  # qkv+o, q+kv+o, 2 + 2 ffn
    rng = np.random.default_rng(1)
    for layer in layers:
        layer.lora_kernel_b.assign(rng.normal(0, 0.3, layer.lora_kernel_b.shape))
    adapted = _logits(model, batch)
    assert np.abs(adapted - before).max() > 0.1
    adapters.set_base(model, base)
    path = save_weights(model, tmp_path / "ckpt-0001.weights.h5")
    with h5py.File(path) as handle:
        assert handle.attrs["base_sha256"] == hashlib.sha256(base.read_bytes()).hexdigest()
        assert sorted(handle) == ["adapters"]
    merged = load_weights(build_model(config), path)
    assert not adapters.adapted_layers(merged)
    np.testing.assert_allclose(_logits(merged, batch), adapted, atol=TOLERANCE, rtol=0)

    save_weights(build_model(config), base)  # another base under the same name
    with pytest.raises(CheckpointError, match="has changed") as error:
        load_weights(build_model(config), path)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_lora_lowers_the_loss_with_the_base_unchanged_and_checkpoints_hold_only_adapters(base_run, lora_run):
    """Two epochs of LoRA through `train`: the validation loss falls below the base's, every base weight is bit for
    bit the base checkpoint's, the epoch checkpoints hold the adapters and the base's SHA-256 only, and
    `load_models` and `average` (what translate and every export load through) give the adapted model's logits.
    (A whole training run: the fast test above checks the merge on a model built in the test.)"""
    base_workdir, base, base_history = base_run
    assert lora_run.history["val_loss"][-1] < lora_run.history["val_loss"][0] < base_history["val_loss"][-1]
    reference = load_weights(build_model(lora_run.model_config), base)
    base_weights = {v.path: v.numpy() for v in reference.weights}
    trained = {v.path: v.numpy() for v in lora_run.model.weights}
    adapter_names = {name for name in trained if name.rsplit("/", 1)[-1].startswith("lora_kernel_")}
    assert set(trained) - adapter_names == set(base_weights)
    for name, value in base_weights.items():
        assert np.array_equal(trained[name], value), name

    checkpoint = lora_run.checkpoints[-1]
    with h5py.File(checkpoint) as handle:
        assert handle.attrs["base"] == str(pathlib.Path(base).resolve())
        assert handle.attrs["base_sha256"] == hashlib.sha256(pathlib.Path(base).read_bytes()).hexdigest()
        stored = []
        handle.visititems(lambda name, item: stored.append(name) if isinstance(item, h5py.Dataset) else None)
    expected = ["adapters/{}/kernel/{}".format(*name.rsplit("/", 1)) for name in adapter_names]
    assert sorted(stored) == sorted(expected), stored
    assert pathlib.Path(checkpoint).stat().st_size < pathlib.Path(base).stat().st_size / 4

    batch = _batch(lora_run.model_config)
    adapted = _logits(lora_run.model, batch)
    assert np.abs(adapted - _logits(reference, batch)).max() > 1e-3  # the adapters changed the model
    merged = load_models(lora_run.workdir).models[0]
    np.testing.assert_allclose(_logits(merged, batch), adapted, atol=TOLERANCE, rtol=0)
    averaged, _ = average_workdir(lora_run.workdir, last=1)
    np.testing.assert_allclose(_logits(load_weights(build_model(lora_run.model_config), averaged), batch), adapted,
                               atol=TOLERANCE, rtol=0)


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no `except Exception` catches it."""


@pytest.mark.slow
def test_a_killed_lora_run_resumes_to_the_uninterrupted_adapters(base_run, lora_run, tmp_path, monkeypatch):
    """Killed after the first update of its second epoch, the same command resumes from the epoch-1 backup, which
    holds the base and the adapters apart with the optimizer's state, and ends with the uninterrupted run's weights.
    (Two training runs; synthetic data resumed inside an epoch draws its batches anew, so the kill comes before
    any backup of the second epoch.)"""
    settings = _lora_run(base_run[1])
    original = trainer_backup.ResumableBackup.on_train_batch_end

    def killed(self, batch, logs=None):
        original(self, batch, logs)
        if self.epoch == 1 and self._done == 1:
            raise _Killed()

    monkeypatch.setattr(trainer_backup.ResumableBackup, "on_train_batch_end", killed)
    workdir = tmp_path / "run"
    with pytest.raises(_Killed):
        training.train(load_experiment(TINY_EXPERIMENT, settings), workdir)
    monkeypatch.setattr(trainer_backup.ResumableBackup, "on_train_batch_end", original)
    assert trainer_backup.find_backup(workdir / "backup").position == (1, 0)
    resumed = training.train(load_experiment(TINY_EXPERIMENT, settings), workdir)
    expected = {v.path: v.numpy() for v in lora_run.model.weights}
    for variable in resumed.model.weights:
        np.testing.assert_allclose(variable.numpy(), expected[variable.path], rtol=1e-5, atol=1e-6,
                                   err_msg=variable.path)


@pytest.mark.slow
def test_a_changed_base_stops_the_loaders_and_the_resume_of_a_lora_workdir_in_one_line(base_run, tmp_path):
    """A LoRA workdir whose base file was replaced is refused by every loader (load_models: translate, export,
    average) and by the next `train` on it, each in one line naming the base. (A training run.)"""
    base = tmp_path / "base.weights.h5"
    shutil.copyfile(base_run[1], base)
    workdir = tmp_path / "adapted"
    result = training.train(load_experiment(TINY_EXPERIMENT, _lora_run(base, ["training.epochs=1"])), workdir)
    assert load_models(workdir).models
    save_weights(build_model(result.model_config), base)  # another model under the base's name
    with pytest.raises(CheckpointError, match=f"adapts {base} of SHA-256 .*has changed") as error:
        load_models(workdir)
    assert "\n" not in str(error.value)
    with pytest.raises(CheckpointError, match=f"Cannot resume {workdir}: training.init_checkpoint {base} is not the "
                                              f"base") as error:
        training.train(load_experiment(TINY_EXPERIMENT, _lora_run(base)), workdir)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_lora_on_an_imported_marian_model_trains_adapters_only_and_its_exports_translate_as_it(tmp_path):
    """An imported tiny MarianMTModel (tests/test_pretrained.py's reference) fine-tuned with LoRA on text: three
    updates raise log P(targets | sources) with the base unchanged bit for bit, and the SavedModel and CTranslate2
    exports, which merge the adapters, translate exactly as the adapted model in memory does (greedy).
    (transformers, a training run and two exports.)"""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import gzip

    from conftest import MULTI30K
    from test_pretrained import SENTENCES, SHAPES, build_reference

    import keras_transformer as kt
    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.engines.loader import load_translator
    from keras_transformer.engines.tensorflow import Translator
    from keras_transformer.exports import make_exporter

    workdir = kt.import_checkpoint(build_reference(tmp_path / "marian", **SHAPES["shared_swish"]), tmp_path / "import")
    lines = {}
    for side in ("en", "de"):
        with gzip.open(MULTI30K / f"val.{side}.gz", "rt", encoding="utf-8") as handle:
            lines[side] = [next(handle).strip() for _ in range(48)]
        (tmp_path / f"train.{side}").write_text("\n".join(lines[side]) + "\n", encoding="utf-8")
    base = workdir / "checkpoints" / "ckpt-0000.weights.h5"
    experiment = {
        "model": {"from": str(workdir), "dropout": 0.0},
        "data": {"kind": "text", "train_source": str(tmp_path / "train.en"), "train_target": str(tmp_path / "train.de"),
                 "tokens_per_batch": 4096, "max_length": 40},
        "training": {"label_smoothing": 0.0, "warmup_steps": 1, "learning_rate_scale": 0.5, "epochs": 1,
                     "steps_per_epoch": 3, "seed": 0, "jit_compile": False, "validation": False,
                     "init_checkpoint": str(base), "lora": {"rank": 4, "alpha": 8}},
    }
    tuned = tmp_path / "tuned"
    result = training.train(experiment, tuned)
    plain = load_models(workdir)
    config = plain.configs[0]
    base_weights = {v.path: v.numpy() for v in plain.models[0].weights}
    for variable in result.model.weights:
        if not variable.path.rsplit("/", 1)[-1].startswith("lora_kernel_"):
            assert np.array_equal(variable.numpy(), base_weights[variable.path]), variable.path

    source_tokenizer, target_tokenizer = load_tokenizers(tuned / "data" / "vocab")

    def padded(rows):  # tokens then eos, padded
        rows = [row[:30] + [config.eos_id] for row in rows]
        width = max(len(row) for row in rows)
        return np.array([row + [config.pad_id] * (width - len(row)) for row in rows], "int32")

    source_ids = padded(source_tokenizer.tokenize(lines["en"]).to_list())
    target_ids = padded(target_tokenizer.tokenize(lines["de"]).to_list())

    def likelihood(model):
        return np.mean(np.asarray(kt.score(model, source_ids, target_ids, pad_id=config.pad_id,
                                           bos_id=config.bos_id)))

    assert likelihood(result.model) > likelihood(plain.models[0])
    adapted = Translator(result.model, source_tokenizer, target_tokenizer, options=plain.decoding,
                         strategy="greedy", max_extra=6)
    expected = adapted.translate_lines(SENTENCES[:4])
    assert len(set(expected)) > 1
    assert expected != load_translator(workdir, strategy="greedy", max_extra=6).translate_lines(SENTENCES[:4])
    for name in ("ctranslate2", "savedmodel"):
        options = {"jit_compile": False} if name == "savedmodel" else {}
        out = make_exporter(name, **options).export(tuned, tmp_path / name, strategy="greedy", max_extra=6)
        assert load_translator(out).translate_lines(SENTENCES[:4]) == expected, name
