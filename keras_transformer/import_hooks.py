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

import importlib.util
import sys


class _FirstImport:
    """The finder and loader of one module's first import (see the module docstring)."""

    def __init__(self, name, around):
        self.name, self.around, self.loader = name, around, None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the next import finds the module in sys.modules
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.loader
        with self.around(module):
            self.loader.exec_module(module)


def around_first_import(name, around):
    """Runs the first import of module `name` inside `around(module)`, a context manager, unless that hook waits.

    Args:
        name: the module's full name (``"keras"``).
        around: a function of the module returning a context manager; the module's code runs inside it.
    """
    if not is_waiting(name, around):
        sys.meta_path.insert(0, _FirstImport(name, around))


def is_waiting(name, around):
    """Whether `around_first_import(name, around)` is installed and its module not imported yet."""
    return any(isinstance(finder, _FirstImport) and finder.name == name and finder.around is around
               for finder in sys.meta_path)


def cancel(name, around):
    """Removes a waiting `around_first_import(name, around)`: the module will load as it would without it."""
    sys.meta_path[:] = [finder for finder in sys.meta_path
                        if not (isinstance(finder, _FirstImport) and finder.name == name and finder.around is around)]
