"""Loss, metric, schedule and optimizer against hand computations."""

import json
import math

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.experiment import TrainingSection


def hand_loss(labels, logits, eps, pad_id=0):
    """Label-smoothed cross-entropy written the long way: explicit smoothed targets and log-softmax."""
    total, count = 0.0, 0
    vocab = logits.shape[-1]
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            if labels[b, t] == pad_id:
                continue
            z = logits[b, t].astype(np.float64)
            log_p = z - (np.log(np.sum(np.exp(z - z.max()))) + z.max())
            q = np.full(vocab, eps / vocab)
            q[labels[b, t]] += 1 - eps
            total += -np.sum(q * log_p)
            count += 1
    return total / count


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_hand_computation_and_ignores_pads(eps):
    rng = np.random.default_rng(0)
    labels = np.array([[5, 2, 7, 0, 0], [1, 3, 0, 0, 0]])
    logits = rng.normal(size=(2, 5, 9)).astype("float32") * 3
    loss = kt.LabelSmoothedCrossEntropy(eps, pad_id=0)
    assert float(loss(labels, logits)) == pytest.approx(hand_loss(labels, logits, eps), rel=1e-5)
    # Pad positions may hold anything without changing the loss.
    noisy = logits.copy()
    noisy[labels == 0] = 100.0
    assert float(loss(labels, noisy)) == pytest.approx(float(loss(labels, logits)), rel=1e-6)


def test_label_smoothing_zero_equals_keras_sparse_crossentropy_on_unpadded_tokens():
    rng = np.random.default_rng(1)
    labels = rng.integers(1, 9, size=(3, 4))
    logits = rng.normal(size=(3, 4, 9)).astype("float32")
    ours = float(kt.LabelSmoothedCrossEntropy(0.0, pad_id=0)(labels, logits))
    reference = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits))
    assert ours == pytest.approx(reference, rel=1e-5)


def test_loss_and_metric_round_trip_configs():
    loss = kt.LabelSmoothedCrossEntropy(0.2, pad_id=3)
    clone = keras.saving.deserialize_keras_object(json.loads(json.dumps(keras.saving.serialize_keras_object(loss))))
    assert (clone.label_smoothing, clone.pad_id) == (0.2, 3)
    metric = kt.MaskedAccuracy(pad_id=3)
    assert kt.MaskedAccuracy.from_config(metric.get_config()).pad_id == 3
    with pytest.raises(ValueError, match="label_smoothing"):
        kt.LabelSmoothedCrossEntropy(1.5)


def test_masked_accuracy_counts_only_real_tokens():
    metric = kt.MaskedAccuracy(pad_id=0)
    labels = np.array([[4, 5, 0], [6, 0, 0]])
    predictions = np.array([[4, 9, 5], [6, 1, 0]])  # two of three real tokens right
    metric.update_state(labels, keras.ops.one_hot(predictions, 10))
    assert float(metric.result()) == pytest.approx(2 / 3)
    metric.reset_state()
    assert float(metric.result()) == 0.0


def test_masked_accuracy_predicts_the_first_index_of_the_largest_logit_as_argmax_does():
    rng = np.random.default_rng(0)
    logits = rng.integers(-2, 3, (4, 9, 6)).astype("float32")  # five values: ties at the maximum are common
    labels = rng.integers(1, 6, (4, 9))
    labels[:, 7:] = 0  # pads
    metric = kt.MaskedAccuracy(pad_id=0)
    metric.update_state(labels, logits)
    real = labels != 0
    expected = np.sum((logits.argmax(-1) == labels) & real) / np.sum(real)  # numpy: the first maximum wins
    assert float(metric.result()) == pytest.approx(expected, rel=1e-6)
    attains_maximum = np.sum((np.take_along_axis(logits, labels[..., None], -1)[..., 0] == logits.max(-1)) & real)
    assert attains_maximum / np.sum(real) > expected + 0.05  # counting every label that ties would differ


@pytest.mark.parametrize("step", [1, 100, 4000, 4001, 100000])
def test_noam_schedule_matches_formula(step):
    schedule = kt.NoamSchedule(d_model=512, warmup_steps=4000)
    expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)


def test_noam_schedule_peaks_at_warmup_and_round_trips():
    schedule = kt.NoamSchedule(d_model=256, warmup_steps=100, scale=2.0)
    values = [float(schedule(s)) for s in range(1, 400)]
    assert int(np.argmax(values)) + 1 == 100
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert float(clone(250)) == pytest.approx(float(schedule(250)))
    assert float(schedule(0)) == float(schedule(1))
    with pytest.raises(ValueError, match="warmup_steps"):
        kt.NoamSchedule(256, warmup_steps=0)


