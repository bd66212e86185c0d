"""Imports of published checkpoints: one module per family, registered by its ``model_type``.

```
imports/
  checkpoint.py  a Hugging Face checkpoint folder (or Hub id) read: configs, weights (whole or sharded), model card
  hub.py         the Hugging Face Hub: a repository downloaded (or found in its cache offline); hf:// names
  cache.py       `hf_model`: an hf:// name imported once into KERAS_TRANSFORMER_HOME
  family.py      what a family module gives (`Family`), and the weight-copying helpers they share
  bart.py        `BartFamily`: what BART-like families share (sizes, layers' weights, special-token checks)
  importer.py    `import_checkpoint`: the checkpoint as an ordinary workdir, written whole or not at all
  marian.py      OPUS-MT / Marian (MarianMTModel)
  m2m_100.py     M2M-100 and NLLB-200 (M2M100ForConditionalGeneration)
  mbart.py       mBART-50 (MBartForConditionalGeneration)
  t5.py          T5 v1.1, mT5, MADLAD-400 and the original T5 (T5ForConditionalGeneration)
  tensorflow_weights.py  a large matrix into its variable without a full-size copy (TensorFlow)
```

A family maps names and shapes onto `TransformerConfig` and `build_model`'s weights (its tokenizer is a
`keras_transformer.data.tokenizers` one). Adding a family is its module (a `BartFamily` or `Family` subclass) plus
one line below, registering it in `FAMILIES` (a `Registry`) by path; `family_for` imports the module when a
checkpoint of that family is imported.

Example:

>>> sorted(FAMILIES)
['m2m_100', 'marian', 'mbart', 't5']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keras_transformer.errors import ConfigError
from keras_transformer.runtime.registry import Registry

if TYPE_CHECKING:
    import os

    from keras_transformer.imports.family import Family

# config.json's model_type -> its Family class, by path: the command line reads the names without importing them
FAMILIES = Registry("model family")
FAMILIES.register("marian", "keras_transformer.imports.marian:MarianFamily")
FAMILIES.register("m2m_100", "keras_transformer.imports.m2m_100:M2M100Family")
FAMILIES.register("mbart", "keras_transformer.imports.mbart:MBartFamily")
FAMILIES.register("t5", "keras_transformer.imports.t5:T5Family")


def check_family(model_type: str | None, where: str | os.PathLike[str] = "config.json") -> None:
    """Refuses (`ConfigError`, naming it and the supported ones) a `model_type` no family imports, without
    importing any family's module (the command line checks it before TensorFlow loads).

    Example:

    >>> check_family("marian")
    >>> check_family("bert")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: config.json: model_type 'bert' is not a family keras-transformer imports; ...
    """
    if model_type not in FAMILIES:
        raise ConfigError(f"{where}: model_type {model_type!r} is not a family keras-transformer imports; the "
                          f"supported families are: {', '.join(sorted(FAMILIES))}.")


def family_for(model_type: str | None, where: str | os.PathLike[str] = "config.json") -> Family:
    """The `Family` that imports checkpoints of `model_type`.

    Raises:
        ConfigError: a model_type no family imports (it and the supported ones named).

    Example:

    >>> family_for("marian").name
    'marian'
    >>> family_for("bert", "bert/config.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: bert/config.json: model_type 'bert' is not a family ... mbart, t5.
    """
    check_family(model_type, where)
    family: Family = FAMILIES.get(str(model_type))()  # check_family refused None
    return family
