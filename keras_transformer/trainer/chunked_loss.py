"""The training loss computed from the decoder's output a block of the vocabulary at a time, so that a training step
never holds the `(tokens, V)` logits, their softmax or their gradient.

With NLLB's 256,206-token vocabulary and 1,024 target tokens each float32 `(tokens, V)` tensor takes 1 GiB, and the
plain loss holds several at once (the logits, which the accuracy keeps until after the update, their exponentials,
their gradient): more than the activations of all 24 layers of NLLB-600M. `chunked_cross_entropy` computes the
logits of `block` vocabulary entries at a time (`z_c = h @ W_c + b_c`) in a loop, keeping per token only the running
maximum, the sum of exponentials, the sum of logits and the label's logit; its gradient computes each block's
logits again (one more product of the output projection) and from them the block's share of `dL/dh`, `dL/dW` and
`dL/db`. `ChunkedLossTransformer` is a `build_model` model whose training step uses it; everything else about the
model (its layers, weights, checkpoints, inference and validation) is unchanged.
"""

from typing import Any

import keras
from keras import ops

from keras_transformer.errors import ConfigError
from keras_transformer.model import parts

BLOCK = 8192  # vocabulary entries a block: (tokens, 8192) float32 logits are 32 MiB for 1,024 tokens
AUTO_VOCABULARY = 32768  # `training.chunked_loss: auto` chunks from this many target ids


def applies(setting: Any, vocab_size: int, loss: Any = None, rdrop_alpha: Any = None) -> bool:
    """Whether a run trains with the chunked loss: `training.chunked_loss` (True, False or "auto": from
    `AUTO_VOCABULARY` target ids), for the label-smoothed loss of `compile_model` (`loss` None, no R-Drop) on
    TensorFlow.

    Raises:
        ConfigError: `training.chunked_loss: true` with another loss or backend.

    Example:

    >>> applies("auto", 256206), applies("auto", 8000), applies(False, 256206)
    (True, False, False)
    """
    if setting is False or (setting == "auto" and vocab_size < AUTO_VOCABULARY):
        return False
    refusal = None
    if keras.backend.backend() != "tensorflow":
        refusal = f"the {keras.backend.backend()} backend (TensorFlow only)"
    elif rdrop_alpha:
        refusal = "R-Drop (training.rdrop_alpha)"
    elif loss is not None:
        refusal = f"this run's own loss ({type(loss).__name__})"
    if refusal is not None and setting is True:
        raise ConfigError(f"training.chunked_loss: true does not work with {refusal}; set it to false or auto.")
    return refusal is None


