"""Label-smoothed cross-entropy averaged over non-pad target tokens (section 5.4)."""

from typing import Any

import keras
from keras import ops

from keras_transformer.runtime.keras_internals import scale_loss_for_distribution


def smoothed_cross_entropy(labels: Any, logits: Any, label_smoothing: float = 0.1, soft_ids: Any = None,
                           soft_probabilities: Any = None, soft_weight: float = 0.0) -> Any:
    """Per-token label-smoothed cross-entropy `(B, T)` from logits `(B, T, V)`, pads included.

    loss = logsumexp(z) - (1 - eps) * z_y - eps * mean(z). The gradient is given by
    hand, dloss/dz = softmax(z) - (1 - eps) * one_hot(y) - eps / V, because
    autodiff of the three terms costs a scatter for z_y and a sum of three
    `(B, T, V)` gradients, a large share of a training step with a big
    vocabulary (history/experiments.md has the figures).

    With `soft_ids` and `soft_probabilities` (a sparse distribution per position,
    e.g. a teacher's top k; `distillation.py`) the target is the mixture
    `(1 - w) * smoothed one-hot + w * soft`, w = `soft_weight`:
    loss = logsumexp(z) - (1 - w) * ((1 - eps) * z_y + eps * mean(z)) - w * sum_j p_j z_{id_j},
    the same as `(1 - w) * smoothed CE + w * CE(soft)` when the p_j sum to one,
    with the gradient `softmax(z) - target` in one pass as well.

    Args:
        labels: int `(B, T)` target ids.
        logits: `(B, T, V)`, computed in float32.
        label_smoothing: eps in [0, 1).
        soft_ids: optional int `(B, T, k)` ids of the soft target.
        soft_probabilities: float `(B, T, k)` their probabilities (summing to one, or zero at pads).
        soft_weight: w in [0, 1], the soft target's share.

    Returns:
        float32 `(B, T)` losses.

    Example:

    >>> import numpy as np
    >>> logits = np.log(np.array([[[0.25, 0.75]]], "float32"))
    >>> round(float(smoothed_cross_entropy(np.array([[1]]), logits, 0.0)[0, 0]), 4)
    0.2877
    >>> # half towards the label 1, half towards id 0: (-log 0.75 - log 0.25) / 2
    >>> round(float(smoothed_cross_entropy(np.array([[1]]), logits, 0.0, np.array([[[0]]]),
    ...                                    np.array([[[1.0]]], "float32"), 0.5)[0, 0]), 4)
    0.837
    """
    eps = float(label_smoothing)
    z, y = ops.cast(logits, "float32"), ops.cast(labels, "int32")
    if soft_ids is None:
        @ops.custom_gradient
        def cross_entropy(z: Any, y: Any) -> Any:  # z: float32 (B, T, V), y: int32 (B, T)
            loss, saved = _forward(z, y, eps)
            return loss, lambda *args, upstream=None: (
                _hard_target_gradient(args[0] if upstream is None else upstream, z, saved, eps), None)

        return cross_entropy(z, y)

    w = float(soft_weight)

    @ops.custom_gradient
    def soft_cross_entropy(z: Any, y: Any, ids: Any, p: Any) -> Any:
        loss, saved = _forward(z, y, eps, ids, p, w)
        return loss, lambda *args, upstream=None: (
            _soft_target_gradient(args[0] if upstream is None else upstream, z, y, saved, eps, ids, p, w),
            None, None, None)

    return soft_cross_entropy(z, y, ops.cast(soft_ids, "int32"), ops.cast(soft_probabilities, "float32"))


