"""The training loss computed a vocabulary block at a time (`training.chunked_loss`): the same losses, argmax and
gradients as the whole logits give, and a training step of the same loss and gradients, tied or untied, with an
output bias, label smoothing and pads, full or LoRA."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from factories import tiny_config

from keras_transformer.errors import ConfigError
from keras_transformer.experiment import TrainingSection
from keras_transformer.layers.lora import enable_lora
from keras_transformer.model import build_model
from keras_transformer.trainer import chunked_loss
from keras_transformer.trainer.chunked_loss import ChunkedLossTransformer, chunked_cross_entropy
from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy, smoothed_cross_entropy

TOLERANCE = 1e-5  # relative, float32 sums in another order


def _close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert np.abs(got - want).max() <= TOLERANCE * np.abs(want).max(), np.abs(got - want).max()


@pytest.mark.parametrize("vocab_axis,bias", [(0, False), (1, True)])
def test_blocks_give_the_whole_logits_losses_argmax_and_gradients(vocab_axis, bias):
    rng = np.random.default_rng(vocab_axis)
    vocab, width = 37, 8  # four blocks and five entries
    hidden = tf.constant(rng.normal(size=(3, 5, 6)), "float32")
    kernel = tf.constant(rng.normal(size=(vocab, 6) if vocab_axis == 0 else (6, vocab)), "float32")
    offset = tf.constant(rng.normal(size=(vocab,)), "float32") if bias else None
    labels = rng.integers(0, vocab, (3, 5))
    labels[1, -2:] = 1  # pads: the loss counts them per token, the mean leaves them out
    upstream = tf.constant(rng.normal(size=(3, 5)), "float32")
    inputs = [hidden, kernel] + ([offset] if bias else [])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        logits = tf.matmul(hidden, kernel, transpose_b=vocab_axis == 0) + (offset if bias else 0.0)
        want = smoothed_cross_entropy(labels, logits, 0.1)
        got, predictions = chunked_cross_entropy(labels, hidden, kernel, offset, 0.1, vocab_axis=vocab_axis,
                                                 block=width)
        want_total, got_total = tf.reduce_sum(want * upstream), tf.reduce_sum(got * upstream)
    _close(got, want)
    np.testing.assert_array_equal(predictions, np.argmax(logits, axis=-1))
    for got_gradient, want_gradient in zip(tape.gradient(got_total, inputs), tape.gradient(want_total, inputs)):
        _close(got_gradient, want_gradient)


def test_a_frozen_kernel_gets_no_gradient_and_one_block_holds_a_small_vocabulary():
    hidden = tf.constant(np.random.default_rng(0).normal(size=(2, 3, 4)), "float32")
    kernel = tf.constant(np.random.default_rng(1).normal(size=(4, 5)), "float32")
    with tf.GradientTape() as tape:
        tape.watch([hidden, kernel])
        losses, _ = chunked_cross_entropy(np.zeros((2, 3)), hidden, kernel, kernel_gradient=False)
        want = smoothed_cross_entropy(np.zeros((2, 3)), tf.matmul(hidden, kernel))
    _close(losses, want)
    assert tape.gradient(losses, [hidden, kernel])[1] is None


@pytest.mark.parametrize("tie,lora", [("all", False), ("none", False), ("all", True)])
def test_a_training_step_has_the_whole_logits_loss_and_gradients(tie, lora):
    config = tiny_config(vocab_size=45, tie_embeddings=tie, output_bias=tie == "none", dropout=0.0)
    model = build_model(config)
    chunked = ChunkedLossTransformer(model.input, model.output, name=model.name)
    assert [w.path for w in chunked.weights] == [w.path for w in model.weights]  # the same checkpoints
    if lora:
        enable_lora(chunked, 2, 4.0, ["attention", "feed_forward"])
        for variable in chunked.trainable_variables:  # adapters of B = 0 would give A no gradient
            variable.assign(np.random.default_rng(2).normal(0, 0.1, variable.shape))
    loss = LabelSmoothedCrossEntropy(0.1, pad_id=config.pad_id)
    chunked.compile(loss=loss, jit_compile=False)
    rng = np.random.default_rng(0)
    inputs = {"source": rng.integers(3, 45, (4, 6)).astype("int32"),
              "target": rng.integers(3, 45, (4, 7)).astype("int32")}
    labels = rng.integers(3, 45, (4, 7))
    labels[:2, -3:] = config.pad_id
    with tf.GradientTape(persistent=True) as tape:
        want = loss(labels, model(inputs, training=True))
        hidden = chunked(inputs, training=True)
        got = chunked.compute_loss(inputs, labels, hidden, training=True)
    assert hidden.shape == (4, 7, config.d_model)
    _close(got, want)
    variables = chunked.trainable_variables
    assert all("lora_kernel" in v.path for v in variables) if lora else len(variables) == len(model.weights)
    for got_gradient, want_gradient in zip(tape.gradient(got, variables), tape.gradient(want, variables)):
        _close(tf.convert_to_tensor(got_gradient), tf.convert_to_tensor(want_gradient))
    _close(chunked(inputs), model(inputs))  # outside training: the logits


def test_the_setting_is_checked_and_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match="training.chunked_loss must be true, false or 'auto'"):
        TrainingSection(chunked_loss="yes").validate()
    assert chunked_loss.applies("auto", 256206, lora=True) and chunked_loss.applies(True, 256206)
    assert not chunked_loss.applies("auto", 8000, lora=True) and not chunked_loss.applies("auto", 256206)
    assert not chunked_loss.applies("auto", 256206, rdrop_alpha=5.0, lora=True)
    with pytest.raises(ConfigError, match=r"^training.chunked_loss: true does not work with R-Drop"):
        chunked_loss.applies(True, 8000, rdrop_alpha=5.0)
    with pytest.raises(ConfigError, match="own loss"):
        chunked_loss.applies(True, 8000, loss=keras.losses.MeanSquaredError())
