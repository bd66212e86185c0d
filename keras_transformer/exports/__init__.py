"""Exports: one module per format, each an `Exporter` registered by name (`keras-transformer export --format`).

```
exports/
  folder.py       what every format shares: one writer per folder, staging, the manifest, the swap (`verify`)
  savedmodel.py   a TensorFlow SavedModel, tokenization and search in the graph (`SavedModelExporter`)
  ctranslate2.py  a CTranslate2 model folder, for the fastest CPU serving (`CTranslate2Exporter`)
  litert.py       a LiteRT (TensorFlow Lite) model, the search inside, for phones and laptops (`LiteRTExporter`)
```

The command line knows a format by its name only: `make_exporter(name)` imports the format's module when it is
asked for (the SavedModel's imports TensorFlow; this registry imports nothing heavy) and returns its exporter,
whose `export(model, directory, ...)` writes a training workdir's or an export's model. Adding a format is its
module (an `Exporter` subclass) plus one line in `EXPORTERS` (a `keras_transformer.runtime.registry.Registry`).

Example:

>>> sorted(EXPORTERS)
['ctranslate2', 'litert', 'savedmodel']
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar

from keras_transformer.errors import ConfigError
from keras_transformer.runtime.registry import Registry

if TYPE_CHECKING:
    from keras_transformer.decoding.options import DecodeOptions

# format name -> its Exporter class, imported when the format is asked for
EXPORTERS = Registry("export format")
EXPORTERS.register("savedmodel", "keras_transformer.exports.savedmodel:SavedModelExporter")
EXPORTERS.register("ctranslate2", "keras_transformer.exports.ctranslate2:CTranslate2Exporter")
EXPORTERS.register("litert", "keras_transformer.exports.litert:LiteRTExporter")


class Exporter:
    """One export format: `export` writes a model folder's model (a training workdir or an export) as this format.

    A subclass sets `name` (its key in `EXPORTERS`) and `options`: the settings of this format alone (keyword
    arguments of its constructor), each with the command-line flag that sets it, so that a flag given for another
    format is refused by name (`make_exporter`).

    Example:

    >>> Exporter.options
    {}
    """

    name: ClassVar[str] = ""
    options: ClassVar[dict[str, str]] = {}  # option -> the `keras-transformer export` flag that sets it

    def export(self, model: str | os.PathLike[str] | list[str | os.PathLike[str]], directory: str | os.PathLike[str],
               *, checkpoint: Any = None, average: int | None = None, overwrite: bool = False,
               options: DecodeOptions | None = None, **settings: Any) -> str | os.PathLike[str]:
        """Writes `model` (a workdir or an export folder; a list: an ensemble, where the format holds one) to
        `directory` and returns the folder. `checkpoint`, `average`: which weights of a workdir; `options` and
        `settings` (None values change nothing): the decoding recorded in the export (default: the model's)."""
        raise NotImplementedError

    def recorded_decoding(self, directory: str | os.PathLike[str]) -> DecodeOptions | None:
        """The `DecodeOptions` an export of this format records (None if it records none)."""
        raise NotImplementedError


def exporter_class(name: str) -> type[Exporter]:
    """The `Exporter` subclass of format `name`, its module imported now.

    Raises:
        ConfigError: no such format (the known ones named).

    Example:

    >>> exporter_class("ctranslate2").name
    'ctranslate2'
    """
    if name not in EXPORTERS:
        raise ConfigError(f"No export format {name!r}; the formats are {', '.join(EXPORTERS)}.")
    exporter: type[Exporter] = EXPORTERS.get(name)
    return exporter


def make_exporter(name: str, **options: Any) -> Exporter:
    """The exporter of format `name`, with its own `options` (None values are not given).

    Raises:
        ConfigError: no such format, or an option of another format (its flag named, with the formats it applies to).

    Example:

    >>> make_exporter("ctranslate2", quantization="int8").quantization
    'int8'
    >>> make_exporter("ctranslate2", jit_compile=False)
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: --no-xla applies to --format savedmodel.
    """
    cls = exporter_class(name)
    given = {option: value for option, value in options.items() if value is not None}
    for option in given:
        if option not in cls.options:
            takers = [other for other in EXPORTERS if option in exporter_class(other).options]
            flag = exporter_class(takers[0]).options[option] if takers else option
            raise ConfigError(f"{flag} applies to --format {' or '.join(takers) or 'none'}.")
    return cls(**given)
