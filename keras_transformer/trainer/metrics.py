"""Token accuracy over non-pad positions."""

from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of non-pad target tokens whose argmax prediction is right.

    `y_pred` is logits `(B, T, V)`, or the predicted ids `(B, T)`.

    Args:
        pad_id: label id excluded from the count.

    Example:

    >>> import numpy as np
    >>> metric = MaskedAccuracy(pad_id=0)
    >>> logits = np.array([[[0, 1, 0], [1, 0, 0], [0, 0, 1]]], "float32")
    >>> metric.update_state(np.array([[1, 2, 0]]), logits)
    >>> float(metric.result())
    0.5
    """

    def __init__(self, pad_id: int = 0, name: str = "masked_accuracy", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.pad_id = int(pad_id)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        labels = ops.cast(y_true, "int32")
        # The first index of the largest logit, as argmax picks it (`top_k` puts the lower index first among
        # equal values; only a largest logit of 0.0 after a -0.0 differs). `ops.argmax` of floats makes a float32
        # copy of the (B, T, V) logits and three boolean masks of that size on TensorFlow (its -0.0 fix): 0.9 GB
        # of the training step with a 32k vocabulary (docs/BENCHMARKS.md, "Training memory").
        if len(y_pred.shape) == 2:  # the predicted ids already (`chunked_loss.ChunkedLossTransformer`'s training)
            predictions = ops.cast(y_pred, "int32")
        else:
            predictions = ops.cast(ops.top_k(y_pred, 1)[1][..., 0], "int32")  # (B, T)
        weights = ops.cast(ops.not_equal(labels, self.pad_id), "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            while len(sample_weight.shape) < len(weights.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            weights = weights * sample_weight
        hits = ops.cast(ops.equal(labels, predictions), "float32") * weights
        self.correct.assign_add(ops.sum(hits))
        self.total.assign_add(ops.sum(weights))

    def result(self) -> Any:
        return self.correct / ops.maximum(self.total, 1.0)

    def reset_state(self) -> None:
        self.correct.assign(0.0)
        self.total.assign(0.0)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pad_id": self.pad_id}
