"""Imports of published checkpoints: one module per family, registered by its ``model_type``.

```
imports/
  checkpoint.py  a Hugging Face checkpoint folder (or Hub id) read: configs, weights (whole or sharded), model card
  hub.py         the Hugging Face Hub: a repository downloaded (or found in its cache offline); hf:// names
  cache.py       `hf_model`: an hf:// name imported once into KERAS_TRANSFORMER_HOME
  family.py      what a family module gives (`Family`), and the weight-copying helpers they share
  importer.py    `import_checkpoint`: the checkpoint as an ordinary workdir, written whole or not at all
  marian.py      OPUS-MT / Marian (MarianMTModel)
  m2m_100.py     M2M-100 and NLLB-200 (M2M100ForConditionalGeneration)
  t5.py          T5 v1.1, mT5, MADLAD-400 and the original T5 (T5ForConditionalGeneration)
  tensorflow_weights.py  a large matrix into its variable without a full-size copy (TensorFlow)
```

A family maps names and shapes onto `TransformerConfig` and `build_model`'s weights (its tokenizer is a
`keras_transformer.data.tokenizers` one). Adding a family is its module (a `Family` subclass) plus one line in
`FAMILIES`; `family_for` imports the module when a checkpoint of that family is imported.

Example:

>>> sorted(FAMILIES)
['m2m_100', 'marian', 't5']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from keras_transformer.errors import ConfigError

if TYPE_CHECKING:
    import os

    from keras_transformer.imports.family import Family

# config.json's model_type -> (its module in keras_transformer.imports, its Family class)
FAMILIES = {
    "marian": ("marian", "MarianFamily"),
    "m2m_100": ("m2m_100", "M2M100Family"),
    "t5": ("t5", "T5Family"),
}


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
    keras_transformer.errors.ConfigError: bert/config.json: model_type 'bert' is not a family ...: m2m_100, marian, t5.
    """
    check_family(model_type, where)
    module, cls = FAMILIES[str(model_type)]  # check_family refused None
    return getattr(importlib.import_module(f"keras_transformer.imports.{module}"), cls)()
