"""`Registry`: names mapped to classes or functions, the one lookup of exporters, engines, decoding strategies and
the Keras-serializable classes.

An entry is the object itself or the dotted path of where it is defined (`"package.module:Name"`), imported the
first time it is asked for: the command line reads the names of every format, engine and strategy without
importing Keras or TensorFlow. Standard library only, so that every module may use it (OpenNMT-tf's `ClassRegistry`
is the model).

Example:

>>> SHAPES = Registry("shape")
>>> @SHAPES.register("square")
... class Square:
...     sides = 4
>>> _ = SHAPES.register("fraction", "fractions:Fraction")  # imported when first asked for
>>> SHAPES.names(), SHAPES.get("square").sides, SHAPES.get("fraction").__name__
(('square', 'fraction'), 4, 'Fraction')
>>> SHAPES.get("circle")
Traceback (most recent call last):
...
keras_transformer.errors.ConfigError: Unknown shape 'circle'; choose one of square, fraction.
"""

import importlib
from collections.abc import Iterator
from typing import Any

from keras_transformer.errors import ConfigError


class Registry:
    """Names, in registration order, each with an object or the `"module:attribute"` path that defines it.

    `name in registry`, `iter(registry)` and `len(registry)` read the names only (nothing is imported).

    Args:
        kind: what an entry is, for messages ("export format", "engine", "decoding strategy").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str, target: Any = None) -> Any:
        """Registers `target` (an object, or a `"module:attribute"` string imported on first use) under `name`.

        Without `target`, a decorator registering what it decorates. Returns what it registered.

        Raises:
            ValueError: `name` is taken.
        """
        if name in self._entries:
            raise ValueError(f"The {self.kind} {name!r} is registered already.")

        def add(target: Any) -> Any:
            self._entries[name] = target
            return target

        return add if target is None else add(target)

    def unregister(self, name: str) -> None:
        """Forgets `name` (a test's temporary entry)."""
        del self._entries[name]

    def get(self, name: str) -> Any:
        """The object registered as `name`, its module imported now if it was registered by path.

        Raises:
            ConfigError: no such name (the known ones listed).
        """
        if name not in self._entries:
            raise ConfigError(f"Unknown {self.kind} {name!r}; choose one of {', '.join(self._entries)}.")
        target = self._entries[name]
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            target = getattr(importlib.import_module(module), attribute)
        return target

    def path(self, name: str) -> str:
        """Where `name`'s object is defined, `"module:attribute"`, without importing it."""
        target = self._entries[name]
        return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

