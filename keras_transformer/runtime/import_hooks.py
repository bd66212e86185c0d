"""Running code around the first import of a module, without importing it: `around_first_import`.

The package must not import Keras or TensorFlow when it is imported (seconds), yet it has work to do as they load:
register its classes with Keras (`registration`), silence TensorFlow's C++ log lines (`tensorflow_logs`). A
one-shot finder on `sys.meta_path` finds the module with the other finders and hands back a loader that runs the
module's code inside a context manager of the caller's (the protocols of `importlib.abc.MetaPathFinder` and
`Loader`, whose module costs more to import than this whole package).

Example:

>>> import contextlib, sys
>>> seen = []
>>> @contextlib.contextmanager
... def note(module):
...     yield
...     seen.append(module.__name__)
>>> _ = sys.modules.pop("colorsys", None)
>>> around_first_import("colorsys", note)
>>> import colorsys
>>> seen, is_waiting("colorsys", note)
(['colorsys'], False)
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType

# A function of a module giving the context manager its first import runs inside.
Around = Callable[["ModuleType"], AbstractContextManager[Any]]


class _FirstImport:
    """The finder and loader of one module's first import (see the module docstring)."""

    def __init__(self, name: str, around: Around) -> None:
        self.name, self.around = name, around
        self.loader: Any = None  # the loader the other finders found (`find_spec`)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the next import finds the module in sys.modules
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self.loader = spec.loader
        spec.loader = cast("Loader", self)  # a loader's two methods, without importing importlib.abc
        return spec

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        cast("ModuleSpec", module.__spec__).loader = module.__loader__ = self.loader
        with self.around(module):
            self.loader.exec_module(module)


def around_first_import(name: str, around: Around) -> None:
    """Runs the first import of module `name` inside `around(module)`, a context manager, unless that hook waits.

    Args:
        name: the module's full name (``"keras"``).
        around: a function of the module returning a context manager; the module's code runs inside it.
    """
    if not is_waiting(name, around):
        sys.meta_path.insert(0, _FirstImport(name, around))


def is_waiting(name: str, around: Around) -> bool:
    """Whether `around_first_import(name, around)` is installed and its module not imported yet."""
    return any(isinstance(finder, _FirstImport) and finder.name == name and finder.around is around
               for finder in sys.meta_path)


def cancel(name: str, around: Around) -> None:
    """Removes a waiting `around_first_import(name, around)`: the module will load as it would without it."""
    sys.meta_path[:] = [finder for finder in sys.meta_path
                        if not (isinstance(finder, _FirstImport) and finder.name == name and finder.around is around)]


class _MovedModule:
    """The finder and loader of the old names of moved modules (`alias_moved_modules`)."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved: dict[str, str] = dict(moved)
        self.specs: dict[str, ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, cast("Loader", self))

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.moved[spec.name])  # the module itself, not a copy
        self.specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.specs[module.__name__]  # the import machinery gave it the old name's spec


def alias_moved_modules(moved: Mapping[str, str]) -> None:
    """Lets `import old.name` (and `from old import name`) give the module that now lives at a new name.

    The module is imported once, under its new name; the old name is the same module object (its classes keep
    their new `__module__`). Installed once per process.

    Args:
        moved: `{old full name: new full name}`.

    Example:

    >>> alias_moved_modules({"keras_transformer.old_hooks": "keras_transformer.runtime.import_hooks"})
    >>> import keras_transformer.old_hooks as old
    >>> old is sys.modules["keras_transformer.runtime.import_hooks"], old.__spec__.name
    (True, 'keras_transformer.runtime.import_hooks')
    """
    for finder in sys.meta_path:
        if isinstance(finder, _MovedModule):
            finder.moved.update(moved)
            return
    sys.meta_path.append(_MovedModule(moved))
