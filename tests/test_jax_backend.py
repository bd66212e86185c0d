"""The JAX backend, the one the shipped models were trained on (docs/gpu.md), checked against numpy and TensorFlow.

Keras fixes its backend at import, so each check runs a script in a fresh interpreter with `KERAS_BACKEND=jax`,
as on the GPU machine. That machine has no TensorFlow, so the scripts cannot import it either: Keras then takes
its TensorFlow-free paths too (it seeds TensorFlow and reads files through `tf.io` only where it finds it).
"""

import csv
import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from factories import backup_weights, noam_learning_rates

# Its module fixtures are expensive: `make test` (--dist loadgroup) runs the whole file on one worker, so they
# are built once.
pytestmark = pytest.mark.xdist_group("test_jax_backend")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIPPED_DE = ROOT / "saved_models" / "multi30k_en_de"


HIDE_TENSORFLOW = """
class _NoTensorFlow:  # as on the GPU machine: importing TensorFlow fails
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras"):
            raise ImportError(f"No module named {name!r} (hidden: the JAX machine has no TensorFlow)")
sys.meta_path.insert(0, _NoTensorFlow())
"""


def run_jax(script, *args, env=None, timeout=900):
    """Runs `script` with Keras on JAX (CPU) in a fresh interpreter; returns the JSON object it prints last."""
    prelude = f"import json, sys\n{HIDE_TENSORFLOW}\nimport numpy as np\nimport keras\n" \
              "assert keras.backend.backend() == 'jax', keras.backend.backend()\n"
    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
                   "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    result = subprocess.run([sys.executable, "-c", prelude + script, *map(str, args)],
                            capture_output=True, text=True, timeout=timeout, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_jax_scripts(*scripts_and_args):
    """`run_jax` for several `(script, args)` in one interpreter (one import of JAX and Keras): their JSON objects."""
    program = "import contextlib, io\noutputs = []\n"
    for script, args in scripts_and_args:
        program += (f"sys.argv[1:] = {[str(a) for a in args]!r}\nprinted = io.StringIO()\n"
                    "with contextlib.redirect_stdout(printed):\n"
                    f"    exec(compile({script!r}, 'script', 'exec'),\n"
                    "         {'json': json, 'sys': sys, 'np': np, 'keras': keras})\n"
                    "outputs.append(json.loads(printed.getvalue().strip().splitlines()[-1]))\n")
    return run_jax(program + "print(json.dumps(outputs))\n")


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


LOSSES_SCRIPT = """
import jax
from keras_transformer.trainer import distillation
from keras_transformer.packed.data import pack_labels
from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy
inputs = np.load(sys.argv[1])
logits, labels = jax.numpy.asarray(inputs["logits"]), inputs["labels"]
packed = pack_labels(labels, inputs["ids"], inputs["probabilities"])
eps, w = float(inputs["eps"]), float(inputs["w"])
out = {}
for name, loss, targets in (("smoothed", LabelSmoothedCrossEntropy(eps), labels),
                            ("distilled", distillation.DistillationLoss(eps, w), packed)):
    value, gradient = jax.jit(jax.value_and_grad(lambda z: loss(targets, z)))(logits)
    out[name] = {"value": float(value), "gradient": np.asarray(gradient).tolist()}
print(json.dumps(out))
"""


def _losses_inputs():
    rng = np.random.default_rng(7)
    vocab, eps, w = 11, 0.1, 0.3
    logits = (rng.normal(size=(3, 5, vocab)) * 2).astype("float32")
    labels = rng.integers(1, vocab, (3, 5))
    labels[0, 3:] = 0
    labels[2, 1:] = 0  # pads
    ids = (rng.integers(0, vocab, (3, 5, 1)) + np.arange(4)) % vocab  # four distinct ids per position
    probabilities = rng.uniform(0.05, 0.6, (3, 5, 4))  # unnormalized, as a top-k cut leaves them
    return dict(logits=logits, labels=labels, ids=ids, probabilities=probabilities, eps=eps, w=w)