def _forward(z: Any, y: Any, eps: float, ids: Any = None, p: Any = None, w: float = 0.0) -> tuple[Any, Any]:
    """The loss `(B, T)` of `smoothed_cross_entropy`, and what its gradient reuses: `(exp, total, label,
    label_exp)`, the shifted exponentials `(B, T, V)`, their sum, the labels and the labels' exponentials
    `(B, T, 1)`."""
    # Few (B, T, V) tensors live at once: the terms of the loss read z itself, so `z - peak` feeds
    # only the exp (which TensorFlow then computes in place), and the gradient starts from `exp`
    # and overwrites the label positions only (`_hard_target_gradient`). With a 32k vocabulary and 4,096 target
    # positions each float32 (B, T, V) tensor takes 0.52 GB (docs/BENCHMARKS.md, "Training memory").
    hard = 1.0 - w
    peak = ops.max(z, axis=-1, keepdims=True)  # (B, T, 1)
    exp = ops.exp(z - peak)  # kept for the gradient
    total = ops.sum(exp, axis=-1, keepdims=True)  # (B, T, 1)
    label = ops.expand_dims(y, -1)  # (B, T, 1)
    true_logit = ops.take_along_axis(z, label, axis=-1) - peak  # (B, T, 1)
    label_exp = ops.take_along_axis(exp, label, axis=-1)  # (B, T, 1), for the gradient
    loss = ops.log(total) - hard * (1.0 - eps) * true_logit
    if eps > 0 and hard > 0:
        loss = loss - hard * eps * (ops.mean(z, axis=-1, keepdims=True) - peak)
    if ids is not None:
        loss = loss - w * ops.sum(p * (ops.take_along_axis(z, ids, axis=-1) - peak), axis=-1, keepdims=True)
    return ops.squeeze(loss, -1), (exp, total, label, label_exp)  # (B, T)


def _hard_target_gradient(upstream: Any, z: Any, saved: Any, eps: float) -> Any:
    """dloss/dz against the smoothed one-hot target: softmax * upstream - upstream * eps / V everywhere, then the
    label positions' values written over."""
    exp, total, label, label_exp = saved
    vocab_size = ops.shape(z)[-1]
    upstream = ops.expand_dims(upstream, -1)  # (B, T, 1)
    uniform = eps / ops.cast(vocab_size, z.dtype)
    scale = upstream / total
    gradient = exp * scale - upstream * uniform  # (B, T, V)
    at_label = label_exp * scale - upstream * ((1.0 - eps) + uniform)  # (B, T, 1)
    rows = ops.shape(z)[0] * ops.shape(z)[1]
    positions = ops.stack([ops.arange(rows, dtype="int32"), ops.reshape(label, [-1])], axis=1)
    gradient = ops.scatter_update(ops.reshape(gradient, [rows, vocab_size]), positions, ops.reshape(at_label, [-1]))
    return ops.reshape(gradient, ops.shape(z))


