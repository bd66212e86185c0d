"""Label-smoothed cross-entropy averaged over non-pad target tokens (section 5.4)."""

import keras
from keras import ops
from keras.src.losses.loss import scale_loss_for_distribution


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against (1 - eps) * one_hot(y) + eps / V, from logits.

    The smoothed target puts eps/V on every class (including the true one), the
    convention of `keras.losses.CategoricalCrossentropy(label_smoothing=eps)`.
    The loss is computed without a one-hot tensor:
    `logsumexp(z) - (1 - eps) * z_y - eps * mean(z)`, and averaged over the
    target positions whose label is not `pad_id` (times any sample weight).

    Args:
        label_smoothing: eps in [0, 1); 0.1 in the paper.
        pad_id: label id excluded from the loss.

    Example:

    >>> import numpy as np
    >>> loss = LabelSmoothedCrossEntropy(0.0, pad_id=0)
    >>> logits = np.log(np.array([[[0.1, 0.9], [0.5, 0.5]]], "float32"))
    >>> round(float(loss(np.array([[1, 0]]), logits)), 4)  # the pad position is ignored
    0.1054
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy", **kwargs):
        kwargs.pop("reduction", None)
        super().__init__(name=name, reduction="sum_over_batch_size", **kwargs)
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
        self.label_smoothing = float(label_smoothing)
        self.pad_id = int(pad_id)

    def call(self, y_true, y_pred):
        """Per-token losses `(B, T)` (pads included; `__call__` masks them)."""
        logits = ops.cast(y_pred, "float32")  # (B, T, V)
        labels = ops.cast(y_true, "int32")  # (B, T)
        log_normalizer = ops.logsumexp(logits, axis=-1)  # (B, T)
        true_logit = ops.squeeze(ops.take_along_axis(logits, ops.expand_dims(labels, -1), axis=-1), -1)
        eps = self.label_smoothing
        loss = log_normalizer - (1.0 - eps) * true_logit
        if eps > 0:
            loss = loss - eps * ops.mean(logits, axis=-1)
        return loss

    def __call__(self, y_true, y_pred, sample_weight=None):
        per_token = self.call(y_true, y_pred)
        weights = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id), "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            while len(sample_weight.shape) < len(weights.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            weights = weights * sample_weight
        total = ops.sum(per_token * weights)
        # Under a tf.distribute strategy Keras sums gradients over replicas and expects each
        # replica's loss divided by the replica count, as keras.losses.Loss.__call__ does.
        return scale_loss_for_distribution(total / ops.maximum(ops.sum(weights), 1.0))

    def get_config(self):
        config = super().get_config()
        config.pop("reduction", None)
        return {**config, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}
