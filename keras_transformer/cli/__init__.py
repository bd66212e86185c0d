"""The keras-transformer command: `arguments` declares every subcommand's flags, `commands` runs each one by
calling one function of the package. Nothing in the package imports it. Every name of `commands` is also
reachable here (`keras_transformer.cli.main`, `keras_transformer.cli.import_tensorflow_quietly`), where the
command's module was before it became this package.

Example:

>>> build_parser().parse_args(["translate", "--model", "saved_models/multi30k_en_de", "A man."]).command
'translate'
"""

from typing import Any

from keras_transformer.cli import commands
from keras_transformer.cli.arguments import build_parser
from keras_transformer.cli.commands import import_tensorflow_quietly, main

__all__ = ["build_parser", "import_tensorflow_quietly", "main"]


def __getattr__(name: str) -> Any:
    return getattr(commands, name)