def _rdrop_inputs():
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=(4, 5, 11)) * 2).astype("float32")
    labels = np.repeat(rng.integers(1, 11, (2, 5)), 2, axis=0)  # two examples, each in two adjacent rows
    labels[2:, 3:] = 0  # pads
    return dict(logits=logits, labels=labels)


RELATIVE_SCRIPT = """
import jax
from keras_transformer.layers import MultiHeadSelfAttention
data = np.load(sys.argv[1])
with open(sys.argv[2]) as f:
    layer = MultiHeadSelfAttention.from_config(json.load(f))
layer.build(data["x"].shape)
layer.set_weights([data[f"weight_{i}"] for i in range(len(layer.weights))])
full = jax.jit(lambda x: layer(x, attention_mask=data["mask"]))(data["x"])
step = jax.jit(lambda x, cache, t: layer(x, attention_mask=data["mask"], cache=cache, cache_index=t))
cache, steps = (jax.numpy.zeros(data["cache_shape"]), jax.numpy.zeros(data["cache_shape"])), []
for t in range(data["x"].shape[1]):  # the cache index is traced: the relative distances are computed in the graph
    out, cache = step(data["x"][:, t:t + 1], cache, t)
    steps.append(np.asarray(out))


def objective(values):
    outputs, _ = layer.stateless_call(values, [], data["x"], attention_mask=data["mask"])
    return jax.numpy.sum(outputs ** 2)


gradients = jax.jit(jax.grad(objective))([v.value for v in layer.trainable_variables])
print(json.dumps({"full": np.asarray(full).tolist(), "steps": np.concatenate(steps, 1).tolist(),
                  "gradients": {v.name: np.asarray(g).tolist() for v, g in zip(layer.trainable_variables, gradients)
                                if "relative_position" in v.name}}))
"""


def _relative_attention(folder):
    """A causal self-attention layer with relative positions (k = 2, 7 positions), its weights and inputs saved for
    RELATIVE_SCRIPT; what TensorFlow computes: its outputs and the gradients of its relative tables."""
    import tensorflow as tf

    from keras_transformer.layers import MultiHeadSelfAttention
    rng = np.random.default_rng(5)
    layer = MultiHeadSelfAttention(num_heads=2, key_dim=4, causal=True, max_relative_position=2)
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    mask = np.ones((2, 1, 7), bool)
    mask[1, :, 5:] = False  # the second sentence padded
    layer(x)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()])
    np.savez(folder / "relative.npz", x=x, mask=mask, cache_shape=np.array([2, 2, 7, 4]),
             **{f"weight_{i}": w for i, w in enumerate(layer.get_weights())})
    (folder / "relative.json").write_text(json.dumps(layer.get_config()))
    tables = [layer.relative_position_keys, layer.relative_position_values]
    with tf.GradientTape() as tape:
        outputs = layer(x, attention_mask=mask)
        objective = tf.reduce_sum(outputs ** 2)
    expected = {"full": outputs.numpy(),
                "gradients": {v.name: tf.convert_to_tensor(g).numpy()
                              for v, g in zip(tables, tape.gradient(objective, tables))}}
    return [folder / "relative.npz", folder / "relative.json"], expected


@pytest.fixture(scope="module")
def losses_under_jax(tmp_path_factory):
    """`{"losses": (inputs, output of LOSSES_SCRIPT), "rdrop": ..., "draws": ... of DRAWS_SCRIPT, "relative": (what
    TensorFlow computes, output of RELATIVE_SCRIPT)}`, the scripts run in one JAX interpreter (one import instead of
    four)."""
    folder = tmp_path_factory.mktemp("jax_losses")
    inputs = {"losses": _losses_inputs(), "rdrop": _rdrop_inputs(), "draws": _draws_inputs()}
    for name, arrays in inputs.items():
        np.savez(folder / f"{name}.npz", **arrays)
    relative_files, relative_expected = _relative_attention(folder)
    outputs = run_jax_scripts(*[(script, [folder / f"{name}.npz"]) for name, script in
                                (("losses", LOSSES_SCRIPT), ("rdrop", RDROP_SCRIPT), ("draws", DRAWS_SCRIPT))],
                              (RELATIVE_SCRIPT, relative_files))
    result = {name: (inputs[name], output) for name, output in zip(("losses", "rdrop", "draws"), outputs)}
    return {**result, "relative": (relative_expected, outputs[3])}