def test_linear_cooldown_scales_the_schedule_down_to_zero_and_round_trips():
    base = kt.NoamSchedule(d_model=256, warmup_steps=100, scale=2.0)
    cooled = kt.LinearCooldown(base, start=300, steps=200)
    for step, factor in ((1, 1.0), (299, 1.0), (300, 1.0), (350, 0.75), (499, 0.005), (500, 0.0), (900, 0.0)):
        expected = 2.0 * 256 ** -0.5 * min(step ** -0.5, step * 100 ** -1.5) * factor
        assert float(cooled(step)) == pytest.approx(expected, rel=1e-5, abs=1e-12)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(cooled))
    assert isinstance(clone.schedule, kt.NoamSchedule)
    assert [float(clone(s)) for s in (250, 400)] == pytest.approx([float(cooled(s)) for s in (250, 400)])
    optimizer = kt.make_optimizer(kt.TransformerConfig.preset("tiny", vocab_size=100), TrainingSection(),
                                  cooldown=(300, 200))
    assert isinstance(optimizer._learning_rate, kt.LinearCooldown) and optimizer._learning_rate.steps == 200
    with pytest.raises(ValueError, match="steps"):
        kt.LinearCooldown(base, start=10, steps=0)


def test_make_optimizer_is_the_papers_adam_with_the_training_settings():
    config = kt.TransformerConfig.preset("base", vocab_size=100)
    optimizer = kt.make_optimizer(config, TrainingSection())
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(optimizer._learning_rate, kt.NoamSchedule)
    assert optimizer._learning_rate.warmup_steps == 4000  # null: the paper's
    assert float(optimizer._learning_rate(4000)) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    assert optimizer.clipnorm is None and not optimizer.use_ema
    tuned = kt.make_optimizer(config, TrainingSection(gradient_accumulation_steps=4, beta_1=0.8, beta_2=0.9,
                                                      epsilon=1e-6, clipnorm=0.5, ema_decay=0.99, warmup_steps=100))
    assert (tuned.gradient_accumulation_steps, tuned.beta_1, tuned.beta_2, tuned.epsilon, tuned.clipnorm) == \
        (4, 0.8, 0.9, 1e-6, 0.5)
    assert tuned.use_ema and tuned.ema_momentum == 0.99 and tuned._learning_rate.warmup_steps == 100
    assert math.isclose(float(kt.make_optimizer(config, TrainingSection(learning_rate_scale=2.0))._learning_rate(10)),
                        2 * float(optimizer._learning_rate(10)))


@pytest.mark.slow  # two optimizers traced and stepped side by side (7 CPU s)
@pytest.mark.parametrize("settings", [{}, {"gradient_accumulation_steps": 2, "use_ema": True, "ema_momentum": 0.9}])
def test_adam_updates_as_keras_adam_does_with_fewer_ops_in_the_traced_update(settings):
    """`kt.optimizers.Adam` (what `make_optimizer` returns) against `keras.optimizers.Adam` given the same
    gradients: the same weights and moments bit for bit after every update, eagerly and in a graph, with
    variables of two dtypes (each reads its own step size); the traced update holds at least ten ops fewer for
    each variable beyond the first of its dtype (Keras computes the step size for each)."""
    import tensorflow as tf

    from keras_transformer.trainer.optimizers import Adam

    rng = np.random.default_rng(3)
    shapes = [((4, 3), "float32"), ((5,), "float32"), ((2, 2), "float64")] * 4
    gradients = [[rng.normal(size=shape).astype(dtype) for shape, dtype in shapes] for _ in range(6)]

    def run(cls, graph):
        weights = [keras.Variable(np.ones(shape, dtype), dtype=dtype) for shape, dtype in shapes]
        optimizer = cls(learning_rate=kt.NoamSchedule(16, warmup_steps=4), beta_2=0.98, epsilon=1e-9, **settings)
        optimizer.build(weights)

        def apply(grads):
            optimizer.apply(grads, weights)

        apply = tf.function(apply) if graph else apply
        for grads in gradients:
            apply([tf.constant(g) for g in grads])
        operations = None
        if graph:  # the ops of the update's graph and of the functions it calls (a `cond`'s branches)
            graph_def = apply.get_concrete_function([tf.constant(g) for g in gradients[0]]).graph.as_graph_def()
            operations = len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
        return [v.numpy() for v in weights + list(optimizer.variables)], operations

    for graph in (False, True):
        (ours, our_ops), (keras_adam, keras_ops) = run(Adam, graph), run(keras.optimizers.Adam, graph)
        assert len(ours) == len(keras_adam)
        for got, expected in zip(ours, keras_adam, strict=True):
            np.testing.assert_array_equal(got, expected)
        assert not np.allclose(ours[0], 1.0)  # the weights moved
        if graph:
            assert keras_ops - our_ops >= 10 * (len(shapes) - 2), (our_ops, keras_ops)  # 169 and 189 fewer when written
    optimizer = kt.make_optimizer(kt.TransformerConfig.preset("tiny", vocab_size=100), TrainingSection(), **settings)
    assert isinstance(optimizer, Adam)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(clone) is Adam and clone.get_config() == optimizer.get_config()


