"""keras_transformer: the Transformer of "Attention Is All You Need" for Keras 3.

The public API, nothing else. Importing the package imports neither Keras nor
TensorFlow: each name is imported from its module the first time it is used
(`kt.build_model` imports `keras_transformer.model`, and with it Keras), so that
`keras-transformer --help` and TensorFlow-free tools start at once. The
package's Keras classes are registered with `keras.saving` as soon as Keras is
imported (`keras_transformer.runtime.registration`), so that
`keras.models.load_model("model.keras")` finds them; and TensorFlow's C++ log
lines are kept off stderr when it is imported (`keras_transformer.runtime.tensorflow_logs`).
TensorFlow-specific parts (data pipeline, distribution, export, command line)
live in their own modules and are imported from there; `load_translator` imports the engine a model folder
needs, and only it (a CTranslate2 export or a packed workdir translates without TensorFlow).

Example:

>>> import sys, keras_transformer as kt
>>> kt.TransformerConfig.preset("tiny", vocab_size=100).d_model
64
"""

import importlib
from typing import Any

from keras_transformer.runtime.import_hooks import alias_moved_modules
from keras_transformer.runtime.registration import register_lazily
from keras_transformer.runtime.tensorflow_logs import quiet_tensorflow_import

__version__ = "0.2.0"

# Modules that moved from the top of the package into the package of their role: their old names still import.
MOVED_MODULES = {f"keras_transformer.{old}": f"keras_transformer.{new}" for old, new in {
    "arguments": "cli.arguments", "distillation": "trainer.distillation", "import_hooks": "runtime.import_hooks",
    "keras_internals": "runtime.keras_internals", "losses": "trainer.losses", "masking": "layers.masking",
    "metrics": "trainer.metrics", "optimizers": "trainer.optimizers", "registration": "runtime.registration",
    "registry": "runtime.registry", "schedules": "trainer.schedules", "tensorflow_logs": "runtime.tensorflow_logs",
}.items()}
alias_moved_modules(MOVED_MODULES)
register_lazily()
quiet_tensorflow_import()  # KERAS_TRANSFORMER_TF_LOGS=1 keeps TensorFlow's C++ log lines

# public name -> the module that defines it
_EXPORTS = {
    "keras_transformer.config": ("PRESETS", "TransformerConfig"),
    "keras_transformer.layers.attention": ("MultiHeadAttention", "MultiHeadSelfAttention",
                                           "scaled_dot_product_attention"),
    "keras_transformer.layers.decoder": ("DecoderLayer", "TransformerDecoder"),
    "keras_transformer.layers.embedding": ("TokenEmbedding",),
    "keras_transformer.layers.encoder": ("EncoderLayer", "TransformerEncoder"),
    "keras_transformer.layers.feed_forward": ("PositionWiseFeedForward",),
    "keras_transformer.layers.output_bias": ("OutputBias",),
    "keras_transformer.layers.position": ("PositionalEncoding", "sinusoidal_position_encoding"),
    "keras_transformer.layers.sublayer": ("SublayerConnection",),
    "keras_transformer.decoding.beam": ("beam_search",),
    "keras_transformer.decoding.greedy": ("greedy_decode",),
    "keras_transformer.decoding.options": ("DecodeOptions",),
    "keras_transformer.decoding.scoring": ("score",),
    "keras_transformer.decoding.search": ("length_penalty",),
    "keras_transformer.engines.loader": ("load_translator",),
    "keras_transformer.imports.importer": ("import_checkpoint",),
    "keras_transformer.trainer.losses": ("LabelSmoothedCrossEntropy", "RDropLoss"),
    "keras_transformer.layers.masking": ("PaddingMask", "causal_mask", "padding_mask"),
    "keras_transformer.trainer.metrics": ("MaskedAccuracy",),
    "keras_transformer.model": ("build_model", "decode", "encode"),
    "keras_transformer.trainer.optimizers": ("make_optimizer",),
    "keras_transformer.trainer.schedules": ("LinearCooldown", "NoamSchedule"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
