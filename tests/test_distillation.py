"""Word-level distillation (keras_transformer.trainer.distillation): the teacher's distributions, the loss, and a
student."""

import csv

import keras
import numpy as np
import pytest

from keras_transformer import TransformerConfig, build_model, cli
from keras_transformer.packed.data import ARRAYS_FILE, make_batches, pack_labels, save_arrays
from keras_transformer.packed.training import train_arrays
from keras_transformer.trainer import distillation
from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy
from keras_transformer.trainer.schedules import NoamSchedule

# Its module fixtures are expensive: `make test` (--dist loadgroup) runs the whole file on one worker, so they
# are built once.
pytestmark = pytest.mark.xdist_group("test_distillation")


def _pairs(seed, count, vocab=50, longest=9):
    rng = np.random.default_rng(seed)
    return ([rng.integers(4, vocab, rng.integers(1, longest)) for _ in range(count)],
            [rng.integers(4, vocab, rng.integers(1, longest)) for _ in range(count)])


def _softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.slow  # an ensemble's top-k over 30 pairs twice (6 CPU s)
def test_teacher_is_the_members_mean_distribution_truncated_to_its_top_k():
    """The teacher's top-k is the ensemble members' mean distribution, its k most likely ids with their
    probabilities, the same as the full distribution truncated."""
    config = TransformerConfig.preset("tiny", vocab_size=50)
    keras.utils.set_random_seed(1)
    members = [build_model(config), build_model(config.replace(norm_first=not config.norm_first))]
    sources, targets = _pairs(0, 30)
    full_ids, full_p = distillation.teacher_top_k(members, sources, targets, top_k=50, tokens_per_batch=64)
    ids, p = distillation.teacher_top_k(members, sources, targets, top_k=5, tokens_per_batch=64)
    for index in (0, 7, 29):  # each pair alone, unpadded, through each member: the mean of the two softmaxes
        source = np.array([list(sources[index]) + [3]])
        target_input = np.array([[2] + list(targets[index])])
        mean = np.mean([_softmax(m({"source": source, "target": target_input}, training=False))[0]
                        for m in members], axis=0)
        assert full_ids[index].shape == (len(targets[index]) + 1, 50)
        dense = np.zeros_like(mean)
        np.put_along_axis(dense, full_ids[index], full_p[index], -1)
        np.testing.assert_allclose(dense, mean, atol=1e-6)
        expected = np.sort(mean, -1)[:, ::-1][:, :5]  # the five largest, most likely first
        np.testing.assert_allclose(p[index], expected, atol=1e-6)
        np.testing.assert_array_equal(ids[index], full_ids[index][:, :5])
    with pytest.raises(ValueError, match="top_k"):
        distillation.teacher_top_k(members, sources, targets, top_k=51)


