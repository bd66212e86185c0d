"""`load_translator`: the one loader of every engine, itself free of TensorFlow.

It checks the folders and the weights options once (`layout.check_models`), reads which kind of model folder it was
given (`model_engine`), and imports that engine only: a CTranslate2 export or a packed workdir translates in a
process that never imports TensorFlow (the command line's `translate` included); a LiteRT export too.

| folder | engine | translator |
| --- | --- | --- |
| a training workdir, a SavedModel export, or several (an ensemble) | "tensorflow" | `Translator` |
| a CTranslate2 export (`export --format ctranslate2`) | "ctranslate2" | `CTranslate2Translator` |
| a LiteRT export (`export --format litert`) | "litert" | `LiteRTTranslator` |
| a packed workdir (`keras-transformer pack`: `arrays/`), SentencePiece vocabulary | "packed" | `PackedTranslator` |

An ``hf://owner/name`` model name stands for its workdir in the package's cache, imported there on its first use
(`imports.cache.hf_model`); later uses read the cached workdir, offline too.

`engine=` picks another engine for a folder that it can read: "packed" for a workdir or a SavedModel export (no
TensorFlow: JAX on a GPU machine), "tensorflow" for a packed workdir. Each engine is registered in `ENGINES` by
its translator class, whose `load` reads the folders (`TranslatorInterface.load`); an engine is imported only when
it is asked for.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keras_transformer.errors import ConfigError
from keras_transformer.imports.hub import cached_model, is_hf_name
from keras_transformer.packed.data import arrays_path
from keras_transformer.runtime.registry import Registry
from keras_transformer.workdir.layout import (
    WORKDIR_VOCAB,
    check_models,
    is_sentencepiece_vocabulary,
    model_kind,
    not_a_model,
)

if TYPE_CHECKING:
    from keras_transformer.decoding.options import DecodeOptions
    from keras_transformer.engines.interface import TranslatorInterface

# engine name -> its translator class (a `TranslatorInterface`, whose `engine` is this name)
ENGINES = Registry("engine")
ENGINES.register("tensorflow", "keras_transformer.engines.tensorflow:Translator")  # imports TensorFlow
ENGINES.register("ctranslate2", "keras_transformer.engines.ctranslate2:CTranslate2Translator")
ENGINES.register("packed", "keras_transformer.engines.packed:PackedTranslator")
ENGINES.register("litert", "keras_transformer.engines.litert:LiteRTTranslator")
# The converted formats: each is read by its own engine (of the same name) alone, one model at a time.
CONVERTED = {"ctranslate2": "a CTranslate2 export", "litert": "a LiteRT export"}
# Settings only the TensorFlow engine takes (`Translator` arguments); the others decode without them.
TENSORFLOW_SETTINGS = ("jit_compile", "chunk_size")


def model_engine(path: str | os.PathLike[str]) -> str:
    """The engine a model folder is translated with by default: "tensorflow", "ctranslate2", "litert" or "packed"
    (a packed workdir with a SentencePiece vocabulary, what the packed engine reads).

    Raises:
        CheckpointNotFoundError: the folder holds no model (the three kinds named).

    Example:

    >>> model_engine("saved_models/multi30k_en_de")
    'tensorflow'
    """
    kind = model_kind(path)
    if kind is None:
        raise not_a_model(path)
    if kind in CONVERTED:
        return kind
    packed = kind == "workdir" and arrays_path(path) is not None
    return "packed" if packed and is_sentencepiece_vocabulary(pathlib.Path(path) / WORKDIR_VOCAB) else "tensorflow"


def load_translator(model: str | os.PathLike[str] | list[str | os.PathLike[str]], checkpoint: Any = None,
                    average: int | None = None, options: DecodeOptions | None = None, *, engine: str | None = None,
                    checked: bool = False, **settings: Any) -> TranslatorInterface:
    """The translator of a model folder, or of several decoded as one ensemble: a `TranslatorInterface`.

    Args:
        model: a training workdir (`model.yaml`, `data/vocab`, `checkpoints/`), a SavedModel export, a
            CTranslate2 export, a packed workdir, or a list of workdirs and SavedModel exports (an ensemble, on
            the TensorFlow engine: they must share the vocabulary files; decoding defaults come from the first).
            An ``hf://owner/name[@revision]`` name is a Hugging Face Hub model, imported into the cache
            (``KERAS_TRANSFORMER_HOME``) on its first use and read from there after (`hf_models`).
        checkpoint: a `.weights.h5` file (workdirs only); default: the last epoch checkpoint. For an ensemble, a
            list with one entry (or None) per model.
        average: average the last `average` checkpoints instead (workdirs only; each member); not together with
            `checkpoint`. A workdir with fewer averages those, with a warning.
        options: a `keras_transformer.decoding.DecodeOptions`; default: the model folder's (its model.yaml's
            decoding mapping, or what a CTranslate2 export recorded). A CTranslate2 export's beam search always
            stops by its own rule, `early_exit`'s.
        engine: "tensorflow", "ctranslate2", "litert" or "packed"; default: the folder's (`model_engine`).
        checked: the caller ran `layout.check_models(model, checkpoint, average)` already (the command line
            does, before it imports anything); otherwise this runs it. Either way it runs once.
        **settings: `DecodeOptions` fields replacing those of `options` (None values change nothing), the
            TensorFlow engine's `jit_compile` and `chunk_size` (other engines ignore them), and CTranslate2's
            own arguments (`compute_type`, `intra_threads`, ...; LiteRT's `intra_threads`).

    Returns:
        A `keras_transformer.engines.interface.TranslatorInterface`: the engine's translator.

    Raises:
        ConfigError: an empty list, an unknown engine, one that cannot read the folder, an ensemble the engine
            cannot decode, or weights options that cannot apply (named).
        CheckpointError: a missing or unreadable folder, config or weights file (named).

    Example:

    >>> translator = load_translator("saved_models/multi30k_en_de", beam_size=4)  # doctest: +SKIP
    >>> translator(["A man rides a bike."])                                     # doctest: +SKIP
    ['Ein Mann fährt Fahrrad.']
    >>> ensemble = load_translator(["runs/en_de", "runs/en_de_seed2"], average=5)  # doctest: +SKIP
    >>> fast = load_translator("exports/en_de_ct2")  # CTranslate2, no TensorFlow  # doctest: +SKIP
    """
    model = hf_models(model)
    paths = (list(model) if isinstance(model, (list, tuple)) else [model]) if checked else \
        check_models(model, checkpoint, average)
    engines = [model_engine(path) for path in paths]
    engine = engine or (engines[0] if len(paths) == 1 else "tensorflow")  # the engine of ensembles
    if engine not in ENGINES:
        raise ConfigError(f"load_translator: engine must be one of {', '.join(ENGINES)}, got {engine!r}.")
    settings = {key: value for key, value in settings.items() if value is not None
                and (engine == "tensorflow" or key not in TENSORFLOW_SETTINGS)}  # the others decode without them
    for kind in CONVERTED:
        if kind in engines or engine == kind:
            _check_converted(kind, paths, engines, engine, checkpoint, average)
    translator: TranslatorInterface = ENGINES.get(engine).load(paths, checkpoint, average, options, **settings)
    return translator


def hf_models(model: Any, before_import: Callable[[], None] | None = None) -> Any:
    """`model` (a folder or a list of them) with each ``hf://`` name replaced by its cached workdir, imported on
    its first use (`imports.cache.hf_model`, which imports TensorFlow only then, after calling `before_import`).

    Example:

    >>> hf_models(["runs/a", "runs/b"])
    ['runs/a', 'runs/b']
    """
    if isinstance(model, (list, tuple)):
        return [hf_models(one, before_import) for one in model]
    if not is_hf_name(model):
        return model
    cached = cached_model(model)
    if cached.is_dir():  # imported before: no TensorFlow, no Hub
        return cached
    if before_import is not None:
        before_import()
    from keras_transformer.imports.cache import hf_model
    return hf_model(model)


def _check_converted(kind: str, paths: list[Any], engines: list[str], engine: str, checkpoint: Any,
                     average: int | None) -> None:
    """Refuses, naming why, a converted export (`CONVERTED`: CTranslate2, LiteRT) that its engine cannot decode as
    asked (or another engine asked to read one)."""
    what = CONVERTED[kind]
    converted = paths[engines.index(kind)] if kind in engines else paths[0]
    if len(paths) > 1:
        raise ConfigError(f"{converted} is {what}, which decodes alone: an ensemble takes training workdirs and "
                          "SavedModel exports.")
    if engine != kind:
        raise ConfigError(f"{converted} is {what}: the {engine} engine cannot read it (leave the engine unset).")
    if engines[0] != kind:
        raise ConfigError(f"{converted} is not {what}: write one with keras-transformer export --format {kind}.")
    if checkpoint is not None or average is not None:
        raise ConfigError(f"{converted} is {what}: --checkpoint and --average apply to training workdirs.")