def _soft_target_gradient(upstream: Any, z: Any, y: Any, saved: Any, eps: float, ids: Any, p: Any, w: float) -> Any:
    """dloss/dz against the mixture `(1 - w) * smoothed one-hot + w * soft`: softmax * upstream - the target."""
    exp, total, label, _ = saved
    hard = 1.0 - w
    vocab_size = ops.shape(z)[-1]
    upstream = ops.expand_dims(upstream, -1)  # (B, T, 1)
    uniform = hard * eps / ops.cast(vocab_size, z.dtype)
    is_label = ops.equal(label, ops.arange(vocab_size, dtype=y.dtype))  # (B, T, V)
    target = ops.where(is_label, upstream * (hard * (1.0 - eps) + uniform), upstream * uniform)
    # + w * p_j at (b, t, id_j): one scatter of B*T*k values into a zero (B*T, V) tensor
    k = ops.shape(ids)[-1]
    rows = ops.repeat(ops.arange(ops.shape(ids)[0] * ops.shape(ids)[1], dtype="int32"), k)
    flat = ops.stack([rows, ops.reshape(ops.cast(ids, "int32"), [-1])], axis=1)
    spread = ops.scatter(flat, ops.reshape(upstream * (w * p), [-1]),
                         [ops.shape(ids)[0] * ops.shape(ids)[1], vocab_size])
    target = target + ops.reshape(spread, ops.shape(z))
    return exp * (upstream / total) - target


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against (1 - eps) * one_hot(y) + eps / V, from logits.

    The smoothed target puts eps/V on every class (including the true one), the
    convention of `keras.losses.CategoricalCrossentropy(label_smoothing=eps)`.
    The loss is computed without a one-hot tensor:
    `logsumexp(z) - (1 - eps) * z_y - eps * mean(z)`, and averaged over the
    target positions whose label is not `pad_id` (times any sample weight).
    Its gradient is written out, `softmax(z) - smoothed target`, one pass over
    the `(B, T, V)` logits instead of autodiff's three summed ones (see
    `smoothed_cross_entropy`).

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

    def __init__(self, label_smoothing: float = 0.1, pad_id: int = 0, name: str = "label_smoothed_cross_entropy",
                 **kwargs: Any) -> None:
        kwargs.pop("reduction", None)
        super().__init__(name=name, reduction="sum_over_batch_size", **kwargs)
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
        self.label_smoothing = float(label_smoothing)
        self.pad_id = int(pad_id)

    def call(self, y_true: Any, y_pred: Any) -> Any:
        """Per-token losses `(B, T)` (pads included; `__call__` masks them)."""
        return smoothed_cross_entropy(y_true, y_pred, self.label_smoothing)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        return self.masked_mean(self.call(y_true, y_pred), y_true, sample_weight)

    def masked_mean(self, per_token: Any, labels: Any, sample_weight: Any = None) -> Any:
        """The mean of `per_token` `(B, T)` over the positions whose label is not `pad_id` (times any weight)."""
        weights = ops.cast(ops.not_equal(ops.cast(labels, "int32"), self.pad_id), "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            while len(sample_weight.shape) < len(weights.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            weights = weights * sample_weight
        total = ops.sum(per_token * weights)
        # Under a tf.distribute strategy Keras sums gradients over replicas and expects each
        # replica's loss divided by the replica count, as keras.losses.Loss.__call__ does.
        return scale_loss_for_distribution(total / ops.maximum(ops.sum(weights), 1.0))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("reduction", None)
        return {**config, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}


def rdrop_cross_entropy(labels: Any, logits: Any, label_smoothing: float = 0.1, alpha: float = 5.0) -> Any:
    """Per-position R-Drop loss `(B, T)` of B examples, each run twice: logits `(B, 2, T, V)`.

    `(CE_1 + CE_2) / 2 + alpha / 4 * (KL(p_1 || p_2) + KL(p_2 || p_1))`, CE the
    label-smoothed cross-entropy of each pass against `labels` `(B, T)`. One
    log-softmax serves both terms, and the gradient is written out in one pass
    over the `(B, 2, T, V)` logits: `(p_i - target) / 2` from the cross-entropy,
    and `alpha / 4 * (p_1 * (d - sum(p_1 * d)) + p_1 - p_2)` (the mirror image
    for the second pass) from the divergence, `d = log p_1 - log p_2`, instead of
    autodiff's several passes (bench/rdrop_step.py has the step times).

    Example:

    >>> import numpy as np
    >>> logits = np.log(np.array([[[[0.5, 0.5]], [[0.25, 0.75]]]], "float32"))  # one position, two passes
    >>> # (-log 0.5 - log 0.75) / 2 + 1 / 4 * ((0.5 - 0.25) log 2 + (0.5 - 0.75) log(2 / 3))
    >>> round(float(rdrop_cross_entropy(np.array([[1]]), logits, 0.0, 1.0)[0, 0]), 4)
    0.5591
    """
    eps, alpha = float(label_smoothing), float(alpha)

    @ops.custom_gradient
    def loss_fn(z: Any, y: Any) -> Any:  # z: float32 (B, 2, T, V), y: int32 (B, T)
        vocab_size = ops.shape(z)[-1]
        shifted = z - ops.max(z, axis=-1, keepdims=True)
        exp = ops.exp(shifted)
        total = ops.sum(exp, axis=-1, keepdims=True)  # (B, 2, T, 1)
        log_probs = shifted - ops.log(total)
        probs = exp / total
        labels = ops.expand_dims(ops.expand_dims(y, 1), -1)  # (B, 1, T, 1)
        true_logit = ops.take_along_axis(log_probs, ops.broadcast_to(labels, ops.shape(total)), axis=-1)
        cross_entropy = -(1.0 - eps) * true_logit  # (B, 2, T, 1)
        if eps > 0:
            cross_entropy = cross_entropy - eps * ops.mean(log_probs, axis=-1, keepdims=True)
        d = log_probs[:, 0] - log_probs[:, 1]  # (B, T, V)
        p, q = probs[:, 0], probs[:, 1]
        divergence = ops.sum((p - q) * d, axis=-1)  # (B, T)
        loss = 0.5 * ops.sum(ops.squeeze(cross_entropy, -1), axis=1) + alpha / 4.0 * divergence

        def grad(upstream: Any) -> Any:
            upstream = ops.expand_dims(upstream, -1)  # (B, T, 1)
            uniform = eps / ops.cast(vocab_size, z.dtype)
            is_label = ops.equal(ops.expand_dims(y, -1), ops.arange(vocab_size, dtype=y.dtype))  # (B, T, V)
            target = ops.where(is_label, 1.0 - eps + uniform, uniform)
            weight = alpha / 4.0
            grad_p = 0.5 * (p - target) + weight * (p * (d - ops.sum(p * d, axis=-1, keepdims=True)) + p - q)
            grad_q = 0.5 * (q - target) + weight * (q * (ops.sum(q * d, axis=-1, keepdims=True) - d) + q - p)
            return ops.stack([upstream * grad_p, upstream * grad_q], axis=1)

        return loss, lambda *args, upstream=None: (grad(args[0] if upstream is None else upstream), None)

    return loss_fn(ops.cast(logits, "float32"), ops.cast(labels, "int32"))


@keras.saving.register_keras_serializable(package="keras_transformer")
class RDropLoss(LabelSmoothedCrossEntropy):
    """R-Drop (Liang et al., 2021): label-smoothed cross-entropy on two dropout passes of each pair, plus their
    symmetric KL divergence.

    The batch holds every example twice, in adjacent rows (rows 2i and 2i + 1;
    `keras-transformer train` repeats each batch so with `training.rdrop_alpha`),
    so one forward pass draws two dropout masks per example; the labels of the
    first row of each pair serve both. The loss is the
    paper's `CE_1 + CE_2 + alpha / 2 * (KL(p_1 || p_2) + KL(p_2 || p_1))` per
    target token, divided by two so that its first term is the usual mean
    cross-entropy: `mean(CE) + alpha / 4 * mean(KL_12 + KL_21)`, both means over
    non-pad positions. Without dropout (evaluation) the two rows agree and the
    loss is the plain label-smoothed cross-entropy.

    Args:
        alpha: the weight of the divergence (the paper used 5 for IWSLT translation).
        label_smoothing: eps in [0, 1).
        pad_id: label id excluded from the loss.

    Example:

    >>> import numpy as np
    >>> logits = np.log(np.array([[[0.1, 0.9]], [[0.1, 0.9]]], "float32"))  # one example, twice
    >>> labels = np.array([[1], [1]])
    >>> round(float(RDropLoss(5.0, 0.0)(labels, logits)), 4)  # no divergence: -log 0.9
    0.1054
    """

    def __init__(self, alpha: float = 5.0, label_smoothing: float = 0.1, pad_id: int = 0,
                 name: str = "rdrop_cross_entropy", **kwargs: Any) -> None:
        super().__init__(label_smoothing=label_smoothing, pad_id=pad_id, name=name, **kwargs)
        if not float(alpha) >= 0.0:
            raise ValueError(f"alpha must be >= 0, got {alpha}.")
        self.alpha = float(alpha)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        shape = ops.shape(y_pred)
        pairs = ops.reshape(y_pred, (-1, 2, shape[1], shape[2]))  # rows 2i and 2i + 1: one example's two passes
        labels = ops.reshape(y_true, (-1, 2, shape[1]))[:, 0]
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            sample_weight = ops.reshape(sample_weight, (-1, 2) + tuple(sample_weight.shape[1:]))[:, 0]
        per_position = rdrop_cross_entropy(labels, pairs, self.label_smoothing, self.alpha)
        return self.masked_mean(per_position, labels, sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "alpha": self.alpha}
