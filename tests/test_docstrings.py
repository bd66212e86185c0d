"""Every public name has a docstring with a short example."""

import inspect

import pytest

import keras_transformer as kt


@pytest.mark.parametrize("name", [n for n in kt.__all__ if n != "PRESETS"])
def test_public_name_has_a_docstring_with_an_example(name):
    obj = getattr(kt, name)
    doc = inspect.getdoc(obj) or ""
    assert len(doc.splitlines()) >= 3, f"{name} has no real docstring"
    assert ">>>" in doc, f"{name}'s docstring has no example"


def _modules_with_examples():
    """Every module of the package whose docstrings hold an example (`>>>`), found by reading the files, so a new
    module's examples run without being listed here."""
    import pathlib

    package = pathlib.Path(kt.__file__).parent
    names = []
    for path in sorted(package.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(package).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__")
    return names


MODULES = _modules_with_examples()


def test_the_examples_of_the_model_code_and_the_tensorflow_free_modules_are_collected():
    for module in ("config", "experiment", "model", "decoding", "layers.attention", "data.textfile", "cli"):
        assert module in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_module_examples_run(module):
    import doctest
    import importlib

    import keras
    import numpy as np

    mod = importlib.import_module("keras_transformer" if module == "__init__" else f"keras_transformer.{module}")
    result = doctest.testmod(mod, extraglobs={"keras": keras, "np": np}, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} failing example(s) in keras_transformer.{module}"