@pytest.mark.slow  # a fresh process on the JAX backend
def test_losses_and_their_hand_written_gradients_under_jax(losses_under_jax):
    """Both losses define their gradient by hand (`losses.smoothed_cross_entropy`); under jax.jit and jax.grad
    they give the textbook values: softmax minus the (mixed) target over the non-pad positions."""
    inputs, got = losses_under_jax["losses"]
    logits, labels, ids, probabilities, eps, w = (inputs[k] for k in ("logits", "labels", "ids", "probabilities",
                                                                      "eps", "w"))
    vocab = logits.shape[-1]

    log_q = _log_softmax(logits.astype("float64"))
    mask = labels != 0
    smoothed = np.full(logits.shape, eps / vocab) + (1 - eps) * np.eye(vocab)[labels]
    soft = np.zeros(logits.shape)
    np.put_along_axis(soft, ids, probabilities / probabilities.sum(-1, keepdims=True), -1)
    for name, target in (("smoothed", smoothed), ("distilled", (1 - w) * smoothed + w * soft)):
        per_token = -(target * log_q).sum(-1)
        assert got[name]["value"] == pytest.approx(per_token[mask].mean(), rel=1e-5), name
        expected_gradient = (np.exp(log_q) - target) * mask[..., None] / mask.sum()
        np.testing.assert_allclose(got[name]["gradient"], expected_gradient, atol=1e-6, err_msg=name)
    assert np.abs(expected_gradient).max() > 1e-2  # a real gradient


RDROP_SCRIPT = """
import jax
import jax.numpy as jnp
from keras_transformer.trainer.losses import RDropLoss
inputs = np.load(sys.argv[1])
logits, labels = jnp.asarray(inputs["logits"]), jnp.asarray(inputs["labels"])


def textbook(z):  # the paper's loss per pair, halved, by autodiff: mean CE + alpha / 4 * mean(KL_12 + KL_21)
    log_p = jax.nn.log_softmax(z)
    target = jax.nn.one_hot(labels, z.shape[-1]) * 0.9 + 0.1 / z.shape[-1]
    mask = (labels != 0).astype("float32")
    cross_entropy = jnp.sum(-jnp.sum(target * log_p, -1) * mask) / jnp.sum(mask)
    a, b = log_p[0::2], log_p[1::2]
    divergence = jnp.sum((jnp.exp(a) - jnp.exp(b)) * (a - b), -1)
    return cross_entropy + 5.0 / 4 * jnp.sum(divergence * mask[0::2]) / jnp.sum(mask[0::2])


out = {}
for name, fn in (("ours", lambda z: RDropLoss(5.0, 0.1)(labels, z)), ("textbook", textbook)):
    value, gradient = jax.jit(jax.value_and_grad(fn))(logits)
    out[name] = {"value": float(value), "gradient": np.asarray(gradient).tolist()}
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh process on the JAX backend
def test_rdrop_loss_and_its_hand_written_gradient_under_jax(losses_under_jax):
    """RDropLoss writes its gradient by hand (`losses.rdrop_cross_entropy`); under jax.jit and jax.grad it matches
    autodiff of the paper's formula in jax.numpy."""
    got = losses_under_jax["rdrop"][1]
    assert got["ours"]["value"] == pytest.approx(got["textbook"]["value"], rel=1e-5)
    np.testing.assert_allclose(got["ours"]["gradient"], got["textbook"]["gradient"], atol=1e-6)
    assert np.abs(np.asarray(got["textbook"]["gradient"])).max() > 1e-2


