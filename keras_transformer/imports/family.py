"""`Family`: what a published family's module gives the importer, and the weight-copying helpers they share.

A family maps a checkpoint's names and shapes onto `TransformerConfig` and the
weights of `build_model`; it is a mapping, not a model of its own. Its methods:

* `config(checkpoint, tensors)`: the `TransformerConfig` (refusing, by name, what the
  package's model cannot hold);
* `decoding(checkpoint)`: the `DecodeOptions` its generation config implies;
* `tokenizers(checkpoint, config)`: the source and target tokenizers, ids as
  the checkpoint numbers them;
* `assign_weights(model, tensors, config)`: the checkpoint's tensors copied into
  a `build_model(config)` model, every tensor used once, every weight set once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.errors import ConfigError, CorruptFileError
from keras_transformer.imports.checkpoint import aligned_empty
from keras_transformer.imports.tensorflow_weights import assign_array

if TYPE_CHECKING:
    import pathlib

    from keras_transformer.config import TransformerConfig
    from keras_transformer.imports.checkpoint import Checkpoint


# Hugging Face's activation names (ACT2FN) -> TransformerConfig.activation
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which both families' checkpoints use
TOKENIZER_CONFIG = "tokenizer_config.json"  # transformers' tokenizer settings, beside config.json
BLOCK_BYTES = 1 << 24  # float32 bytes read at a time when a tensor is rounded to bfloat16 as it is read


def one_size(config: Mapping[str, Any], where: str, first: str, second: str) -> Any:
    """The value of `config`'s keys `first` and `second` (an encoder's and a decoder's size), which must agree: the
    package's model has one size for both sides.

    Example:

    >>> one_size({"encoder_ffn_dim": 64, "decoder_ffn_dim": 64}, "config.json", "encoder_ffn_dim", "decoder_ffn_dim")
    64
    """
    if config.get(first) != config.get(second):
        raise ConfigError(f"{where}: {first}={config.get(first)} differs from {second}={config.get(second)}; the "
                          "package's model has one size for both sides.")
    return config.get(first)


def activation_of(config: Mapping[str, Any], where: str, default: str) -> str:
    """`TransformerConfig.activation` for `config`'s ``activation_function`` (`default` when absent).

    Example:

    >>> activation_of({"activation_function": "gelu_new"}, "config.json", "relu")
    'gelu_tanh'
    """
    activation = config.get("activation_function", default)
    if activation not in ACTIVATIONS:
        raise ConfigError(f"{where}: activation_function {activation!r} is not one of {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[activation]


def read_settings(path: pathlib.Path) -> dict[str, Any]:
    """A JSON file of settings (``tokenizer_config.json``), {} where there is none."""
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CorruptFileError(f"{path} is not valid JSON ({' '.join(str(error).split())[:160]}).") from None
    return settings if isinstance(settings, dict) else {}


class Family:
    """One published family of checkpoints (`imports.FAMILIES` names each by its ``model_type``).

    Example:

    >>> Family.name
    ''
    """

    name: str = ""  # the model_type of config.json
    description: str = ""  # a few words for messages and the import record

    def config(self, checkpoint: Checkpoint, tensors: WeightSource) -> TransformerConfig:
        """The `TransformerConfig` of `checkpoint` (an `imports.checkpoint.Checkpoint`) and its `WeightSource`."""
        raise NotImplementedError

    def decoding(self, checkpoint: Checkpoint) -> DecodeOptions:
        """The `DecodeOptions` of `checkpoint`'s generation settings: ``num_beams`` (1: greedy) and
        ``length_penalty`` (as `alpha`), from ``generation_config.json`` or ``config.json``."""
        generation = {**{key: checkpoint.config[key] for key in ("num_beams", "length_penalty")
                         if key in checkpoint.config}, **checkpoint.generation}
        beams = int(generation.get("num_beams") or 1)
        alpha = float(generation.get("length_penalty", 1.0)) if beams > 1 else 0.0
        if beams == 1:
            return DecodeOptions(strategy="greedy")
        return DecodeOptions(strategy="beam", beam_size=beams, alpha=max(alpha, 0.0))

    def settings(self, checkpoint: Checkpoint) -> dict[str, Any]:
        """`checkpoint`'s tokenizer settings (its ``tokenizer_config.json``), {} where it has none."""
        return read_settings(checkpoint.folder / TOKENIZER_CONFIG)

    def tokenizers(self, checkpoint: Checkpoint, config: TransformerConfig) -> tuple[Any, Any]:
        """`(source, target)` tokenizers of `checkpoint`; the same object twice for one shared tokenizer."""
        raise NotImplementedError

    def assign_weights(self, model: Any, tensors: WeightSource, config: TransformerConfig) -> None:
        """Copies `tensors` into `model` (a `build_model(config)` model)."""
        raise NotImplementedError