def test_distillation_loss_against_numpy():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 4, 7)).astype("float32")
    labels = np.array([[5, 2, 3, 0], [1, 3, 0, 0]])
    ids = rng.integers(0, 7, (2, 4, 3))
    ids[..., 1] = (ids[..., 0] + 1) % 7  # distinct ids per position
    ids[..., 2] = (ids[..., 0] + 2) % 7
    probabilities = rng.uniform(0.1, 0.5, (2, 4, 3))  # unnormalized, as a top-k cut leaves them
    eps, w = 0.1, 0.3
    log_q = np.log(_softmax(logits))
    smoothed = np.full((2, 4, 7), eps / 7) + (1 - eps) * np.eye(7)[labels]
    reference = -(smoothed * log_q).sum(-1)
    teacher_p = probabilities / probabilities.sum(-1, keepdims=True)
    teacher = -(teacher_p * np.take_along_axis(log_q, ids, -1)).sum(-1)
    mask = labels != 0
    expected = ((1 - w) * reference + w * teacher)[mask].mean()
    loss = distillation.DistillationLoss(eps, w)
    packed = pack_labels(labels, ids, probabilities)
    assert float(loss(packed, logits)) == pytest.approx(expected, rel=1e-5)
    # The gradient is written by hand: softmax minus the mixed target, over the non-pad positions.
    import tensorflow as tf
    z = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(z)
        value = loss(packed, z)
    soft = np.zeros((2, 4, 7))
    np.put_along_axis(soft, ids, teacher_p, -1)
    expected_gradient = (_softmax(logits) - (1 - w) * smoothed - w * soft) * mask[..., None] / mask.sum()
    np.testing.assert_allclose(tape.gradient(value, z).numpy(), expected_gradient, atol=1e-6)
    # Plain labels (validation) give the label-smoothed loss alone, as an undistilled run reports it.
    assert float(loss(labels, logits)) == pytest.approx(float(LabelSmoothedCrossEntropy(eps)(labels, logits)),
                                                       rel=1e-6)
    assert float(loss(labels, logits)) == pytest.approx(reference[mask].mean(), rel=1e-5)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert (restored.label_smoothing, restored.distill_weight) == (eps, w)
    assert float(restored(packed, logits)) == pytest.approx(expected, rel=1e-5)
    metric = distillation.DistillationAccuracy()
    metric.update_state(packed, logits)
    assert float(metric.result()) == pytest.approx((logits.argmax(-1) == labels)[mask].mean())
    with pytest.raises(ValueError, match="distill_weight"):
        distillation.DistillationLoss(0.1, 1.5)


def _workdir(folder, config, sources, targets, valid, epochs):
    folder.mkdir()
    config.save_yaml(folder / "model.yaml")
    (folder / "experiment.yaml").write_text(  # as pack writes it; the text files themselves are not read
        f"training: {{epochs: {epochs}, seed: 5, warmup_steps: 400}}\n"
        "data: {kind: text, train_source: train.en, train_target: train.de, tokens_per_batch: 256}\n",
        encoding="utf-8")
    save_arrays(folder / ARRAYS_FILE, {"train": (sources, targets), "valid": valid})
    return folder


@pytest.fixture(scope="module")
def student(trained_copy_model, tmp_path_factory):
    """`(workdir, config, result)`: a student trained by `train_arrays` towards the copy model's top-4
    distributions alone, its references random noise. Read-only (it is also the weights another run starts from).

    The student has one layer each side (half the tracing of the teacher's two): a student need not have its
    teacher's shape, and this one learns the task in five epochs.
    """
    from keras_transformer.data.synthetic import synthetic_pairs

    teacher, config = trained_copy_model
    config = config.replace(num_layers=1)
    sources, targets = synthetic_pairs("copy", num_examples=1024, vocab_size=config.vocab_size, min_length=3,
                                       max_length=10, seed=7)
    valid = synthetic_pairs("copy", num_examples=128, vocab_size=config.vocab_size, min_length=3, max_length=10,
                            seed=8)
    workdir = _workdir(tmp_path_factory.mktemp("student") / "student", config, sources, targets, valid, epochs=5)
    ids, p = distillation.teacher_top_k([teacher], sources, targets, top_k=4)
    distillation.save_teacher(workdir / distillation.TEACHER_FILE, ids, p, members=["copy"])
    # Random references: they hold nothing about copying, so only the teacher can teach it.
    rng = np.random.default_rng(0)
    noise = [rng.integers(4, config.vocab_size, len(t)) for t in targets]
    save_arrays(workdir / ARRAYS_FILE, {"train": (sources, noise), "valid": valid})
    result = train_arrays(workdir, jit_compile=False, teacher=workdir / distillation.TEACHER_FILE,
                          distill_weight=1.0, initial_updates=1000)
    return workdir, config, result


@pytest.mark.slow
def test_a_student_learns_the_task_from_the_teacher_alone(student):
    """Slow: a student trained for epochs on the teacher's distributions alone; learning needs the epochs."""
    workdir, config, result = student
    with open(workdir / "history.csv", encoding="utf-8") as f:
        history = list(csv.DictReader(f))
    accuracy = [float(r["val_masked_accuracy"]) for r in history]
    assert accuracy[0] < 0.3 and accuracy[-1] > 0.45  # copying, learned from the teacher alone
    assert float(history[-1]["val_loss"]) < float(history[0]["val_loss"])
    # The schedule went on from update 1000 instead of warming up again.
    assert int(history[-1]["step"]) == 1000 + result["updates"]
    schedule = NoamSchedule(config.d_model, 400)  # the workdir's training.warmup_steps, the default scale
    assert float(history[-1]["learning_rate"]) == pytest.approx(float(schedule(1000 + result["updates"])), rel=1e-5)


