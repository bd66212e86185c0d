"""The training loss computed from the decoder's output a block of the vocabulary at a time, so that a training step
never holds the `(tokens, V)` logits, their softmax or their gradient.

With NLLB's 256,206-token vocabulary and 1,024 target tokens each float32 `(tokens, V)` tensor takes 1 GiB, and the
plain loss holds several at once (the logits, which the accuracy keeps until after the update, their exponentials,
their gradient): 1.8 GiB of the 7.6 GiB a LoRA update of NLLB-600M's shape peaks at (docs/BENCHMARKS.md).
`chunked_cross_entropy` computes the
logits of `block` vocabulary entries at a time (`z_c = h @ W_c + b_c`) in a loop, keeping per token only the running
maximum, the sum of exponentials, the sum of logits and the label's logit; its gradient computes each block's
logits again (one more product of the output projection) and from them the block's share of `dL/dh`, `dL/dW` and
`dL/db`. `ChunkedLossTransformer` is a `build_model` model whose training step uses it; everything else about the
model (its layers, weights, checkpoints, inference and validation) is unchanged.
"""

import threading
from typing import Any

import keras
from keras import ops

from keras_transformer.errors import ConfigError
from keras_transformer.model import parts

BLOCK = 8192  # vocabulary entries a block: (tokens, 8192) float32 logits are 32 MiB for 1,024 tokens
AUTO_VOCABULARY = 32768  # `training.chunked_loss: auto` chunks LoRA runs from this many target ids