def chunked_cross_entropy(labels: Any, hidden: Any, kernel: Any, bias: Any = None, label_smoothing: float = 0.1,
                          vocab_axis: int = 1, block: int = BLOCK, kernel_gradient: bool = True,
                          bias_gradient: bool = True) -> tuple[Any, Any]:
    """Per-token label-smoothed cross-entropy of the logits `hidden @ kernel (+ bias)` and their argmax, computed
    `block` vocabulary entries at a time.

    The losses equal `losses.smoothed_cross_entropy(labels, logits, label_smoothing)` of the whole logits (within
    float32 rounding), and so do their gradients with respect to `hidden`, `kernel` and `bias`.

    Args:
        labels: int `(B, T)` target ids.
        hidden: `(B, T, D)`, the decoder's output (any float dtype: the products run in it, as the model's do).
        kernel: the output projection, `(D, V)` (`vocab_axis=1`, a `Dense` kernel) or `(V, D)` (`vocab_axis=0`,
            a tied embedding matrix).
        bias: optional `(V,)` added to the logits.
        label_smoothing: eps in [0, 1).
        vocab_axis: the axis of `kernel` that indexes the vocabulary.
        block: vocabulary entries a block.
        kernel_gradient, bias_gradient: whether the gradient computes `dL/dkernel` and `dL/dbias` (False for a
            frozen matrix, e.g. under LoRA: its gradient is then None, and no `(V, D)` tensor is made).

    Returns:
        `(losses, predictions)`: float32 `(B, T)` losses, pads included, and int32 `(B, T)` ids of the largest
        logits (the first among equals), with no gradient.

    Example:

    >>> import numpy as np
    >>> kernel = np.log(np.array([[0.25, 0.75]], "float32"))  # D = 1, V = 2
    >>> losses, predictions = chunked_cross_entropy(np.array([[1]]), np.ones((1, 1, 1), "float32"), kernel,
    ...                                             label_smoothing=0.0, block=1)
    >>> round(float(losses[0, 0]), 4), int(predictions[0, 0])  # -log 0.75, id 1
    (0.2877, 1)
    """
    eps = float(label_smoothing)
    batch_shape = ops.shape(labels)
    vocab_size = int(kernel.shape[vocab_axis])
    width = min(int(block), vocab_size)
    blocks = -(-vocab_size // width)
    compute = hidden.dtype
    h = ops.reshape(hidden, (-1, hidden.shape[-1]))  # (N, D)
    y = ops.reshape(ops.cast(labels, "int32"), (-1,))  # (N,)
    w = ops.cast(kernel, kernel.dtype)  # a variable's value: the gradient reaches the variable through the read
    b = ops.zeros((vocab_size,), "float32") if bias is None else ops.cast(bias, bias.dtype)
    columns = ops.arange(width, dtype="int32")

    def block_of(i: Any) -> tuple[Any, Any, Any]:
        """The start of block i, its columns' ids `(width,)`, and which of them block i owns: the last block
        ends at V, so it starts earlier and overlaps the one before it, whose columns it leaves to that one."""
        start = ops.minimum(i * width, vocab_size - width)
        ids = start + columns
        return start, ids, ops.greater_equal(ids, i * width)

    def slice_kernel(m: Any, start: Any) -> Any:  # (D, width)
        if vocab_axis == 1:
            return ops.slice(m, (0, start), (m.shape[0], width))
        return ops.transpose(ops.slice(m, (start, 0), (width, m.shape[1])))

    def logits_of(h: Any, w: Any, b: Any, start: Any) -> tuple[Any, Any]:
        w_c = ops.cast(slice_kernel(w, start), compute)
        z = ops.cast(ops.matmul(h, w_c), "float32") + ops.cast(ops.slice(b, (start,), (width,)), "float32")
        return z, w_c  # (N, width) float32, (D, width)

    @ops.custom_gradient
    def loss_fn(h: Any, w: Any, b: Any) -> Any:
        rows = ops.shape(h)[0]

        def forward(i: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
            peak, total, logit_sum, label_logit, best, best_id = carry  # each (N,)
            start, ids, owned = block_of(i)
            z, _ = logits_of(h, w, b, start)
            masked = ops.where(owned, z, -float("inf"))
            new_peak = ops.maximum(peak, ops.max(masked, axis=-1))
            total = total * ops.exp(peak - new_peak) + ops.sum(ops.exp(masked - new_peak[:, None]), axis=-1)
            logit_sum = logit_sum + ops.sum(ops.where(owned, z, 0.0), axis=-1)
            is_label = ops.logical_and(ops.equal(y[:, None], ids), owned)  # (N, width)
            label_logit = label_logit + ops.sum(ops.where(is_label, z, 0.0), axis=-1)
            block_best = ops.max(masked, axis=-1)
            better = ops.greater(block_best, best)  # an earlier block keeps a tie: the first index wins
            block_id = ops.cast(ops.argmax(masked, axis=-1), "int32") + start
            return (new_peak, total, logit_sum, label_logit, ops.where(better, block_best, best),
                    ops.where(better, block_id, best_id))

        lowest = ops.full((rows,), -float("inf"), "float32")
        zero = ops.zeros((rows,), "float32")
        peak, total, logit_sum, label_logit, _, best_id = ops.fori_loop(
            0, blocks, forward, (lowest, zero, zero, zero, lowest, ops.zeros((rows,), "int32")))
        log_normalizer = peak + ops.log(total)  # (N,) logsumexp
        loss = log_normalizer - (1.0 - eps) * label_logit - eps * logit_sum / vocab_size
        result = ops.stack([loss, ops.cast(best_id, "float32")], axis=-1)  # (N, 2): ids < 2 ** 24 are exact

        def gradient(upstream: Any) -> tuple[Any, Any, Any]:
            g = upstream[:, 0][:, None]  # (N, 1)

            def backward(i: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
                grad_h, grad_w, grad_b = carry
                start, ids, owned = block_of(i)
                z, w_c = logits_of(h, w, b, start)
                target = ops.where(ops.equal(y[:, None], ids), 1.0 - eps + eps / vocab_size, eps / vocab_size)
                grad_z = g * (ops.exp(z - log_normalizer[:, None]) - target)  # (N, width)
                # the overlapped columns of the last block count once in dL/dh; their dL/dW rows are written again
                # with the same values
                grad_h = grad_h + ops.cast(ops.matmul(ops.cast(ops.where(owned, grad_z, 0.0), compute),
                                                      ops.transpose(w_c)), "float32")
                if kernel_gradient:
                    grad_w_c = ops.cast(ops.matmul(ops.transpose(h), ops.cast(grad_z, compute)), w.dtype)  # (D, w)
                    grad_w = ops.slice_update(grad_w, (0, start) if vocab_axis == 1 else (start, 0),
                                              grad_w_c if vocab_axis == 1 else ops.transpose(grad_w_c))
                if bias_gradient:
                    grad_b = ops.slice_update(grad_b, (start,), ops.cast(ops.sum(grad_z, axis=0), b.dtype))
                return grad_h, grad_w, grad_b

            grad_h, grad_w, grad_b = ops.fori_loop(0, blocks, backward, (
                ops.zeros(ops.shape(h), "float32"),
                ops.zeros(w.shape, w.dtype) if kernel_gradient else ops.zeros((), w.dtype),
                ops.zeros(b.shape, b.dtype) if bias_gradient else ops.zeros((), b.dtype)))
            return (ops.cast(grad_h, h.dtype), grad_w if kernel_gradient else None,
                    grad_b if bias_gradient else None)

        return result, lambda *args, upstream=None: gradient(args[0] if upstream is None else upstream)

    result = loss_fn(h, w, b)
    losses = ops.reshape(result[:, 0], batch_shape)
    predictions = ops.reshape(ops.cast(ops.stop_gradient(result[:, 1]), "int32"), batch_shape)
    return losses, predictions


@keras.saving.register_keras_serializable(package="keras_transformer")
class ChunkedLossTransformer(keras.Model):
    """A `build_model` model whose training step computes its loss with `chunked_cross_entropy`.

    Build it from a model's graph, `ChunkedLossTransformer(model.input, model.output, name=model.name)`: it
    shares that model's layers and weights. In training (`fit`), `call` stops at the decoder's output and
    `compute_loss` applies the output projection (the tied embedding or `output_projection`, and `output_bias`)
    inside the loss, with the compiled `LabelSmoothedCrossEntropy`'s smoothing, pad id and masked mean; the
    metrics receive the predicted ids `(B, T)` instead of logits. Outside training it is the same model:
    `model(inputs)`, `predict`, `evaluate` and the validation of `fit` give and score logits.

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> chunked = ChunkedLossTransformer(model.input, model.output, name=model.name)
    >>> len(chunked.weights) == len(model.weights)
    True
    """

    def call(self, inputs: Any, training: Any = None, mask: Any = None, **kwargs: Any) -> Any:
        if training:  # (B, T, D): the layers after the decoder run inside the loss
            return self._decoder_output()(inputs)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def _decoder_output(self) -> Any:
        """A `keras.Function` from the inputs to the decoder's output, over this model's own layers."""
        function = self.__dict__.get("_to_decoder_output")
        if function is None:  # not a layer: not tracked, so the weights and their checkpoint layout stay the same
            function = keras.Function(self.input, self.get_layer("decoder").output)
            self.__dict__["_to_decoder_output"] = function
        return function

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        if not training:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        p = parts(self)
        loss = self.loss
        trainable = {id(variable) for variable in self.trainable_variables}
        if p.output_projection is not None:
            kernel, vocab_axis = p.output_projection.kernel, 1
        else:
            kernel, vocab_axis = p.target_embedding.embeddings, 0
        bias = p.output_bias.bias if p.output_bias is not None else None
        losses, predictions = chunked_cross_entropy(
            y, y_pred, kernel, bias, loss.label_smoothing, vocab_axis=vocab_axis,
            kernel_gradient=id(kernel) in trainable, bias_gradient=bias is not None and id(bias) in trainable)
        self.__dict__["_predicted_ids"] = predictions  # for compute_metrics, in the same step
        total = loss.masked_mean(losses, y, sample_weight)
        if self.losses:
            total = total + ops.sum(self.losses)
        return total

    def compute_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        predictions = self.__dict__.pop("_predicted_ids", None)  # set by this training step's compute_loss
        if predictions is not None:
            y_pred = predictions  # the logits were never made
        return super().compute_metrics(x, y, y_pred, sample_weight=sample_weight)