def value_and_gradient(loss, labels, logits):
    """`(loss value, d loss / d logits)` by TensorFlow's autodiff (which uses a hand-written gradient if given)."""
    import tensorflow as tf
    with tf.GradientTape() as tape:
        tape.watch(logits)
        value = loss(labels, logits)
    return float(value), tape.gradient(value, logits).numpy()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_gradient_matches_autodiff_of_the_one_hot_formula(eps):
    """The loss's gradient is written by hand (losses.smoothed_cross_entropy); autodiff of the textbook formula
    agrees."""
    import tensorflow as tf
    rng = np.random.default_rng(0)
    vocab = 50
    logits = tf.constant(rng.normal(size=(3, 7, vocab)).astype("float32") * 3)
    labels = rng.integers(1, vocab, (3, 7)).astype("int32")
    labels[0, 5:] = 0  # pads
    labels = tf.constant(labels)

    def reference(labels, logits):
        target = tf.one_hot(labels, vocab) * (1 - eps) + eps / vocab
        per_token = -tf.reduce_sum(target * tf.nn.log_softmax(logits), -1)
        weights = tf.cast(labels != 0, tf.float32)
        return tf.reduce_sum(per_token * weights) / tf.reduce_sum(weights)

    gradients = [value_and_gradient(fn, labels, logits) for fn in (kt.LabelSmoothedCrossEntropy(eps, pad_id=0),
                                                                   reference)]
    assert gradients[0][0] == pytest.approx(gradients[1][0], rel=1e-6)
    np.testing.assert_allclose(gradients[0][1], gradients[1][1], atol=1e-7)
    assert np.abs(gradients[1][1]).max() > 1e-3  # a real gradient, not zeros on both sides


def hand_symmetric_kl(a, b):
    """KL(p || q) + KL(q || p) of two logit vectors, in float64 with explicit softmaxes."""
    p = np.exp(a - a.max()) / np.exp(a - a.max()).sum()
    q = np.exp(b - b.max()) / np.exp(b - b.max()).sum()
    return float(np.sum(p * np.log(p / q)) + np.sum(q * np.log(q / p)))


def rdrop_batch(seed=0):
    """Two examples, each in two adjacent rows with different logits (two dropout passes)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.array([[5, 2, 7, 0], [1, 3, 0, 0]]), 2, axis=0)
    logits = (rng.normal(size=(4, 4, 9)) * 2).astype("float32")
    return labels, logits


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_rdrop_loss_is_the_mean_cross_entropy_plus_a_quarter_alpha_times_the_pairs_symmetric_kl(eps):
    labels, logits = rdrop_batch()
    divergences = [hand_symmetric_kl(logits[2 * i, t].astype(np.float64), logits[2 * i + 1, t].astype(np.float64))
                   for i in range(2) for t in range(4) if labels[2 * i, t] != 0]
    expected = hand_loss(labels, logits, eps) + 5.0 / 4 * np.mean(divergences)
    assert float(kt.RDropLoss(5.0, eps, pad_id=0)(labels, logits)) == pytest.approx(expected, rel=1e-5)
    # Two identical rows (no dropout, as in evaluation): the plain label-smoothed loss.
    same = np.repeat(logits[::2], 2, axis=0)
    assert float(kt.RDropLoss(5.0, eps)(labels, same)) == pytest.approx(
        float(kt.LabelSmoothedCrossEntropy(eps)(labels, same)), rel=1e-6)
    # Pads may hold anything.
    noisy = logits.copy()
    noisy[labels == 0] = 50.0
    assert float(kt.RDropLoss(5.0, eps)(labels, noisy)) == pytest.approx(expected, rel=1e-5)


def test_rdrop_loss_gradient_matches_autodiff_of_the_textbook_formula():
    """The loss's gradient is written by hand (losses.rdrop_cross_entropy); autodiff of the plain formula agrees."""
    import tensorflow as tf
    labels, logits = rdrop_batch(1)
    labels, logits = tf.constant(labels), tf.constant(logits)

    def reference(labels, logits):
        log_probs = tf.nn.log_softmax(logits)
        target = tf.one_hot(labels, 9) * 0.9 + 0.1 / 9
        weights = tf.cast(labels != 0, tf.float32)
        cross_entropy = tf.reduce_sum(-tf.reduce_sum(target * log_probs, -1) * weights) / tf.reduce_sum(weights)
        p, q = tf.exp(log_probs[0::2]), tf.exp(log_probs[1::2])
        divergence = tf.reduce_sum(p * (log_probs[0::2] - log_probs[1::2]) + q * (log_probs[1::2] - log_probs[0::2]),
                                   -1)
        pair_weights = weights[0::2]
        return cross_entropy + 3.0 / 4 * tf.reduce_sum(divergence * pair_weights) / tf.reduce_sum(pair_weights)

    results = [value_and_gradient(fn, labels, logits) for fn in (kt.RDropLoss(3.0, 0.1, pad_id=0), reference)]
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-6)
    assert np.abs(results[1][1]).max() > 1e-3


def test_rdrop_loss_round_trips_and_names_a_bad_alpha():
    loss = kt.RDropLoss(2.5, 0.2, pad_id=3)
    clone = keras.saving.deserialize_keras_object(json.loads(json.dumps(keras.saving.serialize_keras_object(loss))))
    assert (clone.alpha, clone.label_smoothing, clone.pad_id) == (2.5, 0.2, 3)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        kt.RDropLoss(-1.0)