class WeightSource:
    """The checkpoint's tensors, handed out by name once each, with shape checks that name the key, in the dtype
    of the model they are copied into.

    Args:
        tensors: `{name: numpy array}`, or a mapping that reads each tensor when asked for it and gives its shape
            with ``shape(name)`` (`imports.checkpoint.SafetensorsFile`): its shape is then checked before it is read;
            one that reads a block of rows with ``rows(name, start, stop)`` is read that way when rounded.
        file: the weights file, for messages.
        dtype: "float32", or "bfloat16": each tensor rounded to nearest (even) as it is read, a block of rows at
            a time, into the one array handed out (no float32 copy of a whole matrix beside it).

    Example:

    >>> source = WeightSource({"w": np.ones((2, 3))}, "model.safetensors")
    >>> source.take("w", (2, 3)).shape, source.unused()
    ((2, 3), [])
    >>> WeightSource({"w": np.full(2, 1 + 2 ** -9)}, "model.safetensors", "bfloat16").take("w", (2,))
    array([1, 1], dtype=bfloat16)
    >>> WeightSource({"w": np.ones((2, 3))}, "model.safetensors").take("w", (3, 3))
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: model.safetensors: w has shape (2, 3) but config.json's sizes give (3, 3).
    """

    def __init__(self, tensors: Mapping[str, Any], file: str | os.PathLike[str], dtype: str = "float32") -> None:
        self._tensors = tensors
        self._file = file
        self._dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
        self._used: set[str] = set()

    def has(self, name: str) -> bool:
        """Whether the checkpoint holds `name`."""
        return name in self._tensors

    def peek(self, name: str) -> Any:
        """The tensor `name`, or None, without counting it as used."""
        return self._tensors.get(name)

    def take(self, name: str, shape: Sequence[int], exact: bool = False) -> np.ndarray:
        """The tensor `name`, checked to have `shape`, in the source's dtype (float32 with `exact`: a tensor
        compared with values computed here rather than copied).

        Raises:
            ConfigError: the tensor is missing, or its shape is not `shape` (the key named).
        """
        if name not in self._tensors:
            raise ConfigError(f"{self._file}: {name} is missing (config.json describes a model that has it).")
        found = self._shape(name)
        if found != tuple(shape):
            raise ConfigError(f"{self._file}: {name} has shape {found} but config.json's sizes give {tuple(shape)}.")
        self._used.add(name)
        if exact or self._dtype == np.float32:
            return np.asarray(self._tensors[name], dtype=np.float32)
        value = aligned_empty(found, self._dtype)  # what the variable takes over (`assign`), without a copy
        reader = getattr(self._tensors, "rows", None)
        if len(found) < 2 or not callable(reader):
            np.copyto(value, np.asarray(self._tensors[name], dtype=np.float32), casting="unsafe")
            return value
        step = max(1, BLOCK_BYTES // (4 * max(1, int(np.prod(found[1:])))))  # rows a block
        for start in range(0, found[0], step):  # rounded as `astype` rounds: to nearest, even
            np.copyto(value[start:start + step], reader(name, start, start + step), casting="unsafe")
        return value

    def _shape(self, name: str) -> tuple[int, ...]:
        reader = getattr(self._tensors, "shape", None)
        return tuple(reader(name)) if callable(reader) else tuple(np.shape(self._tensors[name]))

    def skip(self, name: str) -> None:
        """Marks `name` as accounted for without copying it (a table the model computes itself)."""
        self._used.add(name)

    def unused(self) -> list[str]:
        """The names no `take` or `skip` asked for, sorted."""
        return sorted(set(self._tensors) - self._used)


def assign(variable: Any, value: np.ndarray, name: str) -> None:
    """Sets a Keras variable to `value`, whose shape must be the variable's (the checkpoint key named otherwise).
    On TensorFlow a large matrix takes no full-size copy on the way (`imports.tensorflow_weights`): the variable
    takes over `value`'s memory, so the caller drops it, never writes to it. A bfloat16 variable (a model built
    under Keras' bfloat16 policy) takes `value` rounded to nearest (even).

    Example:

    >>> import keras
    >>> layer = keras.layers.Dense(2); layer.build((None, 3))
    >>> assign(layer.bias, np.ones(2), "fc.bias"); layer.bias.numpy().tolist()
    [1.0, 1.0]
    """
    if tuple(variable.shape) != tuple(value.shape):
        raise ConfigError(f"{name} has shape {tuple(value.shape)} where the model's {variable.path} has "
                          f"{tuple(variable.shape)}.")
    assign_array(variable, value)  # as read (float32, or bfloat16 rounded as read): no copy


def per_head(parts: Sequence[np.ndarray], num_heads: int) -> np.ndarray:
    """Projection matrices `(in, H * size_i)` each, interleaved per head: `(in, H * sum(sizes))` with, for each
    head h, the columns `[part_0 of h | part_1 of h | ...]` (the fused layout of the package's attention layers).

    Example:

    >>> q, k = np.array([[1, 2, 3, 4]]), np.array([[5, 6, 7, 8]])
    >>> per_head([q, k], num_heads=2).tolist()
    [[1, 2, 5, 6, 3, 4, 7, 8]]
    """
    rows = parts[0].shape[0]
    split = [part.reshape(rows, num_heads, -1) for part in parts]  # each (in, H, size)
    return np.concatenate(split, axis=-1).reshape(rows, -1)


def linear(tensors: Any, name: str, rows: int, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """A PyTorch Linear's weight `(out, in)` as a Keras kernel `(in, out)`, and its bias."""
    return tensors.take(f"{name}.weight", (rows, columns)).T, tensors.take(f"{name}.bias", (rows,))


def dense(tensors: Any, layer: Any, name: Any, rows: Any, columns: Any) -> None:
    """Fills a Keras Dense from a PyTorch Linear."""
    kernel, bias = linear(tensors, name, rows, columns)
    assign(layer.kernel, kernel, f"{name}.weight")
    assign(layer.bias, bias, f"{name}.bias")


def norm(tensors: Any, layer: Any, name: Any, d: Any) -> None:
    """Fills a LayerNormalization from a PyTorch LayerNorm's weight and bias."""
    assign(layer.gamma, tensors.take(f"{name}.weight", (d,)), f"{name}.weight")
    assign(layer.beta, tensors.take(f"{name}.bias", (d,)), f"{name}.bias")


def fused(layer: Any, tensors: Any, name: Any, projections: Any, heads: Any, d: Any) -> None:
    """Fills a fused per-head projection from separate q/k/v `Linear`s (`projections`: (name, size) pairs)."""
    kernels, biases = zip(*(linear(tensors, f"{name}.{proj}", heads * size, d) for proj, size in projections))
    assign(layer.kernel, per_head(kernels, heads), f"{name}.{projections[0][0]}.weight")
    assign(layer.bias, per_head([b[None, :] for b in biases], heads)[0], f"{name}.{projections[0][0]}.bias")


def self_attention(tensors: Any, attention: Any, name: Any, d: Any, heads: Any, dk: Any, dv: Any) -> None:
    """Fills a self-attention layer from ``{name}.q_proj / k_proj / v_proj / out_proj``."""
    fused(attention.qkv_dense, tensors, name, (("q_proj", dk), ("k_proj", dk), ("v_proj", dv)), heads, d)
    dense(tensors, attention.output_dense, f"{name}.out_proj", d, heads * dv)


def cross_attention(tensors: Any, attention: Any, name: Any, d: Any, heads: Any, dk: Any, dv: Any) -> None:
    """Fills a cross-attention layer from ``{name}.q_proj / k_proj / v_proj / out_proj``."""
    dense(tensors, attention.query_dense, f"{name}.q_proj", heads * dk, d)
    fused(attention.key_value_dense, tensors, name, (("k_proj", dk), ("v_proj", dv)), heads, d)
    dense(tensors, attention.output_dense, f"{name}.out_proj", d, heads * dv)


def feed_forward(tensors: Any, layer: Any, prefix: Any, d: Any, d_ff: Any) -> None:
    """Fills a feed-forward network from ``{prefix}.fc1`` and ``{prefix}.fc2``."""
    dense(tensors, layer.inner, f"{prefix}.fc1", d_ff, d)
    dense(tensors, layer.outer, f"{prefix}.fc2", d, d_ff)