@pytest.mark.slow  # a fresh process on the JAX backend
def test_relative_positions_under_jax_compute_what_tensorflow_computes(losses_under_jax):
    """Relative position representations (Shaw et al.) on JAX without TensorFlow: a causal self-attention layer's
    outputs, its cached steps under jax.jit (the cache index traced, as in a decoding loop; 7 positions, k = 2)
    and, through jax.grad, the gradients of its relative key and value tables are TensorFlow's."""
    expected, got = losses_under_jax["relative"]
    np.testing.assert_allclose(got["full"], expected["full"], atol=1e-4)
    np.testing.assert_allclose(got["steps"], expected["full"], atol=1e-4)
    assert sorted(got["gradients"]) == ["relative_position_keys", "relative_position_values"]
    for name, gradient in expected["gradients"].items():
        np.testing.assert_allclose(got["gradients"][name], gradient, rtol=1e-4, atol=1e-5, err_msg=name)
        assert np.abs(gradient).max() > 1e-3, name


TRAIN_SCRIPT = """
from keras_transformer import cli
status = cli.main(["train-packed", sys.argv[1], "--epochs", sys.argv[2], "--length-multiple", "32"])  # two widths
assert status == 0, status
print(json.dumps({"done": True}))
"""


@pytest.mark.slow
def test_training_under_jax_resumes_and_reports_the_loss_tensorflow_computes(packed, copy_packed, tmp_path):
    """The GPU recipe's path on CPU: `keras-transformer train-packed` with XLA on JAX, one epoch, then a resume to a
    second in a new process. The epoch checkpoints load into the TensorFlow model, whose validation loss (numpy's
    label-smoothed cross-entropy of its logits) is the one the JAX run reported: as `model.fit` (and so `train`)
    reports it, each batch's token mean weighted by the batch's rows (padding rows included: XLA's batches have one
    shape per width). With training.ema_decay on: validation and checkpoints take the moving average on JAX too.
    With training.gradient_accumulation_steps: 2 (the GPU recipes reach larger batches so): `step` counts updates,
    one per 2 of a pass's 35 batches, so the first process stops with one batch's gradient accumulated, which the
    backup keeps for the second; and the logged learning rate is the Noam rate at that update, not at the batch."""
    import yaml

    from keras_transformer.config import TransformerConfig
    from keras_transformer.experiment import ExperimentConfig
    from keras_transformer.model import build_model
    from keras_transformer.packed.data import ARRAYS_FILE, load_arrays, make_batches
    workdir = copy_packed()
    experiment = yaml.safe_load((workdir / "experiment.yaml").read_text(encoding="utf-8"))
    experiment["training"].update(ema_decay=0.9, gradient_accumulation_steps=2)
    (workdir / "experiment.yaml").write_text(yaml.safe_dump(experiment), encoding="utf-8")
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}  # as docs/gpu.md: the resume compiles less
    run_jax(TRAIN_SCRIPT, workdir, 1, env=cache)
    run_jax(TRAIN_SCRIPT, workdir, 2, env=cache)
    with open(workdir / "history.csv", encoding="utf-8") as f:
        history = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in history] == [1, 2]
    config = TransformerConfig.from_yaml(workdir / "model.yaml")
    per_pass = len(make_batches(*load_arrays(workdir / ARRAYS_FILE)["train"], 512, length_multiple=32))
    assert per_pass % 2 == 1  # an epoch ends inside an update
    updates = [int(r["step"]) for r in history]
    assert updates == [per_pass // 2, 2 * per_pass // 2]  # updates, and the resumed optimizer went on counting
    settings = ExperimentConfig.from_dict(yaml.safe_load((workdir / "experiment.yaml").read_text())).training
    noam = noam_learning_rates(config, settings, updates)
    np.testing.assert_allclose([float(r["learning_rate"]) for r in history], noam, rtol=1e-5)
    assert float(history[1]["loss"]) < float(history[0]["loss"])
    assert float(history[1]["val_loss"]) < float(history[0]["val_loss"])

    model = build_model(config)
    sources, targets = load_arrays(workdir / ARRAYS_FILE)["valid"]
    batches = make_batches(sources, targets, 512, pad_id=config.pad_id, bos_id=config.bos_id,
                           eos_id=config.eos_id, length_multiple=32, pad_rows=True)
    eps = settings.label_smoothing
    for row in history:  # the first process's epoch and the resumed one's
        model.load_weights(str(workdir / "checkpoints" / f"ckpt-{int(row['epoch']):04d}.weights.h5"))
        total = rows = 0.0
        for source, target_input, labels in batches:
            log_q = _log_softmax(np.asarray(model({"source": source, "target": target_input}, training=False),
                                            "float64"))
            target = np.full(log_q.shape, eps / log_q.shape[-1]) + (1 - eps) * np.eye(log_q.shape[-1])[labels]
            per_token = -(target * log_q).sum(-1)
            total += per_token[labels != 0].mean() * len(labels)
            rows += len(labels)
        assert total / rows == pytest.approx(float(row["val_loss"]), rel=1e-4)
    raw, average = backup_weights(workdir, 0.9, 2)  # the last checkpoint holds the averages the backup keeps
    for got, expected in zip(model.trainable_variables, average):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(raw[0], average[0], atol=1e-4)


DRAWS_SCRIPT = """
import jax
from keras_transformer.decoding.sampling import uniform
inputs = np.load(sys.argv[1])
words = [inputs[name] for name in ("seed", "keys", "samples", "steps")]
print(json.dumps({"eager": np.asarray(uniform(*words)).tolist(), "jit": np.asarray(jax.jit(uniform)(*words)).tolist()}))
"""


def _draws_inputs():
    return dict(seed=np.array([0, 1, 2**31 - 1], "int32")[:, None, None, None],
                keys=np.array([0, 1, 2, 977, 2**31 - 1], "int32")[None, :, None, None],
                samples=np.arange(3, dtype="int32")[None, None, :, None],
                steps=np.arange(40, dtype="int32")[None, None, None, :])


@pytest.mark.slow  # a fresh process on the JAX backend
def test_sampling_draws_are_bit_identical_under_jax(losses_under_jax):
    """Sampling's uniform numbers (a 32-bit integer hash of seed, row key, sample and step) are numpy's copy of
    the hash bit for bit under JAX, eagerly and under jax.jit, as they are under TensorFlow and XLA
    (test_sampling.py): a seeded sample does not depend on the backend."""
    from factories import sampling_uniform

    inputs, got = losses_under_jax["draws"]
    expected = sampling_uniform(*(inputs[name] for name in ("seed", "keys", "samples", "steps"))).astype("float32")
    for mode in ("eager", "jit"):
        np.testing.assert_array_equal(np.array(got[mode], "float32"), expected)


SHIPPED_SCRIPT = """
import pathlib
from keras_transformer.packed import scoring as arrays
from keras_transformer.engines.packed import sentencepiece_processors
from keras_transformer.model import build_model
from keras_transformer.workdir.checkpoints import read_model_file
extra = pathlib.Path(sys.argv[1]) / "assets.extra"
config, options = read_model_file(extra / "model.yaml")
model = build_model(config)
model.load_weights(str(extra / "model.weights.h5"))
source, target = sentencepiece_processors(extra / "vocab")
lines = json.loads(sys.argv[2])
print(json.dumps(arrays.translate_lines(model, lines, source, target, options=options)))
"""


@pytest.mark.slow
def test_shipped_model_translates_alike_under_jax_and_from_its_saved_model(multi30k_dir, shipped_served):
    """The shipped EN->DE model's Keras weights (assets.extra) decode on JAX without TensorFlow as its SavedModel
    does, and the translations are real German (sentence BLEU against the references)."""
    import gzip

    import sacrebleu
    with gzip.open(multi30k_dir / "val.en.gz", "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(24)]
    with gzip.open(multi30k_dir / "val.de.gz", "rt", encoding="utf-8") as f:
        references = [next(f).strip() for _ in range(24)]
    on_jax = run_jax(SHIPPED_SCRIPT, SHIPPED_DE, json.dumps(lines))
    # The SavedModel decoded the first 12 (conftest's `shipped_served`, shared with the golden test; JAX's cost is
    # mostly its compilations, so it translates all 24 for the BLEU below).
    compared = lines[:12]
    from_saved_model = shipped_served["val"]
    assert len(from_saved_model) == len(compared)
    same = sum(a == b for a, b in zip(on_jax, from_saved_model))
    assert same >= len(compared) - 1, list(zip(on_jax, from_saved_model))  # a near tie may flip one beam
    assert sacrebleu.corpus_bleu(on_jax, [references]).score > 30
