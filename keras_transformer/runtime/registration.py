"""Makes the package's Keras classes known to `keras.saving` without importing Keras.

A `.keras` file names each custom class by its registered name
(`"keras_transformer>NoamSchedule"`); `keras.models.load_model` finds it only
if the class is registered. Importing the modules that define the classes
would register them, but it imports Keras, and with it TensorFlow (seconds),
which `import keras_transformer` must not do. Instead, `register_lazily()`
(run by `import keras_transformer`) puts a `LazyClass` under each registered
name as soon as Keras is imported, before or after the package: a stand-in
that imports the class's module when Keras first rebuilds an object from its
config. That import registers the real class in its place.

Example:

>>> import keras
>>> register_lazily()
>>> keras.saving.get_custom_objects()["keras_transformer>NoamSchedule"].from_config(
...     {"d_model": 64, "warmup_steps": 100}).warmup_steps
100
"""

import contextlib
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from keras_transformer.runtime import import_hooks
from keras_transformer.runtime.registry import Registry

PACKAGE = "keras_transformer"

# registered name (without the package) -> where the class is defined: each class of the package decorated with
# `@keras.saving.register_keras_serializable(package="keras_transformer")` (tests/test_model.py checks this list
# against the source).
SERIALIZABLE = Registry("Keras-serializable class")
SERIALIZABLE.register("MultiHeadAttention", "keras_transformer.layers.attention:MultiHeadAttention")
SERIALIZABLE.register("MultiHeadSelfAttention", "keras_transformer.layers.attention:MultiHeadSelfAttention")
SERIALIZABLE.register("DecoderLayer", "keras_transformer.layers.decoder:DecoderLayer")
SERIALIZABLE.register("TransformerDecoder", "keras_transformer.layers.decoder:TransformerDecoder")
SERIALIZABLE.register("TokenEmbedding", "keras_transformer.layers.embedding:TokenEmbedding")
SERIALIZABLE.register("EncoderLayer", "keras_transformer.layers.encoder:EncoderLayer")
SERIALIZABLE.register("TransformerEncoder", "keras_transformer.layers.encoder:TransformerEncoder")
SERIALIZABLE.register("PositionWiseFeedForward", "keras_transformer.layers.feed_forward:PositionWiseFeedForward")
SERIALIZABLE.register("LayerNormalization", "keras_transformer.layers.normalization:LayerNormalization")
SERIALIZABLE.register("RMSNormalization", "keras_transformer.layers.normalization:RMSNormalization")
SERIALIZABLE.register("OutputBias", "keras_transformer.layers.output_bias:OutputBias")
SERIALIZABLE.register("PositionalEncoding", "keras_transformer.layers.position:PositionalEncoding")
SERIALIZABLE.register("RelativePositionBias", "keras_transformer.layers.position:RelativePositionBias")
SERIALIZABLE.register("SublayerConnection", "keras_transformer.layers.sublayer:SublayerConnection")
SERIALIZABLE.register("PaddingMask", "keras_transformer.layers.masking:PaddingMask")
SERIALIZABLE.register("AdaptedDense", "keras_transformer.layers.lora:AdaptedDense")
SERIALIZABLE.register("LabelSmoothedCrossEntropy", "keras_transformer.trainer.losses:LabelSmoothedCrossEntropy")
SERIALIZABLE.register("RDropLoss", "keras_transformer.trainer.losses:RDropLoss")
SERIALIZABLE.register("MaskedAccuracy", "keras_transformer.trainer.metrics:MaskedAccuracy")
SERIALIZABLE.register("Adam", "keras_transformer.trainer.optimizers:Adam")
SERIALIZABLE.register("LinearCooldown", "keras_transformer.trainer.schedules:LinearCooldown")
SERIALIZABLE.register("NoamSchedule", "keras_transformer.trainer.schedules:NoamSchedule")
SERIALIZABLE.register("DistillationLoss", "keras_transformer.trainer.distillation:DistillationLoss")
SERIALIZABLE.register("DistillationAccuracy", "keras_transformer.trainer.distillation:DistillationAccuracy")
SERIALIZABLE.register("ChunkedLossTransformer", "keras_transformer.trainer.chunked_loss:ChunkedLossTransformer")


class LazyClass:
    """Stands in `keras.saving`'s registry for a class whose module is not imported yet.

    Keras rebuilds a registered object with `cls.from_config(config)`; this
    imports `module` (which registers the real class under the same name) and
    hands the call on. Calling it builds an instance the same way.

    Args:
        module: the module that defines the class.
        name: the class's name in it.

    Example:

    >>> LazyClass("keras_transformer.trainer.schedules", "NoamSchedule").resolve().__name__
    'NoamSchedule'
    """

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def resolve(self) -> Any:
        """The class itself (importing its module)."""
        return getattr(importlib.import_module(self.module), self.name)

    def from_config(self, config: dict[str, Any]) -> Any:
        """`resolve().from_config(config)`."""
        return self.resolve().from_config(config)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyClass({self.module}.{self.name})"


def register_now(keras: ModuleType) -> None:
    """Puts a `LazyClass` in Keras' registry for each class of `SERIALIZABLE` not registered yet.

    Args:
        keras: the imported `keras` module.

    Example:

    >>> import keras
    >>> register_now(keras)
    >>> "keras_transformer>TokenEmbedding" in keras.saving.get_custom_objects()
    True
    """
    registry = keras.saving.get_custom_objects()
    for name in SERIALIZABLE:
        module, _, attribute = SERIALIZABLE.path(name).partition(":")
        registry.setdefault(f"{PACKAGE}>{name}", LazyClass(module, attribute))


@contextlib.contextmanager
def _register_after(module: ModuleType) -> Iterator[None]:
    """Lets Keras' module run, then registers the stand-ins (`import_hooks.around_first_import`)."""
    yield
    register_now(module)


def register_lazily() -> None:
    """Registers the package's classes with Keras now if Keras is imported, else right after Keras is.

    Example:

    >>> register_lazily()
    >>> import keras
    >>> "keras_transformer>NoamSchedule" in keras.saving.get_custom_objects()
    True
    """
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "saving"):
        register_now(keras)
    else:
        import_hooks.around_first_import("keras", _register_after)
