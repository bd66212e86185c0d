"""The exponential moving average of the weights (`training.ema_decay`): which weights each part of a run uses.

Keras' own optimizer EMA (`use_ema`, `ema_momentum`) keeps the average: after
each update, `average = decay * average + (1 - decay) * weight`, the first
update copying the weights. The model trains on its raw weights; everything
that judges or keeps the model uses the average:

- the validation loss and accuracy (`ValidateOnAverage`),
- the epoch and step checkpoints, so `average` and `export` read averages,
- BLEU on validation and `best.weights.h5`,
- the model `train` returns.

The backup keeps the raw weights, with the averages among the optimizer's
state, so a resumed run (inside an epoch too) goes on exactly. The swaps go
through numpy, so they work on every backend and under tf.distribute.
Backend-neutral (keras and numpy).
"""

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import keras

from keras_transformer.runtime.keras_internals import moving_average_pairs


def has_average(model: Any) -> bool:
    """Whether `model`'s optimizer keeps a moving average of its weights."""
    return bool(moving_average_pairs(getattr(model, "optimizer", None)))


def _swap(pairs: Iterable[tuple[Any, Any]]) -> None:
    for weight, average in pairs:
        raw = keras.ops.convert_to_numpy(weight)
        weight.assign(keras.ops.convert_to_numpy(average))
        average.assign(raw)


@contextlib.contextmanager
def averaged_weights(model: Any) -> Iterator[Any]:
    """Inside: the model's weights are the optimizer's moving averages; after: its raw weights again, exactly.

    A no-op for a model whose optimizer keeps no average.

    Example:

    >>> with averaged_weights(model):  # doctest: +SKIP
    ...     model.save_weights("averaged.weights.h5")
    """
    pairs = moving_average_pairs(getattr(model, "optimizer", None))
    _swap(pairs)
    try:
        yield model
    finally:
        _swap(pairs)


def reset_average(model: Any) -> None:
    """Starts the average at the model's current weights (a run from `training.init_checkpoint` or at
    `training.initial_updates`, where Keras would otherwise start it from zeros)."""
    for weight, average in moving_average_pairs(getattr(model, "optimizer", None)):
        average.assign(keras.ops.convert_to_numpy(weight))


def use_average(model: Any) -> None:
    """Copies the moving averages over the model's weights (the end of training); the raw weights are gone."""
    for weight, average in moving_average_pairs(getattr(model, "optimizer", None)):
        weight.assign(keras.ops.convert_to_numpy(average))


class ValidateOnAverage(keras.callbacks.Callback):
    """Evaluates with the averaged weights: swaps them in at `on_test_begin` and back at `on_test_end`."""

    def __init__(self) -> None:
        super().__init__()
        self._swapped: list[tuple[Any, Any]] = []  # the pairs swapped in by on_test_begin

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._swapped = moving_average_pairs(self.model.optimizer)
        _swap(self._swapped)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        _swap(self._swapped)
        self._swapped = []