@pytest.mark.slow
def test_init_weights_start_a_run_from_another_models_weights(student, tmp_path):
    """Slow: two short training runs, from random and from the student's weights, compared by their accuracy."""
    import warnings

    from keras_transformer.data.synthetic import synthetic_pairs

    workdir, config, _ = student
    pairs = synthetic_pairs("copy", num_examples=128, vocab_size=config.vocab_size, min_length=3, max_length=10,
                            seed=9)
    weights = sorted((workdir / "checkpoints").glob("ckpt-*.weights.h5"))[-1]  # the student's, which copies
    accuracy = {}
    for name, init in (("random", None), ("init", weights)):
        run = _workdir(tmp_path / name, config, *pairs, pairs, epochs=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_arrays(run, jit_compile=False, init_weights=init)  # warm-up: tiny steps
        assert not [w for w in caught if "Skipping variable loading" in str(w.message)]
        with open(run / "history.csv", encoding="utf-8") as f:
            accuracy[name] = float(next(csv.DictReader(f))["val_masked_accuracy"])
    # A few warm-up steps teach a fresh model next to nothing; started from the copying student it copies.
    assert accuracy["random"] < 0.3 and accuracy["init"] > 0.5, accuracy


def test_teacher_files_and_members_are_checked(tmp_path, capsys):
    config = TransformerConfig.preset("tiny", vocab_size=50)
    sources, targets = _pairs(1, 12)
    ids, p = distillation.teacher_top_k(build_model(config), sources, targets, top_k=3)
    path = tmp_path / "teacher.npz"
    distillation.save_teacher(path, ids, p, top_k=3)
    read_ids, read_p, metadata = distillation.load_teacher(path, targets)
    assert metadata == {"top_k": 3} and all(np.array_equal(a, b) for a, b in zip(read_ids, ids))
    assert all(np.allclose(a, b, atol=1e-3) for a, b in zip(read_p, p))  # stored as float16
    with pytest.raises(ValueError, match="another workdir"):
        distillation.load_teacher(path, targets[:-1])
    with pytest.raises(FileNotFoundError, match="No teacher distributions"):
        distillation.load_teacher(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="teacher distributions for 11"):
        make_batches(sources, targets, 64, teacher=(ids[:-1], p[:-1]))
    # Batches carry the teacher of their own pairs, whatever the shuffle.
    batches, chunks = make_batches(sources, targets, 64, teacher=(ids, p), rng=np.random.default_rng(0),
                                          return_indices=True)
    for (_, _, packed), chunk in zip(batches, chunks):
        for row, index in enumerate(chunk):
            n = len(targets[index]) + 1
            np.testing.assert_array_equal(packed[row, :n, 0], list(targets[index]) + [3])
            np.testing.assert_array_equal(packed[row, :n, 1:4], ids[index])
            assert not packed[row, n:].any()
    # A teacher with another vocabulary is refused before anything is loaded, through the command line too.
    student, other = tmp_path / "student", tmp_path / "other"
    for folder, text in ((student, "a"), (other, "b")):
        (folder / "data" / "vocab").mkdir(parents=True)
        (folder / "data" / "vocab" / "tokenizer.json").write_text(text, encoding="utf-8")
    assert cli.main(["distill-targets", str(student), "--member", str(other), str(other / "w.weights.h5")]) == 2
    assert "different vocabulary" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="Checkpoint not found"):
        train_arrays(_workdir(tmp_path / "run", config, sources, targets, (sources, targets), 1),
                     init_weights=tmp_path / "none.weights.h5", jit_compile=False)