def applies(setting: Any, vocab_size: int, loss: Any = None, rdrop_alpha: Any = None, lora: bool = False) -> bool:
    """Whether a run trains with the chunked loss: `training.chunked_loss` (True, False or "auto": LoRA runs with
    `AUTO_VOCABULARY` target ids or more), for the label-smoothed loss of `compile_model` (`loss` None, no R-Drop)
    on TensorFlow.

    "auto" leaves full fine-tuning out: there the gradient of the output matrix is a `(V, D)` tensor anyway, made
    from the blocks' rows (two copies of it at once), and the update of every weight, not the logits, sets the
    peak (docs/BENCHMARKS.md, "LoRA against full fine-tuning").

    Raises:
        ConfigError: `training.chunked_loss: true` with another loss or backend.

    Example:

    >>> applies("auto", 256206, lora=True), applies("auto", 256206), applies("auto", 8000, lora=True)
    (True, False, False)
    """
    if setting is False or (setting == "auto" and (vocab_size < AUTO_VOCABULARY or not lora)):
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
    float32 rounding), and so do their gradients with respect to `hidden`, `kernel` and `bias`. The blocks run one
    after the other (`ops.scan`: on TensorFlow a while loop of one iteration at a time, not ten, each holding
    its block's logits), the last `V % block` entries after them.

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
    blocks, rest = divmod(vocab_size, width)  # `blocks` in the loop, then `rest` entries
    compute = hidden.dtype
    h = ops.reshape(hidden, (-1, hidden.shape[-1]))  # (N, D)
    y = ops.reshape(ops.cast(labels, "int32"), (-1,))  # (N,)
    w = ops.cast(kernel, kernel.dtype)  # a variable's value: the gradient reaches the variable through the read
    b = ops.zeros((vocab_size,), "float32") if bias is None else ops.cast(bias, bias.dtype)
    starts = ops.arange(blocks, dtype="int32") * width

    def logits_of(h: Any, w: Any, b: Any, start: Any, size: int) -> tuple[Any, Any]:
        """The logits `(N, size)` float32 of the entries from `start`, and their kernel `(D, size)`."""
        if vocab_axis == 1:
            w_c = ops.slice(w, (0, start), (w.shape[0], size))
        else:
            w_c = ops.transpose(ops.slice(w, (start, 0), (size, w.shape[1])))
        w_c = ops.cast(w_c, compute)
        z = ops.cast(ops.matmul(h, w_c), "float32") + ops.cast(ops.slice(b, (start,), (size,)), "float32")
        return z, w_c

    @ops.custom_gradient
    def loss_fn(h: Any, w: Any, b: Any) -> Any:
        rows = ops.shape(h)[0]

        def forward(carry: tuple[Any, ...], start: Any, size: int = width) -> tuple[Any, ...]:
            peak, total, logit_sum, label_logit, best_id = carry  # each (N,)
            z, _ = logits_of(h, w, b, start, size)
            block_peak = ops.max(z, axis=-1)
            new_peak = ops.maximum(peak, block_peak)
            total = total * ops.exp(peak - new_peak) + ops.sum(ops.exp(z - new_peak[:, None]), axis=-1)
            is_label = ops.equal(y[:, None], start + ops.arange(size, dtype="int32"))  # (N, size)
            label_logit = label_logit + ops.sum(ops.where(is_label, z, 0.0), axis=-1)
            block_id = ops.cast(ops.argmax(z, axis=-1), "int32") + start
            best_id = ops.where(ops.greater(block_peak, peak), block_id, best_id)  # a tie keeps the first id
            return new_peak, total, logit_sum + ops.sum(z, axis=-1), label_logit, best_id

        zero = ops.zeros((rows,), "float32")
        carry = (ops.full((rows,), -float("inf"), "float32"), zero, zero, zero, ops.zeros((rows,), "int32"))
        carry, _ = ops.scan(lambda carry, start: (forward(carry, start),) * 2, carry, starts)
        if rest:
            carry = forward(carry, blocks * width, rest)
        peak, total, logit_sum, label_logit, best_id = carry
        log_normalizer = peak + ops.log(total)  # (N,) logsumexp
        loss = log_normalizer - (1.0 - eps) * label_logit - eps * logit_sum / vocab_size
        result = ops.stack([loss, ops.cast(best_id, "float32")], axis=-1)  # (N, 2): ids < 2 ** 24 are exact

        def gradient(upstream: Any) -> tuple[Any, Any, Any]:
            g = upstream[:, 0][:, None]  # (N, 1)

            def backward(grad_h: Any, start: Any, size: int = width) -> tuple[Any, Any, Any]:
                """dL/dh so far plus this block's, and the block's dL/dW rows `(size, D)` and dL/db `(size,)`."""
                z, w_c = logits_of(h, w, b, start, size)
                is_label = ops.equal(y[:, None], start + ops.arange(size, dtype="int32"))
                target = ops.where(is_label, 1.0 - eps + eps / vocab_size, eps / vocab_size)
                grad_z = ops.cast(g * (ops.exp(z - log_normalizer[:, None]) - target), compute)  # (N, size)
                grad_h = grad_h + ops.cast(ops.matmul(grad_z, ops.transpose(w_c)), "float32")
                grad_w = ops.cast(ops.matmul(ops.transpose(grad_z), h), w.dtype) if kernel_gradient \
                    else ops.zeros(())  # (size, D)
                grad_b = ops.cast(ops.sum(grad_z, axis=0), b.dtype) if bias_gradient else ops.zeros(())
                return grad_h, grad_w, grad_b

            # The blocks' dL/dW and dL/db are the scan's outputs; `ops.scan` on TensorFlow outputs what it
            # carries, so the carry has a slot for them (each step's own), and its dL/dh are stacked too.
            def step(carry: tuple[Any, Any, Any], start: Any) -> tuple[Any, Any]:
                carry = backward(carry[0], start)
                return carry, carry

            initial = (ops.zeros(ops.shape(h), "float32"),
                       ops.zeros((width, w.shape[1 - vocab_axis]), w.dtype) if kernel_gradient else ops.zeros(()),
                       ops.zeros((width,), b.dtype) if bias_gradient else ops.zeros(()))
            (grad_h, _, _), (_, grad_w, grad_b) = ops.scan(step, initial, starts)
            if kernel_gradient:
                grad_w = ops.reshape(grad_w, (blocks * width, -1))  # (V - rest, D)
            if bias_gradient:
                grad_b = ops.reshape(grad_b, (-1,))
            if rest:
                grad_h, rest_w, rest_b = backward(grad_h, blocks * width, rest)
                grad_w = ops.concatenate([grad_w, rest_w], axis=0) if kernel_gradient else grad_w
                grad_b = ops.concatenate([grad_b, rest_b], axis=0) if bias_gradient else grad_b
            if kernel_gradient and vocab_axis == 1:
                grad_w = ops.transpose(grad_w)  # (D, V)
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
        # for compute_metrics, in the same step (a tf.distribute strategy traces each replica's on its own thread)
        self.__dict__.setdefault("_predicted_ids", {})[threading.get_ident()] = predictions
        total = loss.masked_mean(losses, y, sample_weight)
        if self.losses:
            total = total + ops.sum(self.losses)
        return total

    def compute_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        predictions = self.__dict__.get("_predicted_ids", {}).pop(threading.get_ident(), None)  # this step's
        if predictions is not None:
            y_pred = predictions  # the logits were never made
        return super().compute_metrics(x, y, y_pred, sample_weight=sample_weight)
