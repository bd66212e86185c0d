"""Each assumption `keras_internals` makes about the installed Keras, checked: a Keras release that changes one
fails here, by name, instead of breaking a resumed training run."""

import inspect

import keras

from keras_transformer import keras_internals


def _model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_losses_scale_by_the_function_keras_internals_reexports():
    """Keras' losses divide by the replicas through this function when they reduce; outside a strategy the value
    is unchanged."""
    from keras.src.losses import loss as keras_loss
    assert "scale_loss_for_distribution(loss)" in inspect.getsource(keras_loss.reduce_values)
    value = keras.ops.convert_to_tensor(3.0)
    assert float(keras_internals.scale_loss_for_distribution(value)) == 3.0


def test_the_multi_worker_workarounds_find_the_trainer_parts_they_replace():
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer
    assert callable(keras_tf_trainer.reduce_per_replica)
    assert list(inspect.signature(keras_tf_trainer.reduce_per_replica).parameters) == ["values", "strategy",
                                                                                       "reduction"]
    model = _model()
    for name in ("_symbolic_build", "_maybe_symbolic_build", "_distribute_strategy"):
        assert hasattr(model, name), f"keras.Model no longer has {name}"
    assert "data_batch" in inspect.signature(model._symbolic_build).parameters
